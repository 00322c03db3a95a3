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

"""The real privsep daemon, and the boundary checks that need root.

The daemon is oslo.privsep's own, started as root without sudo through
``[prealloc_backend_privsep] helper_command`` (privsep-helper with a
configuration file of the test's). The tests prove that the checks run in
the daemon with the daemon's own configuration, that it holds exactly
CAP_DAC_OVERRIDE, that the wrapper passes every argument through, and what
happens when the daemon dies between two calls. Device nodes and loop
filesystems (root only) are here too.
"""

import os
import pwd
import signal
import stat
import subprocess
import sys
import threading
import time

import fixtures
from oslo_log import log as logging
from oslo_privsep import capabilities
from oslo_privsep import daemon as privsep_daemon
from oslo_utils import units

from prealloc_backend.adapter import backend
from prealloc_backend import exception
import prealloc_backend.privsep
import prealloc_backend.privsep.fs
from tests import base
from tests import fixtures as pb_fixtures
from tests.fixtures import ENTRYPOINTS
from tests.fixtures import extents
from tests.fixtures import file_state
from tests.fixtures import make_disk
from tests.fixtures import privsep_call as call
from tests.fixtures import PRIVSEP_DISK_SIZE as DISK_SIZE

LOG = logging.getLogger(__name__)

# Bounded waits for the real daemon (not timing assertions: a wait that
# runs out fails with the state it saw).
DAEMON_WAIT = 30


def proc_status(pid):
    try:
        with open('/proc/%d/status' % pid) as f:
            return dict(line.rstrip('\n').split(':\t', 1) for line in f
                        if ':\t' in line)
    except (FileNotFoundError, ProcessLookupError):
        return {}


def find_daemons(marker):
    """pids of live privsep-helper processes whose command line holds
    ``marker`` (a path unique to the test that started them).
    """
    pids = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open('/proc/%s/cmdline' % entry, 'rb') as f:
                cmdline = f.read().split(b'\0')
        except OSError:
            continue
        if (any(b'privsep-helper' in arg for arg in cmdline) and
                marker.encode() in cmdline and
                proc_status(int(entry)).get('State', 'Z')[0] != 'Z'):
            pids.append(int(entry))
    return pids


HUNG = ('the privileged call made after the daemon died never returned: '
        'oslo.privsep\'s reader thread ended on ECONNRESET without failing '
        'the outstanding call or marking the channel stopped, so the call '
        'waits forever (see the reliability report)')


def bounded(func, *args, **kwargs):
    """Run func in a thread for at most DAEMON_WAIT seconds: ('ok', value),
    ('error', exception) or ('hung', None).
    """
    result = []

    def run():
        try:
            result.append(('ok', func(*args, **kwargs)))
        except Exception as exc:
            result.append(('error', exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DAEMON_WAIT)
    return result[0] if result else ('hung', None)


def wait_for(predicate, what):
    deadline = time.monotonic() + DAEMON_WAIT
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError('gave up waiting for %s' % what)


def hand_disks_to(test, uid, tree):
    """Give each disk sent to the daemon to ``uid`` first.

    The daemon never works on root's files, but this process (nova-compute
    in these tests) runs as root and makes root-owned disks, where a real
    nova-compute makes them as nova. Before a call crosses the channel, a
    root-owned regular file named by a plain path (no symlink, no '..')
    under ``tree`` is chowned to ``uid``, the test's stand-in for nova.
    """
    remote_call = privsep_daemon._ClientChannel.remote_call

    def handing(channel, name, args, kwargs, timeout=None):
        path = args[0] if args else kwargs.get('path')
        if (isinstance(path, str) and path.startswith(tree + '/') and
                os.path.realpath(path) == path):
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_uid == 0:
                os.chown(path, uid, -1)
        return remote_call(channel, name, args, kwargs, timeout)

    test.useFixture(fixtures.MonkeyPatch(
        'oslo_privsep.daemon._ClientChannel.remote_call', handing))


class DaemonMixin:
    """Start the real daemon (as root, without sudo) on first call, with
    a configuration file of the test's.
    """

    def use_daemon(self, instances_path, extra=''):
        pb_fixtures.skip_unless_root(self)
        self.config = os.path.join(self.scratch, 'privsep-daemon.conf')
        self.write_daemon_config(instances_path, extra)
        helper = os.path.join(os.path.dirname(sys.executable),
                              'privsep-helper')
        self.flags(group='prealloc_backend_privsep',
                   helper_command='%s --config-file %s' % (helper,
                                                           self.config))
        ctx = prealloc_backend.privsep.ctx
        self.assertIsNone(ctx.channel, 'a daemon is already running')
        ctx.set_client_mode(True)
        self.addCleanup(self.stop_daemons)

    def write_daemon_config(self, instances_path, extra=''):
        with open(self.config, 'w') as f:
            f.write('[DEFAULT]\ninstances_path = %s\n%s'
                    % (instances_path, extra))

    def stop_daemons(self):
        ctx = prealloc_backend.privsep.ctx
        ctx.set_client_mode(False)
        ctx.stop()
        # The daemon exits when its socket closes; kill only the
        # daemons this test started (found by its unique config path).
        for pid in find_daemons(self.config):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_for(lambda: not find_daemons(self.config), 'the daemon to end')
        ctx.set_client_mode(True)

    def daemon_pid(self):
        pids = wait_for(lambda: find_daemons(self.config), 'the daemon')
        self.assertEqual(1, len(pids), pids)
        return pids[0]

    def assert_caps(self, pid):
        status = proc_status(pid)
        wanted = '%016x' % (1 << capabilities.CAP_DAC_OVERRIDE)
        self.assertEqual(wanted, status['CapEff'], status)
        self.assertEqual(wanted, status['CapPrm'], status)
        self.assertEqual('%016x' % 0, status['CapInh'], status)
        self.assertEqual('%016x' % 0, status.get('CapAmb', '0' * 16), status)


class RootPathRefusalTestCase(base.BoundaryTestCase):
    """Refusals that need root to set up (in-process)."""

    def setUp(self):
        super().setUp()
        pb_fixtures.skip_unless_root(self)

    def test_device_nodes(self):
        null = os.path.join(self.inst, 'disk.null')
        os.mknod(null, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        # A block node for a loop minor that is not set up: if the
        # type check failed, opening it would fail too, so the reason is
        # asserted to be the type check.
        block = os.path.join(self.inst, 'disk.blk')
        os.mknod(block, 0o600 | stat.S_IFBLK, os.makedev(7, 250))
        for node in (null, block):
            self.assert_refused(node, exception.InvalidPath,
                                ['not a regular file'], [node, self.disk])

    def test_mount_point_inside(self):
        """A filesystem mounted inside instances_path is not crossed,
        even where every name is a plain directory.
        """
        mnt = os.path.join(self.instances_path, 'mnt')
        os.mkdir(mnt)
        image = os.path.join(self.scratch, 'fs.img')
        with open(image, 'wb') as f:
            f.truncate(16 * units.Mi)
        subprocess.run(['mkfs.ext4', '-q', '-F', image], check=True,
                       capture_output=True)
        subprocess.run(['mount', '-o', 'loop', image, mnt], check=True,
                       capture_output=True)
        self.addCleanup(subprocess.run, ['umount', '-l', mnt],
                        capture_output=True)
        os.mkdir(os.path.join(mnt, 'inst'))
        disk = make_disk(os.path.join(mnt, 'inst', 'disk'))
        for walk in (False, True):
            self.useFixture(fixtures.MonkeyPatch(
                'prealloc_backend.privsep.beneath._openat2_missing', walk))
            self.assert_refused(disk, exception.InvalidPath,
                                ['mount point'], [disk, self.disk])

    def test_larger_than_filesystem(self):
        """A sparse file larger than its own (loop-mounted) filesystem: a
        range covering it is refused before any block is allocated.
        """
        fs = self.use_loop_fs('ext4', 16)
        inst = os.path.join(fs.path, 'inst')
        os.mkdir(inst)
        self.disk = make_disk(os.path.join(inst, 'disk'), 64 * units.Mi)
        free_before = os.statvfs(fs.path).f_bfree
        for length in (64 * units.Mi, 32 * units.Mi):
            self.assert_refused(self.disk, exception.InvalidSize,
                                ['larger than the filesystem'], [self.disk],
                                value=length, offset=0, length=length)
        self.assertEqual(free_before, os.statvfs(fs.path).f_bfree)


class RealDaemonTestCase(DaemonMixin, base.BoundaryTestCase):
    """The real oslo.privsep daemon, started as root without sudo."""

    def setUp(self):
        super().setUp()
        # The daemon's instances_path (from its own --config-file) is a
        # subdirectory; nova-compute's (this process) is its parent. Only a
        # check made in the daemon can refuse a path between the two.
        self.client_root = self.instances_path
        self.daemon_root = os.path.join(self.client_root, 'daemon-view')
        os.mkdir(self.daemon_root)
        # nova's user owns instances_path and the disks (never root: the
        # daemon refuses root's); 'nobody' stands in for it.
        self.nova_uid = pwd.getpwnam('nobody').pw_uid
        os.chown(self.daemon_root, self.nova_uid, -1)
        hand_disks_to(self, self.nova_uid, self.daemon_root)
        self.use_daemon(self.daemon_root)

    def test_daemon(self):
        fs = prealloc_backend.privsep.fs
        inst = os.path.join(self.daemon_root, 'inst')
        os.mkdir(inst)
        disk = make_disk(os.path.join(inst, 'disk'))

        # 1. Every argument reaches the daemon. First call (over data, so
        # nothing changes): the daemon starts with its one capability.
        fs.fallocate_range(disk, 0, 4096)
        self.assertEqual(DISK_SIZE - 65536 - 4096,
                         pb_fixtures.hole_bytes(disk))
        pid = self.daemon_pid()
        self.assertNotEqual(os.getpid(), pid)
        self.assert_caps(pid)
        # zero_fill_range: the written count proves the length, the data
        # map proves the offset (positional, then keyword arguments).
        self.assertEqual(8192, fs.zero_fill_range(disk, units.Mi + 4096,
                                                  8192))
        self.assertEqual(12288, fs.zero_fill_range(
            path=disk, offset=3 * units.Mi, length=12288))
        data = [(start * 4096, length * 4096)
                for start, length, unwritten in extents(disk)
                if not unwritten]
        self.assertIn((units.Mi + 4096, 8192), data)
        self.assertIn((3 * units.Mi, 12288), data)
        # fallocate_range: an unwritten extent exactly where asked.
        fs.fallocate_range(disk, 3 * units.Mi + 65536, 131072)
        self.assertIn((3 * units.Mi + 65536, 131072, True),
                      [(s * 4096, n * 4096, u) for s, n, u in extents(disk)])
        self.assertEqual(DISK_SIZE, os.path.getsize(disk))

        # 2. The daemon checks paths against its own instances_path.
        between = os.path.join(self.client_root, 'inst')  # client's view
        victim = make_disk(os.path.join(between, 'victim'))
        self.assertTrue(pb_fixtures.hole_bytes(victim))  # client: ok
        os.symlink(victim, os.path.join(inst, 'disk.link'))
        before = file_state(victim)
        for path, words in (
                (victim, 'not under instances_path %s' % self.daemon_root),
                (os.path.join(inst, 'disk.link'), 'symlink'),
                (os.path.join(inst, '..', '..', 'inst', 'victim'), "'..'")):
            for name in ENTRYPOINTS:
                exc = self.assertRaises(exception.InvalidPath, call, name,
                                        path, 0, 4096)
                self.assertIn(words, str(exc))
        exc = self.assertRaises(exception.InvalidSize, fs.fallocate_range,
                                disk, 0, True)
        self.assertIn('bool', str(exc))
        self.assertEqual(before, file_state(victim))
        self.assertEqual(pid, self.daemon_pid(), 'the daemon restarted')

        # 3. The daemon dies between two calls: the next call restarts it
        # (or fails loudly); it never returns without doing its work and
        # never blocks for good.
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not find_daemons(self.config), 'the daemon to die')
        target = make_disk(os.path.join(inst, 'disk2'))
        outcome, value = bounded(fs.zero_fill_range, target, 0, DISK_SIZE)
        self.assertNotEqual('hung', outcome, HUNG)
        if outcome == 'error':
            # A loud failure is acceptable; it must say what happened, and
            # the call after it must work.
            LOG.info('first call after the daemon died: %r', value)
            self.assertTrue(str(value), repr(value))
            outcome, value = bounded(fs.zero_fill_range, target, 0,
                                     DISK_SIZE)
            self.assertEqual('ok', outcome, value)
        self.assertEqual(DISK_SIZE - 65536 - 4096, value)
        self.assertEqual(0, pb_fixtures.hole_bytes(target))
        new_pid = self.daemon_pid()
        self.assertNotEqual(pid, new_pid)
        self.assert_caps(new_pid)

        # 4. The same through the backend: a raw 'full' disk made right
        # after the daemon was killed is fully written, not silently thin.
        os.kill(new_pid, signal.SIGKILL)
        wait_for(lambda: not find_daemons(self.config), 'the daemon to die')
        self.flags(instances_path=self.daemon_root)
        self.flags(group='prealloc_backend', mode='full')
        source = make_disk(os.path.join(self.scratch, 'image'))
        instance = self.make_instance()

        def fetch(target, *args, **kwargs):
            subprocess.run(['cp', '--sparse=always', source, target],
                           check=True)

        def spawn():
            image = backend.Backend(False).by_name(instance, 'disk', 'raw')
            image.cache(fetch_func=fetch, filename='img', size=DISK_SIZE,
                        image_id='img')
            return image.path

        outcome, value = bounded(spawn)
        self.assertNotEqual('hung', outcome, HUNG)
        if outcome == 'error':
            LOG.info('spawn right after the daemon died: %r', value)
            self.assertIsInstance(value, exception.PreallocError)
            self.assertEqual([], os.listdir(os.path.join(
                self.daemon_root, instance.uuid)))
            outcome, value = bounded(spawn)
            self.assertEqual('ok', outcome, value)
        self.assertEqual(0, pb_fixtures.hole_bytes(value))
        self.assertGreaterEqual(pb_fixtures.allocated(value), DISK_SIZE)
        self.assert_caps(self.daemon_pid())

    def test_unusable_instances_path(self):
        """A daemon whose instances_path cannot be pinned refuses every
        call with a typed error that says why, and touches nothing.
        """
        alias = os.path.join(self.scratch, 'alias')
        os.symlink(self.daemon_root, alias)
        os.mkdir(os.path.join(self.daemon_root, 'inst'))
        disk = make_disk(os.path.join(self.daemon_root, 'inst', 'disk'))
        before = file_state(disk)
        for configured, words in ((alias, 'symlink'), ('/', 'root'),
                                  (self.daemon_root + '.none',
                                   'does not exist')):
            self.stop_daemons()
            self.write_daemon_config(configured)
            for name in ENTRYPOINTS:
                exc = self.assertRaises(
                    exception.InstancesPathUnusable, call, name,
                    os.path.join(configured, 'inst', 'disk'), 0, 4096)
                self.assertIn(words, str(exc))
                self.assertIn('trying again', str(exc))
        self.assertEqual(before, file_state(disk))
