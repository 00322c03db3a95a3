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

"""Privilege boundary: what the privileged entrypoints refuse to touch.

Every entrypoint of prealloc_backend.privsep.fs is called directly, both
through its privsep wrapper (in-process) and as its ``unprivileged_*``
function, with paths and sizes a compromised nova-compute could send. Each
must be refused with a typed error that names the value and says nothing
about what lies outside instances_path, and the file the value designates
(and the legitimate disk beside it) must be left exactly as it was:
content, size, allocation, mtime and ctime. The path checks run once with
openat2(2) and once with its component-by-component fallback.

No root needed here: the real daemon, device nodes, loop filesystems and
attacker users are in tests/privileged (test_privsep_daemon_root.py,
test_boundary_attacks.py); the context's capabilities as a fresh process
reads them are in tests/integration/test_privsep_capabilities.py.
"""

import errno
import os
import pathlib
import socket
import subprocess
import threading
import time

import fixtures
from oslo_utils import units

from prealloc_backend import exception
import prealloc_backend.privsep
from prealloc_backend.privsep import beneath
import prealloc_backend.privsep.fs
from prealloc_backend.system import fileops
from tests import base
from tests import fixtures as pb_fixtures
from tests.fixtures import ENTRYPOINTS
from tests.fixtures import file_state
from tests.fixtures import make_disk
from tests.fixtures import PRIVSEP_DISK_SIZE as DISK_SIZE


class PathRefusalTestCase(base.BoundaryTestCase):
    """Paths a privileged call must never act on (openat2 resolution)."""

    def test_outside_instances_path(self):
        self.assert_refused(self.victim, exception.InvalidPath,
                            ['not under instances_path'],
                            [self.victim, self.disk])

    def test_prefix_is_not_enough(self):
        """instances_path + 'x' shares the string prefix, not the tree."""
        sibling = self.instances_path + 'x'
        os.mkdir(sibling)
        self.addCleanup(os.rmdir, sibling)
        self.assert_refused(os.path.join(sibling, 'disk'),
                            exception.InvalidPath,
                            ['not under instances_path'], [self.disk])

    def test_dotdot_escape(self):
        sneaky = os.path.join(self.inst, '..', '..', os.path.relpath(
            self.victim, os.path.dirname(self.instances_path)))
        self.assertTrue(os.path.exists(sneaky))
        self.assertTrue(sneaky.startswith(self.instances_path))
        self.assert_refused(sneaky, exception.InvalidPath, ["'..'"],
                            [self.victim, self.disk])
        # Even one that stays inside is refused: no '..' at all.
        self.assert_refused(os.path.join(self.inst, '..', 'inst', 'disk'),
                            exception.InvalidPath, ["'..'"], [self.disk])

    def test_dot_and_empty_components(self):
        for path in (os.path.join(self.inst, '.', 'disk'),
                     self.inst + '//disk',
                     self.instances_path + '/./inst/disk'):
            self.assert_refused(path, exception.InvalidPath, ["'.'"],
                                [self.disk])

    def test_planted_symlink_to_outside_file(self):
        link = os.path.join(self.inst, 'disk.local')
        os.symlink(self.victim, link)
        self.assert_refused(link, exception.InvalidPath, ['symlink'],
                            [self.victim, self.disk, link])

    def test_planted_symlink_directory(self):
        link = os.path.join(self.instances_path, 'other-inst')
        os.symlink(self.outside_dir, link)
        path = os.path.join(link, 'victim')
        self.assert_refused(path, exception.InvalidPath, ['symlink'],
                            [self.victim, self.disk, link])

    def test_symlink_directory_gives_no_existence_oracle(self):
        """A symlinked directory pointing at an existing outside file's
        directory and one pointing nowhere get the same refusal.
        """
        messages = []
        for name, target in (('to-victim', self.outside_dir),
                             ('to-nothing', self.outside_dir + '-none')):
            link = os.path.join(self.instances_path, name)
            os.symlink(target, link)
            exc = self.assertRaises(
                exception.InvalidPath,
                prealloc_backend.privsep.fs.zero_fill_range,
                os.path.join(link, 'victim'), 0, 4096)
            messages.append(str(exc).replace(name, 'X'))
        self.assertEqual(messages[0], messages[1])

    def test_symlink_inside(self):
        link = os.path.join(self.inst, 'disk.alias')
        os.symlink(self.disk, link)
        self.assert_refused(link, exception.InvalidPath, ['symlink'],
                            [self.disk, link])

    def test_relative_symlink_inside(self):
        link = os.path.join(self.inst, 'disk.rel')
        os.symlink('disk', link)
        self.assert_refused(link, exception.InvalidPath, ['symlink'],
                            [self.disk, link])

    def test_symlinked_directory_inside(self):
        """Even a symlink to a directory of the tree is refused."""
        link = os.path.join(self.instances_path, 'inst-alias')
        os.symlink('inst', link)
        self.assert_refused(os.path.join(link, 'disk'),
                            exception.InvalidPath, ['symlink'],
                            [self.disk, link])

    def test_dangling_symlink(self):
        link = os.path.join(self.inst, 'disk.gone')
        os.symlink(os.path.join(self.inst, 'nothing'), link)
        self.assert_refused(link, exception.InvalidPath, ['symlink'],
                            [self.disk, link])
        self.assertFalse(os.path.exists(os.path.join(self.inst, 'nothing')))

    def test_hard_link_to_outside_file(self):
        # A hard link inside instances_path to a file outside it is
        # found by its link count. nova never hard-links instance disks.
        link = os.path.join(self.inst, 'disk.hard')
        os.link(self.victim, link)
        self.assert_refused(link, exception.InvalidPath, ['link'],
                            [self.victim, self.disk])

    def test_directory(self):
        self.assert_refused(self.inst, exception.InvalidPath,
                            ['not a regular file'], [self.disk])

    def test_file_as_directory(self):
        self.assert_refused(os.path.join(self.disk, 'x'),
                            exception.InvalidPath, ['not a directory'],
                            [self.disk])

    def test_instances_path_itself(self):
        for path in (self.instances_path, self.instances_path + '/'):
            self.assert_refused(path, exception.InvalidPath, [],
                                [self.disk])

    def test_fifo(self):
        fifo = os.path.join(self.inst, 'disk.fifo')
        os.mkfifo(fifo)
        self.assert_refused(fifo, exception.InvalidPath,
                            ['not a regular file'], [fifo, self.disk])

    def test_unix_socket(self):
        path = os.path.join(self.inst, 'disk.sock')
        sock = socket.socket(socket.AF_UNIX)
        self.addCleanup(sock.close)
        sock.bind(path)
        self.assert_refused(path, exception.InvalidPath,
                            ['not a regular file'], [path, self.disk])

    def test_relative_path(self):
        cwd = os.getcwd()
        os.chdir(self.instances_path)
        self.addCleanup(os.chdir, cwd)
        for path in ('inst/disk', './inst/disk', 'inst/../inst/disk'):
            self.assertTrue(os.path.exists(path))
            self.assert_refused(path, exception.InvalidPath, ['absolute'],
                                [self.disk])

    def test_missing_file(self):
        self.assert_refused(os.path.join(self.inst, 'disk.none'),
                            exception.InvalidPath, ['does not exist'],
                            [self.disk])
        self.assertEqual(['disk'], os.listdir(self.inst))

    def test_not_a_string(self):
        for value in (None, 42, 4.2, True, b'', self.disk.encode(),
                      pathlib.Path(self.disk), [self.disk], {'p': 1}, ''):
            self.assert_refused(value, exception.InvalidPath, ['string'],
                                [self.disk])

    def test_nul_byte(self):
        self.assert_refused(self.disk + '\x00.x', exception.InvalidPath,
                            [], [self.disk])

    def test_trailing_slash(self):
        self.assert_refused(self.disk + '/', exception.InvalidPath, [],
                            [self.disk])

    def test_valid_disk_control(self):
        """Control: the disk itself is accepted, so the refusals above are
        about the paths, not about the setup.
        """
        fs = prealloc_backend.privsep.fs
        self.assertEqual(4096, fs.zero_fill_range(self.disk, 65536, 4096))
        fs.fallocate_range(self.disk, 0, DISK_SIZE)
        self.assertGreaterEqual(pb_fixtures.allocated(self.disk), DISK_SIZE)


class WalkPathRefusalTestCase(PathRefusalTestCase):
    """The same refusals where openat2(2) is missing (kernel < 5.6): the
    component-by-component walk. The module's own flag (set when openat2
    answers ENOSYS) is set, so that this kernel's openat2 is never asked.
    """

    def setUp(self):
        super().setUp()
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_backend.privsep.beneath._openat2_missing', True))
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_backend.privsep.beneath.openat2', self._no_openat2))

    @staticmethod
    def _no_openat2(*args, **kwargs):
        raise AssertionError('openat2 called while the walk is forced')


class PinnedRootTestCase(base.BoundaryTestCase):
    """instances_path is pinned once; renaming it away changes nothing."""

    def test_swapped_for_symlink_after_pinning(self):
        fs = prealloc_backend.privsep.fs
        self.assertEqual(4096, fs.zero_fill_range(self.disk, 65536, 4096))
        # The nova user owns the parent: it renames instances_path away
        # and puts a symlink to another tree in its place.
        moved = self.instances_path + '.moved'
        os.rename(self.instances_path, moved)
        self.addCleanup(os.rename, moved, self.instances_path)
        os.mkdir(os.path.join(self.outside_dir, 'inst'))
        decoy = make_disk(os.path.join(self.outside_dir, 'inst', 'disk'))
        os.symlink(self.outside_dir, self.instances_path)
        self.addCleanup(os.unlink, self.instances_path)
        before = file_state(decoy)
        # The daemon still works on the pinned directory, not the decoy.
        self.assertEqual(4096, fs.zero_fill_range(self.disk, 131072, 4096))
        fs.fallocate_range(self.disk, 0, DISK_SIZE)
        self.assertEqual(before, file_state(decoy))
        self.assertGreaterEqual(
            pb_fixtures.allocated(os.path.join(moved, 'inst', 'disk')),
            DISK_SIZE)

    def test_unusable_instances_path(self):
        fs = prealloc_backend.privsep.fs
        alias = os.path.join(self.scratch, 'instances-alias')
        os.symlink(self.instances_path, alias)
        a_file = os.path.join(self.scratch, 'a-file')
        open(a_file, 'w').close()
        for configured, words in (
                (alias, 'symlink'),
                (os.path.join(self.scratch, 'none'), 'does not exist'),
                (a_file, 'not a directory'),
                ('/', 'root directory'),
                ('//', 'root directory'),
                ('relative/path', 'absolute')):
            self.flags(instances_path=configured)
            exc = self.assertRaises(
                exception.InstancesPathUnusable, fs.zero_fill_range,
                os.path.join('/', configured, 'inst', 'disk'), 0, 4096)
            self.assertIn(words, str(exc), configured)
            self.assertIn(repr(configured), str(exc))

    def test_symlinked_ancestor_is_refused(self):
        """A symlink in any component of instances_path, not only the
        last, is refused when it is pinned: with openat2, with the walk
        from '/', and with openat2 answering EPERM as a seccomp filter that
        does not know it does (the walk then takes over).
        """
        fs = prealloc_backend.privsep.fs
        parent = os.path.join(self.scratch, 'parent-alias')
        os.symlink(os.path.dirname(self.instances_path), parent)
        configured = os.path.join(parent,
                                  os.path.basename(self.instances_path))
        real_openat2 = beneath.openat2
        calls = []

        def seccomp_openat2(*args):
            calls.append(args)
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))

        for index, (missing, openat2) in enumerate((
                (False, real_openat2), (True, real_openat2),
                (False, seccomp_openat2))):
            self.useFixture(fixtures.MonkeyPatch(
                'prealloc_backend.privsep.beneath._openat2_missing',
                missing))
            self.useFixture(fixtures.MonkeyPatch(
                'prealloc_backend.privsep.beneath.openat2', openat2))
            self.flags(instances_path=configured)
            exc = self.assertRaises(
                exception.InstancesPathUnusable, fs.zero_fill_range,
                os.path.join(configured, 'inst', 'disk'), 0, 4096)
            self.assertIn('a directory above it, is a symlink', str(exc))
            # The real path is pinned, and a disk under it resolved,
            # whichever resolver is used.
            self.flags(instances_path=self.instances_path)
            self.assertEqual(4096, fs.zero_fill_range(
                self.disk, 65536 + 4096 * index, 4096))
        # EPERM was met once; every later call walked.
        self.assertEqual(1, len(calls))
        self.assertTrue(beneath._openat2_missing)

    def test_pinned_once(self):
        fs = prealloc_backend.privsep.fs
        fs.fallocate_range(self.disk, 0, 4096)
        root = fs.pinned_root()
        fs.zero_fill_range(self.disk, 65536, 4096)
        self.assertIs(root, fs.pinned_root())
        self.assertEqual(os.stat(self.instances_path).st_ino, root.ino)


class SizeRefusalTestCase(base.BoundaryTestCase):
    """Offsets and lengths a privileged call must refuse."""

    RANGE_CALLS = ('fallocate_range', 'zero_fill_range')

    def _refuse(self, offset, length, value, words):
        self.assert_refused(self.disk, exception.InvalidSize, words,
                            [self.disk], value=value,
                            entrypoints=self.RANGE_CALLS, offset=offset,
                            length=length)

    def test_bad_lengths(self):
        fs_size = self._fs_size()
        for length, words in (
                (0, ['length', 'at least 1']),
                (-1, ['length', 'at least 1']),
                (-DISK_SIZE, ['length', 'at least 1']),
                (4096.0, ['length', 'integer', 'float']),
                (0.5, ['length', 'integer']),
                ('4096', ['length', 'integer', 'str']),
                (b'4096', ['length', 'integer']),
                (None, ['length', 'integer']),
                (True, ['length', 'integer', 'bool']),
                (False, ['length', 'integer', 'bool']),
                ([4096], ['length', 'integer']),
                (DISK_SIZE + 1, ['end of the file']),
                (fs_size + 4096, ['larger than the filesystem']),
                (2 ** 64, ['larger than the filesystem']),
                (2 ** 200, ['larger than the filesystem'])):
            self._refuse(0, length, length, words)

    def test_bad_offsets(self):
        for offset, words in (
                (-1, ['offset', 'at least 0']),
                (-2 ** 63, ['offset', 'at least 0']),
                (0.0, ['offset', 'integer']),
                ('0', ['offset', 'integer']),
                (None, ['offset', 'integer']),
                (True, ['offset', 'integer', 'bool']),
                (False, ['offset', 'integer', 'bool'])):
            self._refuse(offset, 4096, offset, words)

    def test_ranges_past_end_of_file(self):
        for offset, length in ((DISK_SIZE, 1), (DISK_SIZE - 1, 2),
                               (DISK_SIZE + units.Gi, 4096),
                               (2 ** 63 - 1, 1), (2 ** 63, 1),
                               (2 ** 70, 1), (1, DISK_SIZE)):
            self._refuse(offset, length, length, ['end of the file'])

    def _fs_size(self):
        vfs = os.statvfs(self.disk)
        return vfs.f_blocks * vfs.f_frsize

    def test_valid_range_control(self):
        """Control: the smallest valid calls work, so the refusals above
        are about the values, not about the disk.
        """
        fs = prealloc_backend.privsep.fs
        self.assertEqual(1, fs.zero_fill_range(self.disk, DISK_SIZE - 1, 1))
        fs.fallocate_range(self.disk, 0, DISK_SIZE)
        self.assertEqual(DISK_SIZE, os.path.getsize(self.disk))
        self.assertGreaterEqual(pb_fixtures.allocated(self.disk), DISK_SIZE)


class CapabilitiesTestCase(base.TestCase):

    def test_entrypoints_are_this_context_only(self):
        ctx = prealloc_backend.privsep.ctx
        for name in ENTRYPOINTS:
            self.assertTrue(ctx.is_entrypoint(
                getattr(prealloc_backend.privsep.fs, name)), name)
        public = sorted(
            name for name, value in vars(prealloc_backend.privsep.fs).items()
            if ctx.is_entrypoint(value))
        self.assertEqual(sorted(ENTRYPOINTS), public)


class _DeadChannel:
    """A client channel whose daemon is gone but whose reader thread has
    not noticed yet: running, and every send fails as a socket whose peer
    was killed fails. Stands in for oslo.privsep's ClientChannel, whose
    race with the reader thread cannot be ordered from a test.
    """

    def __init__(self, errno_):
        self.errno = errno_
        self.running = True
        self.lock = threading.Lock()
        self.calls = 0
        self.closed = False

    def remote_call(self, name, args, kwargs, timeout):
        self.calls += 1
        raise OSError(self.errno, os.strerror(self.errno))

    def close(self):
        self.closed = True


class _LiveChannel(_DeadChannel):

    def __init__(self):
        super().__init__(0)

    def remote_call(self, name, args, kwargs, timeout):
        self.calls += 1
        return 'done'


class DeadDaemonChannelTestCase(base.TestCase):
    """A send that finds the daemon gone marks the channel stopped, so the
    very next call starts a new daemon instead of failing the same way.
    """

    def _context(self, channel):
        ctx = prealloc_backend.privsep._PrivContext(
            'prealloc_backend_test', pypath=__name__ + '.unused',
            capabilities=[])
        ctx.client_mode = True
        ctx.channel = channel
        started = []

        def start(method=None):
            ctx.channel = _LiveChannel()
            started.append(ctx.channel)
        self.useFixture(fixtures.MockPatchObject(ctx, 'start', start))
        return ctx, started

    def test_next_call_starts_a_new_daemon(self):
        for errno_ in (errno.EPIPE, errno.ECONNRESET):
            dead = _DeadChannel(errno_)
            ctx, started = self._context(dead)
            exc = self.assertRaises(OSError, ctx._wrap, make_disk)
            self.assertEqual(errno_, exc.errno)
            self.assertFalse(dead.running)
            self.assertEqual('done', ctx._wrap(make_disk))
            self.assertTrue(dead.closed)
            self.assertEqual(1, dead.calls)
            self.assertEqual(1, len(started))
            self.assertEqual(1, started[0].calls)

    def test_other_errors_leave_the_channel_alone(self):
        dead = _DeadChannel(errno.ENOSPC)
        ctx, started = self._context(dead)
        self.assertRaises(OSError, ctx._wrap, make_disk)
        self.assertTrue(dead.running)
        self.assertRaises(OSError, ctx._wrap, make_disk)
        self.assertEqual(2, dead.calls)
        self.assertEqual([], started)


class ZeroFillTestCase(base.BoundaryTestCase):
    """fileops.zero_fill never changes the size and never writes a byte it
    did not read back as zero in the same pass.
    """

    def _fd(self, path):
        fd = os.open(path, os.O_RDWR)
        self.addCleanup(os.close, fd)
        return fd

    def test_truncated_before_a_write_is_not_grown(self):
        """The file shrinks between two writes of one pass (the hook runs
        right before each write): the pass stops, the size stays what the
        truncate made it.
        """
        for cut in (0, 65536, 3 * units.Mi):
            path = make_disk(os.path.join(self.inst, 'cut%d' % cut))
            fd = self._fd(path)
            calls = []

            def before_write(count):
                calls.append(count)
                if len(calls) == 2:
                    os.truncate(path, cut)

            exc = self.assertRaises(fileops.SizeChanged, fileops.zero_fill,
                                    fd, 0, DISK_SIZE, before_write)
            self.assertEqual((DISK_SIZE, cut), (exc.before, exc.after))
            self.assertEqual(cut, os.path.getsize(path))
            self.assertEqual(calls[0], exc.written)

    def test_short_read_ends_the_pass(self):
        """The file shrank after the holes were listed: the chunk read
        short, nothing of it is written and the size is kept.
        """
        path = make_disk(os.path.join(self.inst, 'short'))
        fd = self._fd(path)
        real_holes = fileops.holes

        def holes_then_truncate(fd_, start, end):
            found = list(real_holes(fd_, start, end))
            os.truncate(path, units.Mi + 100)
            return found

        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_backend.system.fileops.holes', holes_then_truncate))
        exc = self.assertRaises(fileops.SizeChanged, fileops.zero_fill, fd,
                                0, DISK_SIZE)
        self.assertEqual(units.Mi + 100, os.path.getsize(path))
        self.assertEqual(units.Mi + 100, exc.after)

    def test_only_zeros_overwritten(self):
        """Data written into a hole after the holes were listed (as a
        writer would) is read back as data and kept.
        """
        path = make_disk(os.path.join(self.inst, 'raced'))
        fd = self._fd(path)
        real_holes = fileops.holes
        pattern = b'\x5c' * 512

        def holes_then_write(fd_, start, end):
            found = list(real_holes(fd_, start, end))
            with open(path, 'r+b') as f:
                for offset in (65536, units.Mi + 1000, 3 * units.Mi - 512):
                    f.seek(offset)
                    f.write(pattern)
            return found

        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_backend.system.fileops.holes', holes_then_write))
        fileops.zero_fill(fd, 0, DISK_SIZE)
        with open(path, 'rb') as f:
            for offset in (65536, units.Mi + 1000, 3 * units.Mi - 512):
                f.seek(offset)
                self.assertEqual(pattern, f.read(512), offset)
        self.assertEqual(DISK_SIZE, os.path.getsize(path))

    def test_entrypoint_reports_a_size_change(self):
        """Through the entrypoint, a size change is a typed error naming
        the disk and both sizes.
        """
        real = fileops.zero_fill

        def truncating(fd, start, end, before_write=None, lock=None):
            def hook(count):
                os.truncate(self.disk, units.Mi)
                if before_write:
                    before_write(count)
            return real(fd, start, end, hook, lock)

        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_backend.system.fileops.zero_fill', truncating))
        exc = self.assertRaises(
            exception.DiskChangedDuringFill,
            prealloc_backend.privsep.fs.unprivileged_zero_fill_range,
            self.disk, 0, DISK_SIZE)
        for word in (self.disk, str(DISK_SIZE), str(units.Mi)):
            self.assertIn(word, str(exc))
        self.assertEqual(units.Mi, os.path.getsize(self.disk))


class QemuLockTestCase(base.BoundaryTestCase):
    """QEMU's own image locks, with real qemu-io processes."""

    def _qemu_io(self, path, *commands):
        return subprocess.run(
            ['qemu-io', '-f', 'raw'] +
            [arg for c in commands for arg in ('-c', c)] + [path],
            capture_output=True, text=True)

    def _qemu_io_open(self, path):
        """A qemu-io holding the image open for writing (as a running
        guest holds its disk), until it reads 'quit'.
        """
        proc = subprocess.Popen(['qemu-io', '-f', 'raw', path],
                                stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        self.addCleanup(proc.wait)
        self.addCleanup(proc.kill)
        # Its prompt comes once the image is open (and locked).
        probe = os.open(path, os.O_RDONLY)
        self.addCleanup(os.close, probe)
        deadline = time.monotonic() + 30
        while not fileops.ofd_lock_held(probe, fileops.QEMU_WRITER_BYTE):
            self.assertLess(time.monotonic(), deadline, 'qemu-io never '
                            'locked the image')
            time.sleep(0.02)
        return proc

    def test_disk_in_use_is_not_zero_filled(self):
        proc = self._qemu_io_open(self.disk)
        before = file_state(self.disk)
        exc = self.assertRaises(
            exception.DiskInUse,
            prealloc_backend.privsep.fs.zero_fill_range, self.disk, 0,
            DISK_SIZE)
        self.assertIn(self.disk, str(exc))
        self.assertIn('running guest', str(exc))
        self.assertEqual(before, file_state(self.disk))
        proc.communicate('quit\n', timeout=30)
        # Control: once the guest is gone, the fill works.
        self.assertGreater(prealloc_backend.privsep.fs.zero_fill_range(
            self.disk, 0, DISK_SIZE // 2), 0)
        # fallocate (content unchanged) stays allowed on a disk in use.
        self._qemu_io_open(self.disk)
        before = file_state(self.disk)
        prealloc_backend.privsep.fs.fallocate_range(self.disk, 0, DISK_SIZE)
        self.assertEqual(before['sha256'], file_state(self.disk)['sha256'])
        self.assertGreaterEqual(pb_fixtures.allocated(self.disk), DISK_SIZE)

    def test_zero_fill_locks_out_qemu_writers(self):
        """While zero-filling, a QEMU process cannot open the disk for
        writing: qemu-io run from inside the fill fails on the lock.
        """
        seen = []
        real = fileops.zero_fill

        def fill_with_qemu_io(fd, start, end, before_write=None, lock=None):
            def hook(count):
                if not seen:
                    seen.append(self._qemu_io(self.disk,
                                              'write -P 0x77 0 4k'))
                if before_write:
                    before_write(count)
            return real(fd, start, end, hook, lock)

        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_backend.system.fileops.zero_fill', fill_with_qemu_io))
        prealloc_backend.privsep.fs.zero_fill_range(self.disk, 0, DISK_SIZE)
        self.assertEqual(1, seen[0].returncode, seen[0])
        self.assertIn('Failed to get "write" lock', seen[0].stderr)
        with open(self.disk, 'rb') as f:
            self.assertEqual(b'\xa5' * 4096, f.read(4096))
        # Control: after the fill the same qemu-io works.
        self.assertEqual(0, self._qemu_io(self.disk,
                                          'write -P 0x77 0 4k').returncode)
