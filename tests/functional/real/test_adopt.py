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

"""Live adoption of a running guest's overlay (prealloc-backend adopt).

The guest (prealloc_bench.guest's ``churn`` action) fills 32 MiB of its
disk, then writes numbered 4 KiB blocks, each flushed, while the host
adopts its disk; at the end it reads them back and reports whether every
one reads as written, their md5, and the longest gap between two writes.
The host checks the disk's layout and allocation (qemu-img info, st_blocks,
qemu-img check) and, after the guest powered off, the same blocks and the
fill read from the file (``qemu-img convert`` to raw).

The instance is booted in mode none (nova's own overlay) and the host's
mode switched to space, as an operator installing the plugin on a running
host would. The command's work (``adopt.adopt``) runs in this process, with
nova's in-process services: its claim of the instance through task_state
is nova's real objects and database. The kill tests run the copy itself
(``live.adopt_running``) in a child process and SIGKILL it at a named
point (``PREALLOC_TEST_PAUSE_AT``); the next ``adopt`` recovers.
"""

import functools
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

from nova import context as nova_context

from prealloc_backend.adoption import instances
from prealloc_backend.adoption import live
from prealloc_backend.cmd import adopt as adopt_cmd
from prealloc_backend.system import stopping
from prealloc_bench import guest as pb_guest
from tests import fixtures as pb_fixtures
from tests.functional.real import base

GIB = 1024 ** 3
MIB = 1024 ** 2
FILL_MIB = 32
FILL_AT_MIB = 64
CHURN_OFF_MIB = 256
# Long enough for the copy (about 40 MiB at the rate below), its pivot,
# and a stretch of writes on either side.
CHURN_SECONDS = 30
RATE = 16 * MIB
# Seconds a copy that does not come into step runs without a new low.
STALL = 5

_CHILD = textwrap.dedent('''
    import sys
    import libvirt
    from prealloc_backend import conf as pb_conf
    from prealloc_backend.adoption import live
    from prealloc_backend.disk import formats, fsprobe
    from prealloc_backend.planner import diskplan
    from prealloc_backend.planner.modes import Mode
    uuid, path, instances_path = sys.argv[1:4]
    conf = pb_conf.CONF
    conf([], project='nova')
    conf.set_override('instances_path', instances_path)
    checked = formats.check_qcow2_disk(path)
    size = checked.info.virtual_size
    import os
    plan = diskplan.make_plan(conf.prealloc_backend, None, Mode.SPACE,
                              diskplan.DiskFormat.QCOW2, size,
                              fsprobe.facts(os.path.dirname(path)))
    # As the command does: the host's adopt lock, held while it works
    # (released by the kill).
    from prealloc_backend.adoption import recovery
    lock = recovery.host_lock(instances_path, 'compute1')
    dom = libvirt.open('qemu:///system').lookupByUUIDString(uuid)
    new = live.make_target(path, checked.backing, checked.backing_fmt,
                           size, plan)
    live.adopt_running(dom, 'vda', path, new, bandwidth=int(sys.argv[4]))
    print('adopted')
''')


def _fill(path, leave):
    """A file at ``path`` taking the filesystem's free space but about
    ``leave`` bytes (fallocate(2); an allocation the filesystem refuses,
    its own reserves being more than statvfs says, is tried smaller).
    """
    free = os.statvfs(os.path.dirname(path))
    size = free.f_bavail * free.f_frsize - leave
    for _attempt in range(32):
        if subprocess.run(['fallocate', '-l', str(size), path],
                          capture_output=True).returncode == 0:
            return
        size -= MIB
    raise AssertionError('could not fill the filesystem of %s' % path)


class _AdoptBase(base.RealHypervisorTestCase):

    PREALLOCATE_IMAGES = 'none'

    def setUp(self):
        super().setUp()
        # nova's records say the instances are on compute1; adopt works
        # on [DEFAULT] host's.
        self.flags(host='compute1')
        self.context = nova_context.get_admin_context()

    def _churning_server(self, seconds=CHURN_SECONDS):
        self.churn_seconds = seconds
        image = self.image('qcow2', action=pb_guest.ACTION_CHURN,
                           churn_seconds=seconds,
                           churn_fill_mib=FILL_MIB,
                           churn_off_mib=CHURN_OFF_MIB)
        server = self.boot(self.flavor(), image)
        self.wait_for_report(server, 'churn-filled')
        path = self.disk_path(server)
        info = pb_fixtures.qemu_img_info(path)
        # nova's own overlay: what the host made before the plugin's mode.
        self.assertFalse(info['format-specific']['data'].get('extended-l2'))
        return server, path

    def _adopt(self, server, mode='space', out=None, stop=None,
               bandwidth=RATE, limits=None):
        self.flags(group='prealloc_backend', mode=mode)
        report = adopt_cmd.Report(out=out or io.StringIO())
        # The command's own progress lines (cmd/adopt.py hands them to the
        # run): the tests act on them mid-copy.
        instances.adopt(self.context, self.conn, report,
                        uuids=[server['id']], bandwidth=bandwidth, stop=stop,
                        limits=limits,
                        progress=functools.partial(adopt_cmd.progress_printer,
                                                   report))
        return report

    def _churn_count(self, server):
        return int(pb_guest.parse_console(self.console(server))
                   .get('churn-at', {}).get('n', 0))

    def _finish(self, server, path):
        """The guest's own verdict, then the file's, after it powered off.
        Returns the guest's report.
        """
        # Read from the console's file: the guest powers off once it has
        # reported (nova's console API answers only while it runs).
        self.wait_for_domain_shutoff(server,
                                     timeout=self.churn_seconds + 120)
        console = self.console_log(server)
        report = pb_guest.parse_console(console).get('churn')
        self.assertIsNotNone(report, console[-3000:])
        self.assertEqual('yes', report['ok'], report)
        writes = int(report['writes'])
        self.assertGreater(writes, 20)
        with tempfile.TemporaryDirectory(dir=self.instances_path) as tmp:
            raw = os.path.join(tmp, 'raw')
            subprocess.run(['qemu-img', 'convert', '-O', 'raw', path, raw],
                           check=True, capture_output=True)
            self.assertEqual(
                report['md5'],
                base.md5_of_file_range(raw, CHURN_OFF_MIB * MIB,
                                       writes * 4096))
            with open(raw, 'rb') as f:
                f.seek(FILL_AT_MIB * MIB)
                self.assertEqual(b'\xaa' * (FILL_MIB * MIB),
                                 f.read(FILL_MIB * MIB))
        check = subprocess.run(['qemu-img', 'check', '-f', 'qcow2', path],
                               capture_output=True, text=True)
        self.assertEqual(0, check.returncode, check.stdout + check.stderr)
        return report

    def assert_no_adopt_leftovers(self, server):
        names = os.listdir(self.instance_dir(server))
        self.assertEqual([], [n for n in names if '.prealloc-adopt' in n])
        got = self.api.get_server(server['id'])
        self.assertIsNone(got['OS-EXT-STS:task_state'])

    def assert_adopted(self, path, mode='space'):
        info = pb_fixtures.qemu_img_info(path)
        self.assertTrue(info['format-specific']['data']['extended-l2'])
        if mode in ('space', 'full'):
            self.assertGreaterEqual(pb_fixtures.allocated(path), GIB)
        else:
            # metadata reserves nothing: the guest's data and the
            # metadata.
            self.assertLess(pb_fixtures.allocated(path), GIB // 2)


class AdoptTestCase(_AdoptBase):

    def test_running_guest_adopted_live(self):
        # The mode adopted to: space, or the one PREALLOC_ADOPT_MODE names
        # (the figures of doc/source/admin/adopting.rst, per mode).
        mode = os.environ.get('PREALLOC_ADOPT_MODE', 'space')
        server, path = self._churning_server()
        before_alloc = pb_fixtures.allocated(path)
        n0, t0 = self._churn_count(server), time.monotonic()
        report = self._adopt(server, mode=mode)
        n1, t1 = self._churn_count(server), time.monotonic()
        text = report.out.getvalue()
        self.assertEqual(0, report.status, text)
        self.assertIn('adopted live', text)
        # The guest is on the new file now, under the disk's own name, and
        # libvirt's record names the same path.
        opened = self.qemu_open_files(server)
        st = os.stat(path)
        self.assertEqual((st.st_dev, st.st_ino),
                         (opened[path].st_dev, opened[path].st_ino))
        self.assert_adopted(path, mode)
        self.assert_no_adopt_leftovers(server)
        guest = self._finish(server, path)
        self.assert_adopted(path, mode)
        facts = {'mode': mode, 'before_alloc': before_alloc,
                 'after_alloc': pb_fixtures.allocated(path),
                 'adopt_s': t1 - t0, 'writes_during': n1 - n0,
                 'guest': guest, 'report': text}
        base.LOG.info('adoption facts: %s', json.dumps(facts))
        if os.environ.get('PREALLOC_ADOPT_FACTS'):
            with open(os.environ['PREALLOC_ADOPT_FACTS'], 'a') as f:
                f.write(json.dumps(facts) + '\n')
        # The guest kept writing during the copy, and never waited long.
        self.assertGreater(n1 - n0, 0, text)
        self.assertLess(int(guest['maxgap_cs']), 300, guest)

    def test_cancel_and_a_copy_out_of_step_keep_the_original_disk(self):
        # One churning guest for both (a boot fewer for the tier).
        server, path = self._churning_server()
        inode = os.stat(path).st_ino
        # A copy of 32 KiB/s under the guest's flushed 4 KiB writes (about
        # 0.4 MiB/s under TCG) makes no new low of its bytes left, and is
        # given up STALL seconds after their lowest. (QEMU copies 16 MiB
        # at once and then waits for its rate: the command allows for that
        # wait, 512 s at this rate, which this test does not: burst 0.)
        started = time.monotonic()
        report = self._adopt(server, bandwidth=32 * 1024,
                             limits=live.CopyLimits(stall=STALL,
                                                    rate=32 * 1024, burst=0))
        took = time.monotonic() - started
        text = report.out.getvalue()
        self.assertEqual(1, report.status, text)
        self.assertIn('did not come into step: no new low of the bytes '
                      'left for %d s' % STALL, text)
        self.assertIn('the copy was undone, the guest stays on its '
                      'original disk', text)
        self.assertLess(took, STALL + 60, text)
        self.assertEqual('running', self.virsh('domstate',
                                               server['id']).strip())
        self.assertEqual(inode, os.stat(path).st_ino)
        self.assertEqual(inode, self.qemu_open_files(server)[path].st_ino)
        self.assert_no_adopt_leftovers(server)
        # Then a cancel.
        stop = stopping.Stop()

        class Out(io.StringIO):
            def write(self, text):
                if 'MiB/s' in text:
                    stop.request(signal.SIGINT)
                return super().write(text)

        out = Out()
        report = self._adopt(server, out=out, stop=stop, bandwidth=2 * MIB)
        self.assertIn('cancelled', out.getvalue())
        self.assertEqual(inode, os.stat(path).st_ino)
        self.assertEqual(inode, self.qemu_open_files(server)[path].st_ino)
        self.assert_no_adopt_leftovers(server)
        self.assertEqual(1, report.status)
        self._finish(server, path)
        info = pb_fixtures.qemu_img_info(path)
        self.assertFalse(info['format-specific']['data'].get('extended-l2'))

    def _killed_at(self, server, path, point):
        env = dict(os.environ, **{stopping.PAUSE_ENV: point})
        child = subprocess.Popen(
            [sys.executable, '-c', _CHILD, server['id'], path,
             self.instances_path, str(RATE)],
            env=env, stderr=subprocess.PIPE, text=True)
        seen = ''
        deadline = time.monotonic() + 60
        while 'paused at %s' % point not in seen:
            line = child.stderr.readline()
            if not line or time.monotonic() > deadline:
                child.kill()
                self.fail('the child never reached %s: %s' % (point, seen))
            seen += line
        child.send_signal(signal.SIGKILL)
        child.wait()
        threading.Thread(target=child.stderr.read, daemon=True).start()

    def test_killed_copy_recovered(self):
        # Three copies, each killed at another point; the guest writes
        # throughout (long enough for all three).
        server, path = self._churning_server(seconds=90)
        inode = os.stat(path).st_ino
        # Killed while copying, then nova-compute restarted: its start (the
        # driver's init_host) undoes the copy before nova would start any
        # guest; the guest never left its original file.
        self._killed_at(server, path, 'adopt copying')
        self.assertTrue(os.path.exists(path + live.ORIG_SUFFIX))
        self.assertEqual(inode, os.stat(path + live.ORIG_SUFFIX).st_ino)
        self.compute = self.restart_compute_service(self.compute)
        self.assertEqual(inode, os.stat(path).st_ino)
        self.assertEqual(inode, self.qemu_open_files(server)[path].st_ino)
        self.assert_no_adopt_leftovers(server)
        # Killed with the guest paused, before the pivot: undone, and the
        # guest resumed on its original file.
        self._killed_at(server, path, 'adopt paused')
        self.assertEqual('paused', self.virsh('domstate',
                                              server['id']).strip())
        text = self._adopt(server, mode='none').out.getvalue()
        self.assertIn('copy undone', text)
        self.assertIn('resumed', text)
        self.assertEqual('running', self.virsh('domstate',
                                               server['id']).strip())
        self.assertEqual(inode, self.qemu_open_files(server)[path].st_ino)
        self.assert_no_adopt_leftovers(server)
        # Killed after the pivot, the guest still paused: the next adopt
        # keeps the new file and resumes the guest.
        self._killed_at(server, path, 'adopt pivoted')
        self.assertEqual('paused', self.virsh('domstate',
                                              server['id']).strip())
        text = self._adopt(server, mode='none').out.getvalue()
        self.assertIn('pivot completed', text)
        self.assertEqual('running', self.virsh('domstate',
                                               server['id']).strip())
        self.assertNotEqual(inode, os.stat(path).st_ino)
        self.assertEqual(os.stat(path).st_ino,
                         self.qemu_open_files(server)[path].st_ino)
        self.assert_adopted(path)
        self.assert_no_adopt_leftovers(server)
        self._finish(server, path)

    def test_stopped_instance_rewritten_offline(self):
        # The idle guest reads the image's data and waits; stopped, its disk
        # is rewritten without a block copy, and it boots from it again.
        server = self.boot(self.flavor(), self.image('qcow2'))
        first = self.check_hypervisor_view(server, 'qcow2', 'none', GIB)
        path = self.disk_path(server)
        server = self._stop_server(server)
        report = self._adopt(server)
        text = report.out.getvalue()
        self.assertEqual(0, report.status, text)
        self.assertIn('rewritten offline', text)
        self.assert_adopted(path)
        self.assert_no_adopt_leftovers(server)
        self.assertEqual('SHUTOFF', self.api.get_server(server['id'])[
            'status'])
        server = self._start_server(server)
        self.check_hypervisor_view(server, 'qcow2', 'space', GIB,
                                   after=first)
        self.assertIn('at the policy of mode space',
                      self._adopt(server).out.getvalue())


class AdoptRawDiskTestCase(_AdoptBase):
    """A raw disk (images_type raw: disk.info and the domain's <driver
    type> say raw) whose guest wrote a qcow2 header into its first bytes,
    naming a file of the image cache as its backing file: adopt leaves it
    as it is, running and stopped, in every mode (issue 43, finding 1).
    """

    IMAGES_TYPE = 'raw'

    def _guest_header(self, path):
        """What a guest can write at the start of its raw disk: a qcow2
        header naming ../_base/swap_64, of a 2 GiB virtual size.
        """
        with tempfile.TemporaryDirectory(dir=self.instances_path) as tmp:
            header = os.path.join(tmp, 'h.qcow2')
            subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-u',
                            '-b', '../_base/swap_64', '-F', 'raw', header,
                            str(2 * GIB)], check=True)
            with open(header, 'rb') as f:
                data = f.read(65536)
        with open(path, 'r+b') as f:
            f.write(data)
            os.fsync(f.fileno())
        return data

    def _refused(self, server, path):
        for mode in ('metadata', 'space', 'full'):
            report = self._adopt(server, mode=mode)
            text = report.out.getvalue()
            self.assertEqual(1, report.status, text)
            self.assertIn("%s: a raw disk (%s says raw, the domain's <driver "
                          "type> raw): adopt rewrites qcow2 overlays only: "
                          "left as it is" % (path, os.path.join(
                              self.instance_dir(server), 'disk.info')),
                          text)
            self.assert_no_adopt_leftovers(server)

    def test_guest_written_header_is_not_adopted(self):
        server = self.boot(self.flavor(), self.image('raw'))
        path = self.disk_path(server)
        header = self._guest_header(path)
        inode = os.stat(path).st_ino
        # Running: the live path.
        self._refused(server, path)
        self.assertEqual('running', self.virsh('domstate',
                                               server['id']).strip())
        self.assertEqual(inode, self.qemu_open_files(server)[path].st_ino)
        with open(path, 'rb') as f:
            self.assertEqual(header, f.read(len(header)))
        # Stopped: the offline path; not a byte changed.
        server = self._stop_server(server)
        before = base.md5_of_file_range(path, 0, os.stat(path).st_size)
        self._refused(server, path)
        self.assertEqual(inode, os.stat(path).st_ino)
        self.assertEqual(before, base.md5_of_file_range(
            path, 0, os.stat(path).st_size))


class AdoptNoRoomTestCase(_AdoptBase):
    """instances_path on a filesystem of its own, filled up before the copy
    (placement needs room for the 1 GiB flavor: 2 GiB, sparse).
    """

    INSTANCES_FS = ('xfs', 2048)

    def test_filesystem_full_mid_copy_keeps_the_original(self):
        server, path = self._churning_server()
        inode = os.stat(path).st_ino
        filler = os.path.join(self.instances_path, 'filler')
        # Room for the copy when it starts (the command checks it, the
        # guest's data included: mode metadata reserves none); then
        # something else fills the filesystem while it copies, leaving
        # 4 MiB (xfs keeps no blocks for root, as ext4 does for QEMU
        # running as root here).
        _fill(filler, 48 * MIB)
        filled = []

        class Out(io.StringIO):
            def write(self, text):
                if 'MiB/s' in text and not filled:
                    _fill(filler + '2', 4 * MIB)
                    filled.append(True)
                return super().write(text)

        try:
            report = self._adopt(server, mode='metadata', out=Out(),
                                 bandwidth=4 * MIB)
        finally:
            for name in (filler, filler + '2'):
                if os.path.exists(name):
                    os.unlink(name)
        text = report.out.getvalue()
        self.assertTrue(filled, text)
        self.assertEqual(2, report.status, text)
        self.assertIn('the guest stays on its original disk', text)
        self.assertEqual('running', self.virsh('domstate',
                                               server['id']).strip())
        self.assertEqual(inode, os.stat(path).st_ino)
        self.assertEqual(inode, self.qemu_open_files(server)[path].st_ino)
        self.assert_no_adopt_leftovers(server)
        self._finish(server, path)


class AdoptLibvirtdRestartTestCase(_AdoptBase):
    """libvirtd restarted while the copy runs (a package upgrade, an
    operator): the command's connection dies; QEMU, the guest and its copy
    run on. The tier runs no other test meanwhile (RESTARTS_LIBVIRTD).
    """

    RESTARTS_LIBVIRTD = True

    def test_libvirtd_restarted_mid_copy_keeps_the_original(self):
        problem = self.libvirtd_restart_problem()
        if problem:
            self.skipTest(problem)
        # Long enough for the restart, the undo and a second adoption
        # while the guest still writes.
        server, path = self._churning_server(seconds=60)
        inode = os.stat(path).st_ino
        restarted = []
        test = self

        class Out(io.StringIO):
            def write(self, text):
                if 'MiB/s' in text and not restarted:
                    test.restart_libvirtd()
                    restarted.append(True)
                return super().write(text)

        report = self._adopt(server, out=Out(), bandwidth=2 * MIB)
        text = report.out.getvalue()
        base.LOG.info('adopt across the restart: %s', text)
        self.assertTrue(restarted, text)
        self.assertEqual(2, report.status, text)
        self.assertIn('libvirtd\'s connection was lost', text)
        self.assertIn('the guest stays on its original disk', text)
        self.assertEqual('running', self.virsh('domstate',
                                               server['id']).strip())
        self.assertEqual(inode, os.stat(path).st_ino)
        self.assertEqual(inode, self.qemu_open_files(server)[path].st_ino)
        self.assert_no_adopt_leftovers(server)
        # The new libvirtd's copy pivots as any.
        report = self._adopt(server)
        text = report.out.getvalue()
        self.assertEqual(0, report.status, text)
        self.assertIn('adopted live', text)
        self.assert_adopted(path)
        self.assert_no_adopt_leftovers(server)
        self._finish(server, path)
