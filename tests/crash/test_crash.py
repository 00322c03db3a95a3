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

"""Crash consistency: each rewrite cut at every state change, its
recovery cut again, then the rewrite retried.

Each rewrite runs with the instance directory on crashfs (a FUSE
filesystem that logs every state change, see crashfs.py); then each cut
of its log is replayed into three crash states (kill -9, a power cut, a
power cut after the filesystem committed the directory). Each state is
loaded into crashfs again and the next start's recovery runs there (the
journal's recover(), which reconciles a conversion and mends a growth;
for an adoption, live.recover first): each cut of the recovery's own log
is replayed the same way, written out at the same paths, recovered again
(off crashfs) and checked:

* the disk nova would open is the old disk or the new one, complete:
  ``qemu-img check`` finds nothing, not even a leak; the virtual size is
  the old or the new one; every byte the guest wrote reads back
  (qemu-img compare with a raw reference); disk.info, where it names the
  disk, agrees with the header;
* once the rewrite returned, only the new disk (its success survives a
  power cut);
* no journal and no temporary file is left;

then the rewrite is retried as the next attempt would (what is already
done is not done again) and the disk checked again: it must be the new
one, complete. Checked and retried once per distinct recovered state
(the same files give the same verdicts).

Cut points (crashfs.cut_points): before the first request, after every
request, writes included; with ``PREALLOC_CRASH_SAMPLE=1`` after every
request that is not a write, after the last, and after at most
WRITE_CUTS writes of a rewrite (RECOVERY_WRITE_CUTS of a recovery),
evenly spaced (deterministic). A state already checked (same files, same
bytes) is not checked again. Per rewrite, the requests, the cuts, the
distinct crash states, the recoveries' requests, the states recovered
again and the retries are printed and appended to
$PREALLOC_CRASH_REPORT (default /tmp/prealloc-crash.txt).
"""

import collections
import json
import os
import shutil
import subprocess

from oslo_utils import units

from prealloc_backend.adoption import live
from prealloc_backend import conf
from prealloc_backend.disk import allocate
from prealloc_backend.disk import extend
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
# The base image's size: past it, an overlay's preallocated clusters show
# in qemu-img map (within it, they read through to the backing file).
BASE_SIZE = 2 * units.Mi
# Every write is cut: the whole fits README's test line (the figures:
# doc/source/contributor/testing.rst). PREALLOC_CRASH_SAMPLE=1 cuts at
# most 8 writes of a rewrite and 4 of a recovery, evenly spaced.
SAMPLE = os.environ.get('PREALLOC_CRASH_SAMPLE') == '1'
WRITE_CUTS = 8 if SAMPLE else None
RECOVERY_WRITE_CUTS = 4 if SAMPLE else None
QCOW2_MAGIC = b'QFI\xfb'
PA = qcow2_layout.Qcow2Preallocation
REPORT = os.environ.get('PREALLOC_CRASH_REPORT', '/tmp/prealloc-crash.txt')


def _run(*args, ok=(0,)):
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode not in ok:
        # One line per failure in the report.
        said = ' | '.join(line for line in (proc.stdout + proc.stderr)
                          .splitlines() if line.strip())
        raise AssertionError('%s: exit %d: %s' % (
            ' '.join(args), proc.returncode, said[-400:]))
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
        pb_fixtures.write_pattern(self.base, BASE_SIZE, seed=7)
        self.ref = os.path.join(self.scratch, 'ref.raw')
        process = getattr(journal, 'PROCESS', None)
        self.addCleanup(setattr, journal, 'PROCESS', process)
        # The daemon's byte work (fileops.zero_fill and fallocate on the
        # descriptor it opened), called in-process: its openat2 refuses
        # the crashfs mount point (RESOLVE_NO_XDEV), which is not the
        # instances_path filesystem.
        for name in ('zero_fill_range', 'fallocate_range'):
            self.useFixture(pb_fixtures.fixtures.MockPatch(
                'prealloc_backend.privsep.fs.' + name,
                getattr(self, '_' + name)))

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

    # The initial disks, made outside crashfs and loaded into it.

    def _guest_writes(self, disk, fmt):
        """What a guest wrote into ``disk``; the raw reference of what it
        now reads is self.ref.
        """
        self._write_guest_data(disk, fmt)
        _run('qemu-img', 'convert', '-f', fmt, '-O', 'raw', disk, self.ref)

    @staticmethod
    def _write_guest_data(disk, fmt):
        for offset, pattern in ((0, 0x11), (units.Mi + 4096, 0x22),
                                (SIZE - 65536, 0x33)):
            _run('qemu-io', '-f', fmt, '-c', 'write -P %d %d 65536'
                 % (pattern, offset), disk)

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

    def _recorded(self, fmt):
        return b'{"%s": "%s"}\n' % (self.disk.encode(), fmt.encode())

    # The harness.

    def _on_crashfs(self, files, function):
        """Run ``function()`` with the instance directory on crashfs
        holding ``files`` ({name: bytes}, all on the device); the log of
        what it changed.
        """
        mount = crashfs.Mount(self.dir, files,
                              os.path.join(self.scratch, 'log'))
        try:
            function()
        finally:
            log = mount.umount()
        return log

    def _recover(self):
        """The next cache()'s recovery."""
        # A crash ends the process: a journal it left bears another
        # process's mark.
        journal.PROCESS = 'the next nova-compute'
        journal.Journal(self.disk).recover()

    def _adoption_recover(self):
        """nova-compute's start (adoption's recovery, no domain defined:
        the journal decides), then the next cache()'s.
        """
        live.recover(None, self.disk)
        self._recover()

    def crash_points(self, name, initial, operation, check, retry=None,
                     recover=None, before=None):
        """Run ``operation()`` on crashfs holding ``initial`` ({name:
        bytes}), then, for each crash state of it, as the module says:
        ``before(final)`` as the crash left it (``final``: the operation
        had returned), ``recover()`` on crashfs, each crash state of that
        recovered again and checked with ``check(final)``, ``retry()``
        and ``check(True)``.
        """
        recover = recover or self._recover
        log = self._on_crashfs(initial, operation)
        cuts = crashfs.cut_points(log, WRITE_CUTS)
        seen, checked, retried = set(), set(), set()
        failures = []
        figures = collections.Counter()
        for cut, variant, files in crashfs.replay(initial, log, cuts):
            final = cut == len(log)
            if (crashfs.state_key(files), final) in seen:
                continue
            seen.add((crashfs.state_key(files), final))
            where = '%s: after request %d of %d (%s) %s' % (
                name, cut, len(log), log[cut - 1][0] if cut else '-',
                variant)
            try:
                if before is not None:
                    self._materialize(files)
                    before(final)
                rlog = self._on_crashfs(files, recover)
            except Exception as exc:
                failures.append('%s: %s' % (where, exc))
                continue
            figures['recovery requests'] += len(rlog)
            rcuts = crashfs.cut_points(rlog, RECOVERY_WRITE_CUTS)
            for rcut, rvariant, rfiles in crashfs.replay(files, rlog,
                                                         rcuts):
                if (crashfs.state_key(rfiles), final) in checked:
                    continue
                checked.add((crashfs.state_key(rfiles), final))
                step = 'recovered'
                try:
                    self._materialize(rfiles)
                    recover()
                    # The same files recovered: the same verdicts.
                    after = (crashfs.state_key(self._files()), final)
                    if after in retried:
                        continue
                    self._check(check, final)
                    retried.add(after)
                    step = 'retried'
                    if retry is not None:
                        retry()
                    self._check(check, True)
                except Exception as exc:
                    failures.append(
                        '%s, its recovery cut after request %d of %d (%s) '
                        '%s, %s: %s' % (where, rcut, len(rlog),
                                        rlog[rcut - 1][0] if rcut else '-',
                                        rvariant, step, exc))
        line = ('%-26s %5d requests, %4d cut, %4d states, %5d recovery '
                'requests, %5d states recovered again, %3d retried, %3d '
                'failed' % (name, len(log), len(cuts), len(seen),
                            figures['recovery requests'], len(checked),
                            len(retried), len(failures)))
        with open(REPORT, 'a') as f:
            f.write(line + '\n')
            for failure in failures:
                f.write('    %s\n' % failure)
        print(line)
        for failure in failures[:5]:
            print('    ' + failure)
        self.assertEqual([], failures, line)

    def _files(self):
        files = {}
        for name in os.listdir(self.dir):
            with open(os.path.join(self.dir, name), 'rb') as f:
                files[name] = f.read()
        return files

    def _materialize(self, files):
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        for name, data in files.items():
            with open(os.path.join(self.dir, name), 'wb') as f:
                f.write(data)

    def _check(self, check, final):
        check(final)
        left = sorted(set(os.listdir(self.dir)) - {'disk', 'disk.info'})
        if left:
            raise AssertionError('left behind: %s' % left)
        fmt = self.recorded()
        if fmt is not None and os.path.exists(self.disk):
            with open(self.disk, 'rb') as f:
                header = f.read(4)
            if (header == QCOW2_MAGIC) != (fmt == 'qcow2'):
                raise AssertionError('disk.info records %s, the header is '
                                     '%r' % (fmt, header))

    # What a usable disk is.

    def assert_disk(self, fmt, sizes, ref, final_size=None, final=False):
        if not os.path.exists(self.disk):
            raise AssertionError('the disk is gone')
        with open(self.disk, 'rb') as f:
            header = f.read(4)
        if (header == QCOW2_MAGIC) != (fmt == 'qcow2'):
            raise AssertionError('recorded %s, header %r' % (fmt, header))
        if fmt == 'qcow2':
            # Not even a leak: a recovered disk keeps no cluster nothing
            # references.
            _run('qemu-img', 'check', '-f', 'qcow2', self.disk)
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

    def assert_preallocated(self, start, end):
        """Every cluster of [start, end) has its place in the file (the
        L2 entries of preallocation metadata, falloc or full).
        """
        ranges = json.loads(_run(
            'qemu-img', 'map', '--output=json', '-f', 'qcow2',
            self.disk).stdout)
        thin = [(r['start'], r['length']) for r in ranges
                if r['start'] + r['length'] > start and r['start'] < end and
                (r['depth'] != 0 or 'offset' not in r)]
        if thin:
            raise AssertionError('not preallocated: %s' % thin)

    def assert_layout(self, extended_l2):
        info = pb_fixtures.qemu_img_info(self.disk)
        found = info['format-specific']['data'].get('extended-l2', False)
        if found != extended_l2:
            raise AssertionError('extended_l2 %s, not %s'
                                 % (found, extended_l2))
        if info.get('backing-filename') != self.base:
            raise AssertionError('backing file %r'
                                 % info.get('backing-filename'))

    def recorded(self):
        if not os.path.exists(self.disk_info):
            return None
        return formats.disk_info_format(self.disk_info, self.disk)

    def _virtual_size(self, fmt):
        if fmt == 'raw':
            return os.stat(self.disk).st_size
        return pb_fixtures.qemu_img_info(self.disk)['virtual-size']

    # Creation.

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
            self.assert_disk('qcow2', (SIZE,), self.base)
            self.assert_layout(plan.extended_l2)
            if final and prealloc is not PA.OFF:
                self.assert_preallocated(BASE_SIZE, SIZE)

        def retry():
            if not os.path.exists(self.disk):
                operation()

        self.crash_points('create qcow2 %s' % mode, {}, operation, check,
                          retry)

    def test_create_overlay_none(self):
        self._create_overlay('none', PA.OFF)

    def test_create_overlay_metadata(self):
        self._create_overlay('metadata', PA.METADATA)

    def test_create_overlay_space(self):
        self._create_overlay('space', PA.FALLOC)

    def test_create_overlay_full(self):
        self._create_overlay('full', PA.FULL)

    def _allocate_raw(self, action, size):
        """The allocation of a raw file's holes (operation.allocate_raw:
        the daemon's fallocate or zero-fill).
        """
        opts = conf.CONF.prealloc_backend
        if action is diskplan.RawAction.FALLOCATE:
            self.assertTrue(allocate.fallocate_file(self.disk))
        elif action is diskplan.RawAction.ZERO_FILL:
            for _done in allocate.zero_fill(
                    self.disk, size, opts.allocation_timeout,
                    opts.progress_interval):
                pass

    def _create_raw(self, mode, action):
        ref = os.path.join(self.scratch, 'base-sized')
        shutil.copyfile(self.base, ref)
        os.truncate(ref, SIZE)

        def operation():
            record = journal.Journal(self.disk)
            record.recover()
            record.begin(True)
            # nova's fetch (a copy of the base), flushed (operation.flushed),
            # then grown (extend.grow_raw: a truncate).
            shutil.copyfile(self.base, self.disk)
            fd = os.open(self.disk, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            os.truncate(self.disk, SIZE)
            self._allocate_raw(action, SIZE)
            record.end()

        def check(final):
            if not os.path.exists(self.disk) and not final:
                return
            self.assert_disk('raw', (SIZE,), ref)

        def retry():
            if not os.path.exists(self.disk):
                operation()

        self.crash_points('create raw %s' % mode, {}, operation, check,
                          retry)

    def test_create_raw_none(self):
        self._create_raw('none', diskplan.RawAction.NOTHING)

    def test_create_raw_space(self):
        self._create_raw('space', diskplan.RawAction.FALLOCATE)

    def test_create_raw_full(self):
        self._create_raw('full', diskplan.RawAction.ZERO_FILL)

    # Growth.

    def _grow_qcow2(self, mode, prealloc):
        initial = {'disk': self._overlay(True),
                   'disk.info': self._recorded('qcow2')}

        def operation():
            record = journal.Journal(self.disk)
            record.recover()
            record.begin(False)
            # backend._grow_qcow2: grown when smaller than asked.
            if self._virtual_size('qcow2') < GROWN:
                qcow2.grow(self.disk, SIZE, _qcow2_plan(GROWN, prealloc))
            record.end()

        def check(final):
            info = self.assert_disk('qcow2', (SIZE, GROWN), self.ref, GROWN,
                                    final)
            self.assert_layout(True)
            if info['virtual-size'] == GROWN:
                self.assert_preallocated(SIZE, GROWN)

        self.crash_points('grow qcow2 %s' % mode, initial, operation,
                          check, operation)

    def test_grow_qcow2_metadata(self):
        self._grow_qcow2('metadata', PA.METADATA)

    def test_grow_qcow2_space(self):
        self._grow_qcow2('space', PA.FALLOC)

    def test_grow_qcow2_full(self):
        self._grow_qcow2('full', PA.FULL)

    def _grow_raw(self, mode, action):
        initial = {'disk': self._raw(), 'disk.info': self._recorded('raw')}

        def operation():
            record = journal.Journal(self.disk)
            record.recover()
            record.begin(False)
            # backend._grow (extend.grow_raw), then the allocation of the
            # file's holes (backend._allocate_file).
            extend.grow_raw(self.disk, GROWN)
            self._allocate_raw(action, GROWN)
            record.end()

        def check(final):
            self.assert_disk('raw', (SIZE, GROWN), self.ref, GROWN, final)

        self.crash_points('grow raw %s' % mode, initial, operation, check,
                          operation)

    def test_grow_raw_none(self):
        self._grow_raw('none', diskplan.RawAction.NOTHING)

    def test_grow_raw_space(self):
        self._grow_raw('space', diskplan.RawAction.FALLOCATE)

    def test_grow_raw_full(self):
        self._grow_raw('full', diskplan.RawAction.ZERO_FILL)

    def test_relayout_and_grow(self):
        initial = {'disk': self._overlay(False, 'off'),
                   'disk.info': self._recorded('qcow2')}

        def operation():
            record = journal.Journal(self.disk)
            record.recover()
            record.begin(False)
            # backend._grow_qcow2: a disk without extended_l2 rewritten
            # first, then grown.
            if not pb_fixtures.qemu_img_info(self.disk)['format-specific'][
                    'data'].get('extended-l2'):
                qcow2.relayout_overlay(self.disk, self.base, 'raw',
                                       _qcow2_plan(SIZE, PA.METADATA))
            if self._virtual_size('qcow2') < GROWN:
                qcow2.grow(self.disk, SIZE, _qcow2_plan(GROWN, PA.METADATA))
            record.end()

        def check(final):
            info = self.assert_disk('qcow2', (SIZE, GROWN), self.ref, GROWN,
                                    final)
            if info.get('backing-filename') != self.base:
                raise AssertionError('backing file %r'
                                     % info.get('backing-filename'))
            if final:
                self.assert_layout(True)
                self.assert_preallocated(BASE_SIZE, GROWN)

        self.crash_points('relayout + grow', initial, operation, check,
                          operation)

    # Records.

    def test_convert_raw(self):
        initial = {'disk': self._raw(), 'disk.info': self._recorded('raw')}

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

        def retry():
            # The migration's finish again: converted where still raw.
            if self.recorded() == 'raw':
                operation()

        self.crash_points('convert raw -> qcow2', initial, operation,
                          check, retry)

    def test_record_format(self):
        # nova's disk.info gets the disk's entry beside another disk's.
        other = os.path.join(self.dir, 'disk.eph0')
        initial = {'disk': self._overlay(True),
                   'disk.info': b'{"%s": "raw"}\n' % other.encode()}

        def operation():
            formats.record_format(self.disk, 'qcow2')

        def check(final):
            fmt = self.recorded()
            if fmt not in ((None, 'qcow2') if not final else ('qcow2',)):
                raise AssertionError('disk.info records %r' % (fmt,))
            if formats.disk_info_format(self.disk_info, other) != 'raw':
                raise AssertionError('the other disk\'s entry is lost')
            self.assert_disk('qcow2', (SIZE,), self.ref)

        self.crash_points('disk.info', initial, operation, check,
                          operation)

    def test_journal(self):
        # The journal's own writes around a growth that changes nothing:
        # begun, its growth phase, ended.
        initial = {'disk': self._overlay(True),
                   'disk.info': self._recorded('qcow2')}

        def operation():
            record = journal.Journal(self.disk)
            record.recover()
            record.begin(False)
            record.growing(os.stat(self.disk).st_size)
            record.end()

        def check(final):
            self.assert_disk('qcow2', (SIZE,), self.ref)

        self.crash_points('journal', initial, operation, check, operation)

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

    # Adoption (prealloc-backend adopt): its functions called as
    # cmd/adopt.py calls them; recovered as nova-compute's start does,
    # with no domain defined (the journal decides).

    def test_adopt_offline(self):
        initial = {'disk': self._overlay(False, 'off'),
                   'disk.info': self._recorded('qcow2')}
        plan = _qcow2_plan(SIZE, PA.METADATA)

        def adopted():
            return pb_fixtures.qemu_img_info(self.disk)['format-specific'][
                'data'].get('extended-l2', False)

        def operation():
            # cmd/adopt.py's offline rewrite of a stopped instance's disk.
            live.begin_offline(self.disk)
            qcow2.relayout_overlay(self.disk, self.base, 'raw', plan)
            live.end_offline(self.disk)

        def check(final):
            self.assert_disk('qcow2', (SIZE,), self.ref)
            self.assert_layout(final or adopted())

        def retry():
            if not adopted():
                operation()

        self.crash_points('adopt offline', initial, operation, check,
                          retry, recover=self._adoption_recover)

    def test_adopt_swap(self):
        initial = {'disk': self._overlay(False, 'off'),
                   'disk.info': self._recorded('qcow2')}
        plan = _qcow2_plan(SIZE, PA.METADATA)
        orig = self.disk + live.ORIG_SUFFIX

        def adopted():
            return pb_fixtures.qemu_img_info(self.disk)['format-specific'][
                'data'].get('extended-l2', False)

        def operation():
            # live.adopt_running's steps on the files: the target made and
            # flushed, the journal, the swap; the block copy (QEMU's
            # mirror of the guest's clusters into the new file, which now
            # has the disk's name) stood in for by qemu-io writing them;
            # the flushes that follow the pivot (_pause_and_pivot), the
            # journal says pivoted, the original removed, the journal.
            new = live.make_target(self.disk, self.base, 'raw', SIZE, plan)
            live._journal(self.disk, live.SWAPPED, 'vda')
            live._swap(self.disk, new, orig)
            self._write_guest_data(self.disk, 'qcow2')
            fileops.sync(self.disk)
            fileops.fsync_dir(self.dir)
            live._journal(self.disk, live.PIVOTED, 'vda')
            fileops.remove(orig)
            live._end_journal(self.disk)

        def check(final):
            self.assert_disk('qcow2', (SIZE,), self.ref)
            self.assert_layout(final or adopted())

        def retry():
            if not adopted():
                operation()

        self.crash_points('adopt swap', initial, operation, check, retry,
                          recover=self._adoption_recover)

    def test_adopt_recover_removes_a_journal_cut_before_its_rename(self):
        # live.recover left the journal's temporary file where no target
        # file is left: a kill inside begin_offline's journal write (the
        # tier's 'adopt offline', after request 1 or 2), or a recovery cut
        # between its removal of the target and of that file ('adopt
        # swap'); found by this tier, fixed in live.recover.
        with open(self.disk, 'wb') as f:
            f.write(self._overlay(False, 'off'))
        with open(self.disk + live.JOURNAL_SUFFIX + '.tmp', 'wb') as f:
            f.write(b'{"phase": "off')
        live.recover(None, self.disk)
        self.assertEqual(['disk'], os.listdir(self.dir))
