# Licensed under the Apache License, Version 2.0 (the "License"); you may
# not use this file except in compliance with the License. You may obtain
# a copy of the License at
#
#      http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS, WITHOUT
# WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the
# License for the specific language governing permissions and limitations
# under the License.

"""Scenario 8: a real oslo.privsep daemon allocates the disks.

The plugin's context starts its daemon the way the documented
``[prealloc_backend_privsep] helper_command`` does, with privsep-helper run
by this interpreter, as root, without sudo. The test proves that the
entrypoints ran in that other process (and not in this one), that the
process kept only CAP_DAC_OVERRIDE, and that the disks it allocated are
right. nova's own context (utime of the image cache) stays in-process.
"""

import logging
import os
import pwd
import re
import shlex
import sys
import time

import fixtures
from oslo_privsep import comm
from oslo_privsep import daemon as privsep_daemon
from oslo_utils import encodeutils
from oslo_utils import units

from prealloc_backend.planner import modes
import prealloc_backend.privsep
import prealloc_backend.privsep.fs
from tests import fixtures as pb_fixtures
from tests.functional import base

# nova's test base replaces this class to forbid privsep daemons (its
# PrivsepNoHelperFixture); this test puts the real one back.
REAL_CHANNEL = privsep_daemon.RootwrapClientChannel
CAP_DAC_OVERRIDE = 1 << 1
DAEMON_PID = re.compile(r'privsep daemon running as pid (\d+)')


def _proc_status(pid):
    with open('/proc/%d/status' % pid) as f:
        return dict(line.rstrip('\n').split(':\t', 1) for line in f
                    if ':\t' in line)


def _cmdline(pid):
    with open('/proc/%d/cmdline' % pid, 'rb') as f:
        return f.read().split(b'\0')


class TestPrivsepDaemon(base.ServersTestBase):

    def setUp(self):
        super().setUp()
        if os.geteuid() != 0:
            self.skipTest('privsep-helper is started without sudo: it needs '
                          'root to keep CAP_DAC_OVERRIDE (CI runs as root)')
        ctx = prealloc_backend.privsep.ctx
        self.useFixture(fixtures.MonkeyPatch(
            'oslo_privsep.daemon.RootwrapClientChannel', REAL_CHANNEL))
        # The base runs entrypoints in-process; this test uses the daemon.
        self.useFixture(fixtures.MockPatchObject(ctx, 'client_mode', True))
        self.assertIsNone(ctx.channel)
        self.addCleanup(self._stop_daemon)

        # The daemon reads its own configuration: instances_path, which
        # its entrypoints check every path against.
        config = os.path.join(self.work_dir, 'privsep-daemon.conf')
        with open(config, 'w') as f:
            f.write('[DEFAULT]\ninstances_path = %s\n'
                    % self.instances_path)
        helper = [sys.executable, '-c',
                  'from oslo_privsep.daemon import helper_main; '
                  'helper_main()', '--config-file', config]
        self.flags(helper_command=' '.join(shlex.quote(a) for a in helper),
                   group='prealloc_backend_privsep')

        # Log records the daemon sends back over its channel (recorded as
        # they arrive: the client's logger may be disabled by the logging
        # configuration of nova's services).
        self.daemon_records = []
        out_of_band = privsep_daemon._ClientChannel.out_of_band
        records = self.daemon_records

        def spy_out_of_band(channel, msg):
            if msg[0] == comm.Message.LOG:
                records.append(logging.makeLogRecord(
                    {encodeutils.safe_decode(k): v
                     for k, v in msg[1].items()}))
            return out_of_band(channel, msg)

        self.useFixture(fixtures.MonkeyPatch(
            'oslo_privsep.daemon._ClientChannel.out_of_band',
            spy_out_of_band))

        # Calls sent to the daemon, and entrypoint logic run here.
        self.remote_calls = []
        self.local_calls = []
        remote_call = privsep_daemon._ClientChannel.remote_call
        calls = self.remote_calls

        # The daemon never works on root's files, and nova runs as root
        # here (a real nova-compute runs as nova): 'nobody' stands in for
        # nova's user, owning instances_path and each disk sent to the
        # daemon (handed over just before the call).
        nova_uid = pwd.getpwnam('nobody').pw_uid
        os.chown(self.instances_path, nova_uid, -1)
        tree = self.instances_path

        def spy_remote_call(channel, name, args, kwargs, timeout=None):
            calls.append((name, args))
            path = args[0]
            if (path.startswith(tree + '/') and
                    os.path.realpath(path) == path and
                    os.lstat(path).st_uid == 0):
                os.chown(path, nova_uid, -1)
            return remote_call(channel, name, args, kwargs, timeout)

        self.useFixture(fixtures.MonkeyPatch(
            'oslo_privsep.daemon._ClientChannel.remote_call',
            spy_remote_call))
        for name in ('unprivileged_fallocate_range',
                     'unprivileged_zero_fill_range'):
            self._spy_local(name)

    def _spy_local(self, name):
        original = getattr(prealloc_backend.privsep.fs, name)
        local_calls = self.local_calls

        def spy(*args, **kwargs):
            local_calls.append((name, args))
            return original(*args, **kwargs)

        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_backend.privsep.fs.' + name, spy))

    def _stop_daemon(self):
        pid = self._daemon_pid(required=False)
        prealloc_backend.privsep.ctx.stop()
        # The daemon exits when its channel closes: leave no process.
        deadline = time.monotonic() + 10
        while pid and os.path.exists('/proc/%d' % pid):
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                break
            time.sleep(0.1)

    def _daemon_pid(self, required=True):
        pids = {int(m.group(1)) for m in
                (DAEMON_PID.search(r.getMessage())
                 for r in getattr(self, 'daemon_records', []))
                if m}
        if required:
            self.assertEqual(1, len(pids), pids)
        return pids.pop() if pids else None

    def test_raw_disks_allocated_by_the_daemon(self):
        self.start_host('raw', preallocate_images='space')
        image_id, image_path = self.upload_image('raw')
        server = self.boot(image_id, self.create_flavor(disk=1, swap=64))
        full = self.create_flavor(
            disk=1, extra_specs={modes.FLAVOR_MODE_KEY: 'full'})
        zeroed = self.boot(image_id, full)

        # The disks: space (fallocate) and full (zero-filled).
        self.assertServerDisks(server, 'raw', 'space', image_id, image_path,
                               swap_mb=64)
        self.assertServerDisks(zeroed, 'raw', 'full', image_id, image_path)

        # They were allocated by the daemon: every entrypoint call went
        # over the channel, none ran in this process...
        self.assertEqual([], self.local_calls)
        called = {(name.rsplit('.', 1)[1], args[0])
                  for name, args in self.remote_calls}
        for disk in (self.disk(server), self.disk(server, 'disk.swap')):
            self.assertIn(('fallocate_range', disk), called)
        self.assertIn(('zero_fill_range', self.disk(zeroed)), called)
        self.assertTrue(prealloc_backend.privsep.ctx.client_mode)

        # ...a process other than this one, started for the plugin's
        # context, running as root with CAP_DAC_OVERRIDE only.
        pid = self._daemon_pid()
        self.assertNotEqual(os.getpid(), pid)
        cmdline = _cmdline(pid)
        self.assertIn(b'prealloc_backend.privsep.ctx', cmdline)
        status = _proc_status(pid)
        self.assertEqual('0', status['Uid'].split()[1])
        self.assertEqual(CAP_DAC_OVERRIDE, int(status['CapEff'], 16))
        self.assertEqual(CAP_DAC_OVERRIDE, int(status['CapPrm'], 16))
        # Its log records came back over the channel from that process.
        self.assertIn(pid, {r.process for r in self.daemon_records})
        base.record_figures(self, self.disk(server), 'space+full', {
            'daemon_pid': pid, 'test_pid': os.getpid(),
            'cap_eff': status['CapEff'],
            'remote_calls': len(self.remote_calls),
            'local_calls': len(self.local_calls),
            'zeroed_allocated': pb_fixtures.allocated(self.disk(zeroed)),
            'allocated': pb_fixtures.allocated(self.disk(server)),
            'size': units.Gi})
