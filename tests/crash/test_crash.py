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

"""Crash consistency: each disk operation cut at every state change.

Each operation runs with the instance directory on crashfs (a FUSE
filesystem that logs every state change, see crashfs.py); then every
prefix of its log is replayed into three crash states (kill -9, a power
cut, a power cut after the filesystem committed the directory), each
written out at the same path, and checked after the next cache()'s
recovery (the journal's recover(), which reconciles a conversion):

* the disk nova would open is the old disk or the new one, complete:
  ``qemu-img check`` finds no corruption, the virtual size is the old or
  the new one, every byte the guest wrote reads back (qemu-img compare
  with a raw reference), disk.info agrees with the header;
* once the operation returned, only the new disk (its success survives
  a power cut);
* no journal and no temporary file is left.

Cut points: after every request; past ``WRITE_CUTS`` writes in one
operation its writes are sampled, evenly spaced (deterministic; no
operation here reaches it); a state already checked (same files, same
bytes) is not checked again.
Per operation, the points seen, cut and states checked are printed and
appended to $PREALLOC_CRASH_REPORT (default /tmp/prealloc-crash.txt).
"""

import hashlib
import os
import shutil
import subprocess

from oslo_utils import units

from prealloc_backend import conf
from prealloc_backend.disk import allocate
from prealloc_backend.disk import formats
from prealloc_backend.disk import journal
from prealloc_backend.disk import qcow2
from prealloc_backend.planner import diskplan
from prealloc_backend.planner import modes
from prealloc_backend.planner import qcow2_layout
from prealloc_backend.system import fileops
from tests import base
from tests.crash import crashfs
from tests import fixtures as pb_fixtures

SIZE = 4 * units.Mi
GROWN = 8 * units.Mi
WRITE_CUTS = 1024
QCOW2_MAGIC = b'QFI\xfb'
PA = qcow2_layout.Qcow2Preallocation
REPORT = os.environ.get('PREALLOC_CRASH_REPORT', '/tmp/prealloc-crash.txt')


def _run(*args, ok=(0,)):
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode not in ok:
        raise AssertionError('%s: exit %d: %s%s' % (
            ' '.join(args), proc.returncode, proc.stdout[-300:],
            proc.stderr[-300:]))
    return proc


def _qcow2_plan(size, prealloc, extended_l2=True):
    return diskplan.DiskPlan(
        mode=modes.Mode.SPACE, fmt=diskplan.DiskFormat.QCOW2,
        virtual_size=size, raw_action=None, preallocation=prealloc,
        cluster_size=64 * units.Ki, extended_l2=extended_l2,
        needed_bytes=0, metadata_cache_bytes=None, warning=None)


class CrashTestCase(base.TestCase):

    def setUp(self):
        super().setUp()
        if os.geteuid() != 0 or not os.path.exists('/dev/fuse'):
            why = 'root and /dev/fuse needed (FUSE mount)'
            if os.environ.get('CI') == 'true':
                # a tier never skips silently in CI (tests/prereq.py)
                self.fail(why)
            self.skipTest(why)
        self.dir = os.path.join(self.instances_path, 'inst')
        os.mkdir(self.dir)
        self.disk = os.path.join(self.dir, 'disk')
        self.disk_info = os.path.join(self.dir, 'disk.info')
        self.scratch = os.path.join(self.instances_path, 'scratch')
        os.mkdir(self.scratch)
        self.base = os.path.join(self.instances_path, 'base')
        pb_fixtures.write_pattern(self.base, 2 * units.Mi, seed=7)
        self.ref = os.path.join(self.scratch, 'ref.raw')
        process = getattr(journal, 'PROCESS', None)
        self.addCleanup(setattr, journal, 'PROCESS', process)

    # The initial disks, made outside crashfs and loaded into it.

    def _guest_writes(self, disk, fmt):
        """What a guest wrote into ``disk``; the raw reference of what it
        now reads is self.ref.
        """
        for offset, pattern in ((0, 0x11), (units.Mi + 4096, 0x22),
                                (SIZE - 65536, 0x33)):
            _run('qemu-io', '-f', fmt, '-c', 'write -P %d %d 65536'
                 % (pattern, offset), disk)
        _run('qemu-img', 'convert', '-f', fmt, '-O', 'raw', disk, self.ref)

    def _overlay(self, extended_l2, prealloc='metadata'):
        disk = os.path.join(self.scratch, 'disk')
        _run('qemu-img', 'create', '-f', 'qcow2', '-F', 'raw', '-b',
             self.base, '-o', 'extended_l2=%s,preallocation=%s'
             % ('on' if extended_l2 else 'off', prealloc), disk, str(SIZE))
        self._guest_writes(disk, 'qcow2')
        with open(disk, 'rb') as f:
            return f.read()

    def _raw(self):
        disk = os.path.join(self.scratch, 'disk')
        shutil.copyfile(self.base, disk)
        os.truncate(disk, SIZE)
        self._guest_writes(disk, 'raw')
        with open(disk, 'rb') as f:
            return f.read()

    # The harness.

    def crash_points(self, name, initial, operation, check, before=None):
        """Run ``operation()`` on crashfs holding ``initial`` ({name:
        bytes}); check each crash state with ``before(final)`` as the
        crash left it, then ``check(final)`` after the next cache()'s
        recovery (``final``: the operation had returned).
        """
        mount = crashfs.Mount(self.dir, initial,
                              os.path.join(self.scratch, 'log'))
        try:
            operation()
        finally:
            log = mount.umount()
        cuts = [i for i in range(len(log) + 1)
                if i == 0 or log[i - 1][0] != 'write']
        writes = [i for i in range(1, len(log) + 1)
                  if log[i - 1][0] == 'write']
        step = max(1, -(-len(writes) // WRITE_CUTS))
        cuts = sorted(set(cuts + writes[::step] + [len(log)]))
        model = crashfs.Model(initial)
        seen, failures = set(), []
        done = 0
        for cut in cuts:
            while done < cut:
                model.apply(log[done])
                done += 1
            for variant, files in sorted(model.views().items()):
                key = hashlib.sha256(repr(sorted(
                    (n, hashlib.sha256(d).digest())
                    for n, d in files.items())).encode()).digest()
                final = cut == len(log)
                if (key, final) in seen:
                    continue
                seen.add((key, final))
                self._materialize(files)
                try:
                    if before is not None:
                        before(final)
                    # A crash ends the process: a journal it left bears
                    # another process's mark.
                    journal.PROCESS = 'the next nova-compute'
                    journal.Journal(self.disk).recover()
                    check(final)
                    left = sorted(set(os.listdir(self.dir)) -
                                  {'disk', 'disk.info'})
                    if left:
                        raise AssertionError('left behind: %s' % left)
                except Exception as exc:
                    failures.append('%s: after request %d of %d (%s) %s: '
                                    '%s' % (name, cut, len(log),
                                            log[cut - 1][0] if cut else '-',
                                            variant, exc))
        line = ('%-24s %5d crash points seen, %4d cut, %4d states checked, '
                '%3d failed' % (name, len(log) + 1, len(cuts), len(seen),
                                len(failures)))
        with open(REPORT, 'a') as f:
            f.write(line + '\n')
            for failure in failures:
                f.write('    %s\n' % failure)
        print(line)
        self.assertEqual([], failures, line)

    def _materialize(self, files):
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        for name, data in files.items():
            with open(os.path.join(self.dir, name), 'wb') as f:
                f.write(data)

    # What a usable disk is.

    def _info(self, fmt):
        return pb_fixtures.qemu_img_info(self.disk) if fmt == 'qcow2' else \
            {'virtual-size': os.stat(self.disk).st_size}

    def assert_disk(self, fmt, sizes, ref, final_size=None, final=False):
        if not os.path.exists(self.disk):
            raise AssertionError('the disk is gone')
        with open(self.disk, 'rb') as f:
            header = f.read(4)
        if (header == QCOW2_MAGIC) != (fmt == 'qcow2'):
            raise AssertionError('recorded %s, header %r' % (fmt, header))
        if fmt == 'qcow2':
            # Exit 3: leaked clusters only (space, not data).
            _run('qemu-img', 'check', '-f', 'qcow2', self.disk, ok=(0, 3))
            info = pb_fixtures.qemu_img_info(self.disk)
        else:
            info = {'virtual-size': os.stat(self.disk).st_size}
        size = info['virtual-size']
        if size not in sizes:
            raise AssertionError('virtual size %d, not one of %s'
                                 % (size, sizes))
        if final and final_size is not None and size != final_size:
            raise AssertionError('the operation returned, the disk is '
                                 'back to %d bytes' % size)
        _run('qemu-img', 'compare', '-f', 'raw', '-F', fmt, ref, self.disk)
        return info

    def recorded(self):
        return formats.disk_info_format(self.disk_info, self.disk)

    # The operations.

    def _create_overlay(self, mode, prealloc):
        plan = _qcow2_plan(SIZE, prealloc, prealloc is not PA.OFF)

        def operation():
            record = journal.Journal(self.disk)
            record.recover()
            record.begin(True)
            if mode == 'none':
                # nova's own overlay (diskplan._none_plan): qemu-img create
                # at the disk's path, inside the plugin's journal.
                _run('qemu-img', 'create', '-f', 'qcow2', '-F', 'raw', '-b',
                     self.base, self.disk, str(SIZE))
            else:
                qcow2.create_overlay(self.disk, SIZE, self.base, 'raw', plan)
            record.end()

        def check(final):
            if not os.path.exists(self.disk) and not final:
                return  # rolled back: the next cache() makes it again
            info = self.assert_disk('qcow2', (SIZE,), self.base)
            if info.get('backing-filename') != self.base:
                raise AssertionError('backing file %r'
                                     % info.get('backing-filename'))

        self.crash_points('create qcow2 %s' % mode, {}, operation, check)

    def test_create_overlay_none(self):
        self._create_overlay('none', PA.OFF)

    def test_create_overlay_metadata(self):
        self._create_overlay('metadata', PA.METADATA)

    def test_create_overlay_space(self):
        self._create_overlay('space', PA.FALLOC)

    def test_create_overlay_full(self):
        self._create_overlay('full', PA.FULL)

    # The daemon's byte work (fileops.zero_fill and fallocate on the
    # descriptor it opened): its openat2 refuses the crashfs mount point
    # (RESOLVE_NO_XDEV), which is not the instances_path filesystem.

    def _zero_fill_range(self, path, offset, length):
        fd = os.open(path, os.O_RDWR)
        try:
            return fileops.zero_fill(fd, offset, offset + length)
        finally:
            os.close(fd)

    def _fallocate_range(self, path, offset, length):
        fd = os.open(path, os.O_RDWR)
        try:
            fileops.fallocate(fd, offset, length)
        finally:
            os.close(fd)

    def _create_raw(self, mode, action):
        for name in ('zero_fill_range', 'fallocate_range'):
            self.useFixture(pb_fixtures.fixtures.MockPatch(
                'prealloc_backend.privsep.fs.' + name,
                getattr(self, '_' + name)))
        opts = conf.CONF.prealloc_backend
        ref = os.path.join(self.scratch, 'base-sized')
        shutil.copyfile(self.base, ref)
        os.truncate(ref, SIZE)

        def operation():
            record = journal.Journal(self.disk)
            record.recover()
            record.begin(True)
            # nova's fetch (a copy of the base), flushed (backend._flushed),
            # then grown (extend.grow_raw: a truncate).
            shutil.copyfile(self.base, self.disk)
            fd = os.open(self.disk, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            os.truncate(self.disk, SIZE)
            if action is diskplan.RawAction.FALLOCATE:
                self.assertTrue(allocate.fallocate_file(self.disk))
            elif action is diskplan.RawAction.ZERO_FILL:
                for _done in allocate.zero_fill(
                        self.disk, SIZE, opts.allocation_timeout,
                        opts.progress_interval):
                    pass
            record.end()

        def check(final):
            if not os.path.exists(self.disk) and not final:
                return
            self.assert_disk('raw', (SIZE,), ref)

        self.crash_points('create raw %s' % mode, {}, operation, check)

    def test_create_raw_none(self):
        self._create_raw('none', diskplan.RawAction.NOTHING)

    def test_create_raw_space(self):
        self._create_raw('space', diskplan.RawAction.FALLOCATE)

    def test_create_raw_full(self):
        self._create_raw('full', diskplan.RawAction.ZERO_FILL)

    def test_grow(self):
        initial = {'disk': self._overlay(True),
                   'disk.info': b'{"%s": "qcow2"}\n' % self.disk.encode()}

        def operation():
            record = journal.Journal(self.disk)
            record.recover()
            record.begin(False)
            qcow2.grow(self.disk, SIZE, _qcow2_plan(GROWN, PA.FALLOC))
            record.end()

        def check(final):
            self.assert_disk('qcow2', (SIZE, GROWN), self.ref, GROWN, final)

        self.crash_points('grow (falloc)', initial, operation, check)

    def test_relayout_and_grow(self):
        initial = {'disk': self._overlay(False, 'off'),
                   'disk.info': b'{"%s": "qcow2"}\n' % self.disk.encode()}

        def operation():
            record = journal.Journal(self.disk)
            record.recover()
            record.begin(False)
            qcow2.relayout_overlay(self.disk, self.base, 'raw',
                                   _qcow2_plan(SIZE, PA.METADATA))
            qcow2.grow(self.disk, SIZE, _qcow2_plan(GROWN, PA.METADATA))
            record.end()

        def check(final):
            info = self.assert_disk('qcow2', (SIZE, GROWN), self.ref, GROWN,
                                    final)
            if info.get('backing-filename') != self.base:
                raise AssertionError('backing file %r'
                                     % info.get('backing-filename'))

        self.crash_points('relayout + grow', initial, operation, check)

    def test_convert_raw(self):
        initial = {'disk': self._raw(),
                   'disk.info': b'{"%s": "raw"}\n' % self.disk.encode()}

        def operation():
            # driver._disk_raw_to_qcow2's work on the disk (it also
            # updates the migration's record in memory, nothing on disk)
            qcow2.convert_raw(self.disk,
                              _qcow2_plan(SIZE, PA.METADATA))

        def check(final):
            fmt = self.recorded()
            if fmt not in ('raw', 'qcow2'):
                raise AssertionError('disk.info records %r' % (fmt,))
            if final and fmt != 'qcow2':
                raise AssertionError('converted, recorded %s' % fmt)
            self.assert_disk(fmt, (SIZE,), self.ref)

        self.crash_points('convert raw -> qcow2', initial, operation,
                          check)

    def test_journal_recovery(self):
        # A creation that a crash interrupted: a journal saying so, a
        # half-made disk and an overlay's temporary file.
        initial = {'disk': b'\1' * 65536,
                   'disk' + journal.TMP_SUFFIX: b'\2' * 4096,
                   'disk' + journal.JOURNAL_SUFFIX: b'{"created": true}'}

        def operation():
            journal.Journal(self.disk).recover()

        def durable(final):
            # Once recover() returned, what it removed stays removed.
            if final and os.listdir(self.dir):
                raise AssertionError('recovered, then a power cut brings '
                                     'back %s' % sorted(os.listdir(self.dir)))

        def check(final):
            if os.path.exists(self.disk):
                raise AssertionError('the half-made disk is kept')

        self.crash_points('journal recovery', initial, operation, check,
                          before=durable)
