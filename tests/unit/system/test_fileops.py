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

"""prealloc_backend/system/fileops.py on real files of this machine's
filesystem.

fallocate(2), SEEK_DATA/SEEK_HOLE, FIEMAP and the OFD locks are the
kernel's own; what each call did is read back independently (os.stat's
st_blocks, the bytes themselves, a second open file description).
"""

import errno
import fcntl
import os

import fixtures
from oslo_utils import units
from oslotest import base

from prealloc_backend.system import fileops
from tests import fixtures as pb_fixtures

BLOCK = 64 * units.Ki


class FileCase(base.BaseTestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path

    def sparse(self, size, data_at=()):
        """A sparse file of ``size`` with BLOCK bytes of 0xa5 at each
        offset of ``data_at``; returns an O_RDWR fd (closed at cleanup).
        """
        path = os.path.join(self.dir, 'f%d' % len(os.listdir(self.dir)))
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self.addCleanup(os.close, fd)
        os.ftruncate(fd, size)
        for offset in data_at:
            os.pwrite(fd, b'\xa5' * BLOCK, offset)
        os.fsync(fd)
        self.path = path
        return fd

    def blocks(self, fd):
        return os.fstat(fd).st_blocks * 512


class FallocateTestCase(FileCase):

    def test_keep_size_allocates_without_growing(self):
        fd = self.sparse(units.Mi)
        fileops.fallocate(fd, 0, units.Mi)
        self.assertEqual(units.Mi, os.fstat(fd).st_size)
        self.assertGreaterEqual(self.blocks(fd), units.Mi)
        # Allocated but unwritten: it still reads as zeros.
        self.assertEqual(bytes(units.Mi), os.pread(fd, units.Mi, 0))

    def test_without_keep_size_grows_the_file(self):
        fd = self.sparse(0)
        fileops.fallocate(fd, 0, 2 * units.Mi, keep_size=False)
        self.assertEqual(2 * units.Mi, os.fstat(fd).st_size)
        self.assertGreaterEqual(self.blocks(fd), 2 * units.Mi)

    def test_error_is_an_oserror_with_errno(self):
        fd = os.open(os.path.join(self.dir, 'ro'), os.O_RDONLY | os.O_CREAT)
        self.addCleanup(os.close, fd)
        exc = self.assertRaises(OSError, fileops.fallocate, fd, 0, units.Mi)
        self.assertEqual(errno.EBADF, exc.errno)
        self.assertEqual(os.strerror(errno.EBADF), exc.strerror)

    def test_is_unsupported(self):
        for err in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS):
            self.assertTrue(fileops.is_unsupported(OSError(err, 'x')), err)
        for err in (errno.ENOSPC, errno.EBADF, errno.EIO):
            self.assertFalse(fileops.is_unsupported(OSError(err, 'x')), err)


class HolesTestCase(FileCase):

    def test_holes_around_data(self):
        size = 8 * BLOCK
        fd = self.sparse(size, data_at=(2 * BLOCK, 5 * BLOCK))
        self.assertEqual(
            [(0, 2 * BLOCK), (3 * BLOCK, 2 * BLOCK), (6 * BLOCK, 2 * BLOCK)],
            list(fileops.holes(fd, 0, size)))
        self.assertEqual(6 * BLOCK, fileops.hole_bytes(fd, 0, size))

    def test_range_is_clipped(self):
        fd = self.sparse(8 * BLOCK, data_at=(2 * BLOCK,))
        self.assertEqual([(BLOCK, BLOCK), (3 * BLOCK, BLOCK)],
                         list(fileops.holes(fd, BLOCK, 4 * BLOCK)))
        self.assertEqual([], list(fileops.holes(fd, 2 * BLOCK, 3 * BLOCK)))

    def test_fully_written_file_has_no_holes(self):
        fd = self.sparse(2 * BLOCK, data_at=(0, BLOCK))
        self.assertEqual(0, fileops.hole_bytes(fd, 0, 2 * BLOCK))

    def test_unflushed_data_is_seen(self):
        # holes() flushes first: data still in the page cache is data.
        fd = self.sparse(4 * BLOCK)
        os.pwrite(fd, b'\x01' * BLOCK, BLOCK)
        self.assertEqual(3 * BLOCK, fileops.hole_bytes(fd, 0, 4 * BLOCK))


class AllocatedBytesTestCase(FileCase):

    def test_written_and_unwritten_extents_count(self):
        size = 16 * BLOCK
        fd = self.sparse(size, data_at=(0,))
        self.assertEqual(BLOCK, fileops.allocated_bytes(fd, 0, size))
        # An unwritten (fallocated) extent counts: it needs no more room.
        fileops.fallocate(fd, 8 * BLOCK, 4 * BLOCK)
        self.assertEqual(5 * BLOCK, fileops.allocated_bytes(fd, 0, size))
        self.assertEqual(2 * BLOCK,
                         fileops.allocated_bytes(fd, 10 * BLOCK, size))
        self.assertEqual(0, fileops.allocated_bytes(fd, BLOCK, 8 * BLOCK))

    def test_many_extents(self):
        # More extents than one FIEMAP batch: the loop goes on.
        count = fileops._FIEMAP_BATCH + 10
        fd = self.sparse(2 * count * BLOCK,
                         data_at=[2 * i * BLOCK for i in range(count)])
        self.assertEqual(count * BLOCK,
                         fileops.allocated_bytes(fd, 0, 2 * count * BLOCK))


class UnwrittenBytesTestCase(FileCase):

    def test_only_unwritten_extents_count(self):
        size = 16 * BLOCK
        fd = self.sparse(size, data_at=(0,))
        self.assertEqual(0, fileops.unwritten_bytes(fd, size, 100))
        fileops.fallocate(fd, 8 * BLOCK, 4 * BLOCK)
        self.assertEqual(4 * BLOCK, fileops.unwritten_bytes(fd, size, 100))
        # Written now (flushed: the extent map is not synced for the
        # reader): no longer unwritten.
        os.pwrite(fd, b'\x5a' * BLOCK, 8 * BLOCK)
        os.fsync(fd)
        self.assertEqual(3 * BLOCK, fileops.unwritten_bytes(fd, size, 100))
        # Beyond the size asked: not counted.
        self.assertEqual(BLOCK, fileops.unwritten_bytes(fd, 10 * BLOCK, 100))

    def test_extent_limit(self):
        count = fileops._FIEMAP_BATCH + 10
        size = 2 * count * BLOCK
        fd = self.sparse(size)
        for i in range(count):
            fileops.fallocate(fd, 2 * i * BLOCK, BLOCK)
        self.assertEqual(count * BLOCK, fileops.unwritten_bytes(fd, size,
                                                                10 * count))
        exc = self.assertRaises(fileops.ExtentLimit, fileops.unwritten_bytes,
                                fd, size, 10)
        # One batch read before the limit was seen.
        self.assertEqual(fileops._FIEMAP_BATCH * BLOCK, exc.counted)


class OfdLockTestCase(FileCase):

    def test_lock_of_another_open_file_description(self):
        fd = self.sparse(BLOCK)
        other = os.open(self.path, os.O_RDWR)
        self.addCleanup(os.close, other)
        byte = fileops.QEMU_WRITER_BYTE
        self.assertFalse(fileops.ofd_lock_held(fd, byte))
        fileops.ofd_lock_shared(other, byte)
        self.assertTrue(fileops.ofd_lock_held(fd, byte))
        # Only that byte, and never through the holder's own description.
        self.assertFalse(fileops.ofd_lock_held(fd, byte + 1))
        self.assertFalse(fileops.ofd_lock_held(other, byte))
        fileops.ofd_unlock(other, byte)
        self.assertFalse(fileops.ofd_lock_held(fd, byte))

    def test_lock_ends_with_its_description(self):
        fd = self.sparse(BLOCK)
        other = os.open(self.path, os.O_RDWR)
        fileops.ofd_lock_shared(other, fileops.QEMU_NO_OTHER_WRITER_BYTE)
        self.assertTrue(fileops.ofd_lock_held(
            fd, fileops.QEMU_NO_OTHER_WRITER_BYTE))
        os.close(other)
        self.assertFalse(fileops.ofd_lock_held(
            fd, fileops.QEMU_NO_OTHER_WRITER_BYTE))

    def test_shared_lock_refused_under_a_write_lock(self):
        fd = self.sparse(BLOCK)
        other = os.open(self.path, os.O_RDWR)
        self.addCleanup(os.close, other)
        fcntl.fcntl(other, fileops.F_OFD_SETLK, fileops._FLOCK.pack(
            fcntl.F_WRLCK, os.SEEK_SET, 7, 1, 0))
        exc = self.assertRaises(OSError, fileops.ofd_lock_shared, fd, 7)
        self.assertIn(exc.errno, (errno.EAGAIN, errno.EACCES))


class DropPageCacheTestCase(FileCase):

    def setUp(self):
        super().setUp()
        pb_fixtures.skip_unless_pages_drop(self, self.dir)

    def test_clean_and_dirty_pages_dropped_data_kept(self):
        fd = self.sparse(8 * BLOCK, data_at=(0,))
        # Dirty pages (no fsync since): written back first, then dropped.
        os.pwrite(fd, b'\x5a' * BLOCK, 4 * BLOCK)
        self.assertGreater(pb_fixtures.cached_bytes(self.path), 0)
        fileops.drop_page_cache(fd)
        self.assertEqual(0, pb_fixtures.cached_bytes(self.path))
        self.assertEqual(b'\xa5' * BLOCK, os.pread(fd, BLOCK, 0))
        self.assertEqual(b'\x5a' * BLOCK, os.pread(fd, BLOCK, 4 * BLOCK))
        self.assertEqual(bytes(BLOCK), os.pread(fd, BLOCK, 2 * BLOCK))

    def test_by_path(self):
        self.sparse(4 * BLOCK, data_at=(BLOCK,))
        self.assertGreater(pb_fixtures.cached_bytes(self.path), 0)
        fileops.drop_file_page_cache(self.path)
        self.assertEqual(0, pb_fixtures.cached_bytes(self.path))


class ZeroFillTestCase(FileCase):

    def test_written_zeros_leave_the_page_cache(self):
        # A guest opens its disk with cache=none: cached zeros would only
        # slow its first writes (each must invalidate them first).
        pb_fixtures.skip_unless_pages_drop(self, self.dir)
        size = 2 * fileops.ZERO_CHUNK
        fd = self.sparse(size, data_at=(BLOCK,))
        self.assertEqual(size - BLOCK, fileops.zero_fill(fd, 0, size))
        self.assertEqual(0, pb_fixtures.cached_bytes(self.path))
        self.assertEqual(b'\xa5' * BLOCK, os.pread(fd, BLOCK, BLOCK))

    def test_fills_holes_and_keeps_data(self):
        size = 3 * fileops.ZERO_CHUNK + 5 * BLOCK
        fd = self.sparse(size, data_at=(BLOCK, 2 * fileops.ZERO_CHUNK))
        holes = fileops.hole_bytes(fd, 0, size)
        counts = []
        written = fileops.zero_fill(fd, 0, size, before_write=counts.append)
        self.assertEqual(holes, written)
        self.assertEqual(written, sum(counts))
        self.assertEqual(0, fileops.hole_bytes(fd, 0, size))
        self.assertEqual(size, os.fstat(fd).st_size)
        self.assertGreaterEqual(self.blocks(fd), size)
        for offset in (BLOCK, 2 * fileops.ZERO_CHUNK):
            self.assertEqual(b'\xa5' * BLOCK, os.pread(fd, BLOCK, offset))
        self.assertEqual(bytes(BLOCK), os.pread(fd, BLOCK, 0))

    def test_range_and_size_bound_the_fill(self):
        fd = self.sparse(8 * BLOCK)
        # Past EOF nothing is written, and the file does not grow.
        written = fileops.zero_fill(fd, 2 * BLOCK, 100 * BLOCK)
        self.assertEqual(6 * BLOCK, written)
        self.assertEqual(8 * BLOCK, os.fstat(fd).st_size)
        self.assertEqual([(0, 2 * BLOCK)],
                         list(fileops.holes(fd, 0, 8 * BLOCK)))

    def test_nothing_to_fill(self):
        fd = self.sparse(2 * BLOCK, data_at=(0, BLOCK))
        calls = []
        self.assertEqual(0, fileops.zero_fill(fd, 0, 2 * BLOCK,
                                              before_write=calls.append))
        self.assertEqual([], calls)

    def test_before_write_refusal_stops_the_fill(self):
        fd = self.sparse(4 * fileops.ZERO_CHUNK)

        def refuse(count):
            raise OSError(errno.ENOSPC, 'checked: no room')
        self.assertRaises(OSError, fileops.zero_fill, fd, 0,
                          4 * fileops.ZERO_CHUNK, before_write=refuse)
        self.assertEqual(4 * fileops.ZERO_CHUNK,
                         fileops.hole_bytes(fd, 0, 4 * fileops.ZERO_CHUNK))

    def test_size_changed_between_writes(self):
        size = 4 * fileops.ZERO_CHUNK
        fd = self.sparse(size)
        calls = []

        def truncate_after_first(count):
            calls.append(count)
            if len(calls) == 2:
                # Another process shrinks the file mid-fill.
                os.ftruncate(fd, size // 2)
        exc = self.assertRaises(fileops.SizeChanged, fileops.zero_fill, fd,
                                0, size, before_write=truncate_after_first)
        self.assertEqual((size, size // 2, calls[0]),
                         (exc.before, exc.after, exc.written))
        # Nothing was written past the new end: the file stays shrunk.
        self.assertEqual(size // 2, os.fstat(fd).st_size)

    def test_lock_is_held_around_each_check_and_write(self):
        fd = self.sparse(2 * fileops.ZERO_CHUNK)
        events = []

        class Lock:
            def __enter__(self):
                events.append('enter')

            def __exit__(self, *exc):
                events.append('exit')

        fileops.zero_fill(fd, 0, 2 * fileops.ZERO_CHUNK,
                          before_write=lambda n: events.append(n),
                          lock=Lock())
        self.assertEqual(['enter', fileops.ZERO_CHUNK, 'exit'] * 2, events)

    def test_zero_runs_only_over_zero_blocks(self):
        g = fileops.ZERO_GUARD_BLOCK
        current = bytes(2 * g) + b'\x01' + bytes(g - 1) + bytes(g)
        self.assertEqual([(100, 2 * g), (100 + 3 * g, g)],
                         list(fileops._zero_runs(current, 100)))


class DurableTestCase(FileCase):
    """publish, write_file and remove: the order of the system calls a
    power cut depends on (what survives one: tests/crash).
    """

    def record(self):
        calls = []
        real_fsync, real_rename, real_unlink = os.fsync, os.rename, os.unlink

        def fsync(fd):
            st = os.fstat(fd)
            calls.append(('fsync', 'dir' if os.path.isdir(
                '/proc/self/fd/%d' % fd) else st.st_size))
            return real_fsync(fd)

        def rename(src, dst):
            calls.append(('rename', os.path.basename(dst)))
            return real_rename(src, dst)

        def unlink(path):
            calls.append(('unlink', os.path.basename(path)))
            return real_unlink(path)

        for name, func in (('fsync', fsync), ('rename', rename),
                           ('unlink', unlink)):
            self.useFixture(fixtures.MockPatchObject(fileops.os, name,
                                                     func))
        return calls

    def test_publish_flushes_the_file_then_renames_then_the_dir(self):
        tmp, final = (os.path.join(self.dir, n) for n in ('t', 'f'))
        with open(tmp, 'wb') as f:
            f.write(b'new' * 100)
        with open(final, 'wb') as f:
            f.write(b'old')
        calls = self.record()
        fileops.publish(tmp, final)
        self.assertEqual([('fsync', 300), ('rename', 'f'), ('fsync', 'dir')],
                         calls)
        with open(final, 'rb') as f:
            self.assertEqual(b'new' * 100, f.read())
        self.assertEqual(['f'], os.listdir(self.dir))

    def test_write_file_replaces_whole_and_leaves_nothing_aside(self):
        path = os.path.join(self.dir, 'disk.info')
        fileops.write_file(path, 'old')
        calls = self.record()
        fileops.write_file(path, '{"a": "b"}\n')
        self.assertEqual([('fsync', 11), ('rename', 'disk.info'),
                          ('fsync', 'dir')], calls)
        with open(path) as f:
            self.assertEqual('{"a": "b"}\n', f.read())
        self.assertEqual(['disk.info'], os.listdir(self.dir))

    def test_remove_flushes_the_dir_after_the_unlink(self):
        path = os.path.join(self.dir, 'j')
        with open(path, 'wb'):
            pass
        calls = self.record()
        self.assertTrue(fileops.remove(path))
        self.assertEqual([('unlink', 'j'), ('fsync', 'dir')], calls)
        self.assertFalse(fileops.remove(path))
        self.assertEqual([('unlink', 'j'), ('fsync', 'dir'), ('unlink', 'j')],
                         calls)

    def test_fsync_dir_of_a_file_is_refused(self):
        path = os.path.join(self.dir, 'f')
        with open(path, 'wb'):
            pass
        self.assertRaises(NotADirectoryError, fileops.fsync_dir, path)

    def test_sync_of_a_file_this_process_may_not_open(self):
        path = os.path.join(self.dir, 'qemu-owned')
        with open(path, 'wb'):
            pass
        denied = PermissionError(errno.EACCES, 'denied')
        self.useFixture(fixtures.MockPatchObject(
            fileops.os, 'open', side_effect=denied))
        self.assertFalse(fileops.sync(path, denied_ok=True))
        self.assertRaises(PermissionError, fileops.sync, path)
