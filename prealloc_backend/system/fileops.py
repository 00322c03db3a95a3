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

"""Block allocation on open file descriptors.

Pure system-call helpers, shared by the privileged entrypoints and the
filesystem probe. fallocate(2) is called directly (through libc) rather than
through glibc's posix_fallocate(), which silently falls back to writing zeros
on filesystems without fallocate support: the plugin must know, not guess.

It also reads and takes QEMU's image locks (open file description byte-range
locks, as QEMU's block/file-posix.c takes them), so that a disk a running
guest writes is never zero-filled.
"""

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import os
import struct

FALLOC_FL_KEEP_SIZE = 0x01

# Zeros are written in chunks of this size: large enough for sequential
# throughput, small enough that no large buffer is held.
ZERO_CHUNK = 1024 * 1024
# Granularity of the 'only where it reads as zeros' guard of zero_fill.
ZERO_GUARD_BLOCK = 4096

# QEMU's image locking (block/file-posix.c, "Posix file locking bytes"):
# an image opened with permission bit i holds a shared lock on byte
# RAW_LOCK_PERM_BASE + i; one that does not share permission bit i with
# other users holds a shared lock on byte RAW_LOCK_SHARED_BASE + i. Before
# taking a permission QEMU tests byte RAW_LOCK_SHARED_BASE + i ('Failed to
# get "write" lock' when someone holds it); before refusing to share one it
# tests byte RAW_LOCK_PERM_BASE + i ('Failed to get shared "write" lock').
# Permission bits (include/block/block-common.h): BLK_PERM_CONSISTENT_READ
# is bit 0, BLK_PERM_WRITE bit 1.
QEMU_LOCK_PERM_BASE = 100
QEMU_LOCK_SHARED_BASE = 200
QEMU_PERM_CONSISTENT_READ = 0
QEMU_PERM_WRITE = 1
# A process writing the image (a running guest, qemu-io, qemu-img commit).
QEMU_WRITER_BYTE = QEMU_LOCK_PERM_BASE + QEMU_PERM_WRITE
# A process that forbids other writers (a running guest, any reader that
# wants consistent reads: qemu-img info/convert without --force-share).
QEMU_NO_OTHER_WRITER_BYTE = QEMU_LOCK_SHARED_BASE + QEMU_PERM_WRITE

# struct flock of Linux (x86_64 and the other 64-bit ABIs): short l_type,
# short l_whence, off_t l_start, off_t l_len, pid_t l_pid, padding.
_FLOCK = struct.Struct('@hhqqi4x')
F_OFD_GETLK = getattr(fcntl, 'F_OFD_GETLK', 36)
F_OFD_SETLK = getattr(fcntl, 'F_OFD_SETLK', 37)

# FS_IOC_FIEMAP: struct fiemap (32 bytes) followed by struct fiemap_extent
# (56 bytes each).
FS_IOC_FIEMAP = 0xC020660B
FIEMAP_FLAG_SYNC = 0x1
FIEMAP_EXTENT_LAST = 0x1
_FIEMAP = struct.Struct('=QQIIII')
_FIEMAP_EXTENT = struct.Struct('=QQQ16xI12x')
_FIEMAP_BATCH = 256

_libc = ctypes.CDLL(ctypes.util.find_library('c'), use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
                            ctypes.c_longlong]
_libc.fallocate.restype = ctypes.c_int


def fallocate(fd, offset, length, keep_size=True):
    """Call fallocate(2); raise OSError (EOPNOTSUPP where unsupported)."""
    mode = FALLOC_FL_KEEP_SIZE if keep_size else 0
    if _libc.fallocate(fd, mode, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def drop_page_cache(fd, offset=0, length=0):
    """Write back fd's file, then drop the clean pages of [offset,
    offset+length) (length 0: to the end) from the host's page cache
    (``POSIX_FADV_DONTNEED``): nothing a reader sees changes.

    Zeros the plugin wrote (mode full, a zero-filled raw disk) otherwise
    stay cached, useless to a guest that opens its disk with
    ``cache=none``, and every first O_DIRECT write into a cached range
    must invalidate those pages first: measured 2.2-2.6x slower 4 KiB
    first writes (doc/source/admin/modes.rst). Dirty pages are never
    dropped, so the write-back comes first, and its error (EIO) is
    raised; the drop itself is a hint: False where it failed.
    """
    os.fdatasync(fd)
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    except OSError:
        return False
    return True


def drop_file_page_cache(path):
    """drop_page_cache() of the whole file at ``path``, opened read-only.
    For the unprivileged caller's own disks only: the privileged daemon
    drops pages through the descriptor it opened safely (zero_fill).
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return drop_page_cache(fd)
    finally:
        os.close(fd)


def fsync_dir(path):
    """fsync(2) the directory ``path``: the names created, renamed or
    removed in it survive a power cut from now on.
    """
    fd = os.open(path or '.', os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync(path, denied_ok=False):
    """fsync(2) the file at ``path``: its data and size reach the device
    (the directory entry naming it does not: see fsync_dir).

    ``denied_ok``: a file this process may not open (a disk libvirt gave
    to the qemu user, which only the privileged daemon writes, and flushes
    itself) is left alone: False is returned.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except PermissionError:
        if not denied_ok:
            raise
        return False
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def publish(tmp, final):
    """Put the complete file ``tmp`` in place of ``final``, durably: its
    data flushed before the rename that publishes it (a power cut never
    leaves ``final`` naming a file whose blocks were not written), the
    directory flushed after it (the new name survives a power cut).
    """
    sync(tmp)
    os.rename(tmp, final)
    fsync_dir(os.path.dirname(final))


def write_file(path, data, mode=0o644, suffix='.tmp', dir_fd=None):
    """Replace the file at ``path`` with ``data`` (str or bytes) durably:
    written aside (as ``path + suffix``), flushed, renamed into place, the
    directory flushed. A reader, or a power cut, sees the old content or
    the new, whole. ``dir_fd``: a descriptor of the directory (opened for
    reading) that holds ``path``, then a name in it: no name outside it is
    looked up, and that directory is the one flushed.
    """
    if isinstance(data, str):
        data = data.encode()
    tmp = path + suffix
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    if dir_fd is not None:
        flags |= os.O_NOFOLLOW
    fd = os.open(tmp, flags, mode, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    if dir_fd is None:
        os.rename(tmp, path)
        fsync_dir(os.path.dirname(path))
    else:
        os.rename(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)


def remove(path):
    """Unlink ``path`` if it exists, durably (the directory flushed after
    the unlink, so that the name does not come back after a power cut).
    True when it existed.
    """
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    fsync_dir(os.path.dirname(path))
    return True


def is_unsupported(exc):
    """True when an OSError from fallocate means 'not supported here'."""
    return exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS)


def holes(fd, start, end):
    """Yield (offset, length) of the holes of fd within [start, end).

    Uses SEEK_DATA/SEEK_HOLE, so data ranges are never visited: a hole is a
    range the filesystem reports as unallocated, which reads as zeros. The
    file's dirty pages are flushed first: on ext4 without extents (kernel
    6.18 seen here) SEEK_DATA misses delayed-allocation data until then.
    """
    os.fdatasync(fd)
    pos = start
    while pos < end:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            data = end  # no data after pos: the rest is one hole
        data = min(data, end)
        if data > pos:
            yield pos, data - pos
        if data >= end:
            return
        pos = min(os.lseek(fd, data, os.SEEK_HOLE), end)


def hole_bytes(fd, start, end):
    """Total size of the holes of fd within [start, end)."""
    return sum(length for _offset, length in holes(fd, start, end))


def ofd_lock_held(fd, offset):
    """True when another open file description holds a lock on byte
    ``offset`` of fd's file (F_OFD_GETLK for a write lock there).

    Locks held through fd's own open file description never count.
    """
    query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
    answer = fcntl.fcntl(fd, F_OFD_GETLK, query)
    return _FLOCK.unpack(answer)[0] != fcntl.F_UNLCK


def ofd_lock_shared(fd, offset):
    """Take a shared (read) OFD lock on byte ``offset``, as QEMU does.

    Held until released or until the open file description is closed.
    Raises OSError (EAGAIN) when someone holds a write lock on that byte.
    """
    fcntl.fcntl(fd, F_OFD_SETLK,
                _FLOCK.pack(fcntl.F_RDLCK, os.SEEK_SET, offset, 1, 0))


def ofd_unlock(fd, offset):
    fcntl.fcntl(fd, F_OFD_SETLK,
                _FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, offset, 1, 0))


def allocated_bytes(fd, start, end):
    """Bytes of [start, end) that the filesystem has blocks for, written or
    unwritten (FIEMAP, after flushing delayed allocations).

    Where FIEMAP is not supported, the ranges SEEK_DATA reports count
    (which leaves out unwritten extents: an overestimate of what an
    allocation still needs, never an underestimate).
    """
    total = 0
    pos = start
    try:
        while pos < end:
            request = bytearray(_FIEMAP.size +
                                _FIEMAP_EXTENT.size * _FIEMAP_BATCH)
            _FIEMAP.pack_into(request, 0, pos, end - pos, FIEMAP_FLAG_SYNC,
                              0, _FIEMAP_BATCH, 0)
            fcntl.ioctl(fd, FS_IOC_FIEMAP, request)
            mapped = _FIEMAP.unpack_from(request)[3]
            if not mapped:
                break
            last = False
            for index in range(mapped):
                logical, _physical, length, flags = _FIEMAP_EXTENT.unpack_from(
                    request, _FIEMAP.size + index * _FIEMAP_EXTENT.size)
                lo, hi = max(logical, pos), min(logical + length, end)
                if hi > lo:
                    total += hi - lo
                pos = max(pos, logical + length)
                last = last or bool(flags & FIEMAP_EXTENT_LAST)
            if last:
                break
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL):
            raise
        return (end - start) - hole_bytes(fd, start, end)
    return total


FIEMAP_EXTENT_UNWRITTEN = 0x800


class ExtentLimit(Exception):
    """unwritten_bytes met more extents than it may read."""

    def __init__(self, counted):
        super().__init__(counted)
        self.counted = counted


def unwritten_bytes(fd, size, max_extents):
    """Bytes of [0, size) of fd's file in extents the filesystem reports
    unwritten (FIEMAP_EXTENT_UNWRITTEN): blocks fallocate(2) reserved that
    nothing wrote yet. Only the extent map is read, never the data, and
    nothing is flushed (no FIEMAP_FLAG_SYNC: a reader of a running guest's
    disk must not make it write back). Raises ExtentLimit (with the bytes
    counted so far) past ``max_extents`` extents, OSError where FIEMAP is
    not supported (EOPNOTSUPP, ENOTTY).
    """
    total = 0
    seen = 0
    pos = 0
    while pos < size:
        request = bytearray(_FIEMAP.size + _FIEMAP_EXTENT.size * _FIEMAP_BATCH)
        _FIEMAP.pack_into(request, 0, pos, size - pos, 0, 0, _FIEMAP_BATCH, 0)
        fcntl.ioctl(fd, FS_IOC_FIEMAP, request)
        mapped = _FIEMAP.unpack_from(request)[3]
        if not mapped:
            break
        last = False
        for index in range(mapped):
            logical, _physical, length, flags = _FIEMAP_EXTENT.unpack_from(
                request, _FIEMAP.size + index * _FIEMAP_EXTENT.size)
            if flags & FIEMAP_EXTENT_UNWRITTEN:
                lo, hi = max(logical, pos), min(logical + length, size)
                if hi > lo:
                    total += hi - lo
            pos = max(pos, logical + length)
            last = last or bool(flags & FIEMAP_EXTENT_LAST)
        seen += mapped
        if last:
            break
        if seen >= max_extents:
            raise ExtentLimit(total)
    return total


class SizeChanged(Exception):
    """The file's size changed while it was being zero-filled.

    Not raised for a truncate landing between the size check before a
    write and that write, below a run ending at EOF: the write grows the
    file back to its old size unseen (doc/source/admin/security.rst);
    below a run ending before EOF the write grows it to the run's end, and
    the check after it raises this.
    """

    def __init__(self, before, after, written):
        super().__init__(before, after, written)
        self.before = before
        self.after = after
        self.written = written


def _zero_runs(current, offset):
    """(offset, length) runs of the guard blocks of ``current`` (bytes read
    at ``offset``) that hold only zeros.
    """
    run_start = None
    for start in range(0, len(current), ZERO_GUARD_BLOCK):
        block = current[start:start + ZERO_GUARD_BLOCK]
        if block.count(0) == len(block):
            if run_start is None:
                run_start = start
            continue
        if run_start is not None:
            yield offset + run_start, start - run_start
            run_start = None
    if run_start is not None:
        yield offset + run_start, len(current) - run_start


def zero_fill(fd, start, end, before_write=None, lock=None):
    """Write zeros into every hole of fd within [start, end).

    Data is never rewritten, and the file's size never changes:

    * the holes are listed with SEEK_HOLE, then each chunk is read back and
      zeros are written only over the 4 KiB guard blocks it read as zeros,
      and only over bytes that this same pass read;
    * a short read (the file shrank) ends the pass, as does a size found
      different before a write or after it (SizeChanged is raised, naming
      what was written).

    ``before_write(count)`` is called before each write of ``count`` bytes
    (the caller's free-space check); ``lock`` (a context manager), when
    given, is held around each check and the write it allows, so that a
    caller serialising its allocations cannot overshoot what it checked.
    Returns the bytes written.
    """
    guard = lock if lock is not None else contextlib.nullcontext()
    size = os.fstat(fd).st_size
    end = min(end, size)
    zeros = bytes(ZERO_CHUNK)
    written = 0
    for offset, length in list(holes(fd, start, end)):
        stop = offset + length
        while offset < stop:
            count = min(ZERO_CHUNK, stop - offset)
            current = os.pread(fd, count, offset)
            if len(current) != count:
                raise SizeChanged(size, os.fstat(fd).st_size, written)
            for run, run_length in _zero_runs(current, offset):
                with guard:
                    if before_write is not None:
                        before_write(run_length)
                    # pwrite(2) past the end of a file grows it; no
                    # flag forbids that. The size is checked right before
                    # each write and right after it, which narrows a
                    # concurrent truncate to a window of one system call
                    # (a truncate landing there, below a run that ends at
                    # EOF, is undone unseen: see
                    # doc/source/admin/security.rst).
                    now = os.fstat(fd).st_size
                    if now != size:
                        raise SizeChanged(size, now, written)
                    done = os.pwrite(fd, zeros[:run_length], run)
                    written += done
                    now = os.fstat(fd).st_size
                    if now != size:
                        raise SizeChanged(size, now, written)
                    if done != run_length:
                        # A short write to a regular file: the filesystem
                        # is full (the next write would say ENOSPC).
                        raise OSError(errno.ENOSPC,
                                      os.strerror(errno.ENOSPC))
            offset += count
    if written:
        drop_page_cache(fd, start, end - start)
    return written
