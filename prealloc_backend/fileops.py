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
"""

import ctypes
import ctypes.util
import errno
import os

FALLOC_FL_KEEP_SIZE = 0x01

# Zeros are written in chunks of this size: large enough for sequential
# throughput, small enough that no large buffer is held.
ZERO_CHUNK = 1024 * 1024
# Granularity of the 'only where it reads as zeros' guard of zero_fill.
ZERO_GUARD_BLOCK = 4096

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


def _write_zeros_where_zero(fd, offset, count, zeros):
    """Write zeros over [offset, offset+count) where it reads as zeros.

    A second guard behind SEEK_HOLE: whatever the filesystem reported, a
    block that holds a non-zero byte is left alone, so the content of the
    file cannot change. Reading a real hole costs no disk I/O.
    """
    current = os.pread(fd, count, offset)
    if current == zeros[:len(current)]:
        return os.pwrite(fd, zeros[:count], offset)
    written = 0
    for start in range(0, count, ZERO_GUARD_BLOCK):
        block = current[start:start + ZERO_GUARD_BLOCK]
        if block.count(0) != len(block):
            continue
        length = min(ZERO_GUARD_BLOCK, count - start)
        written += os.pwrite(fd, zeros[:length], offset + start)
    return written


def zero_fill(fd, start, end):
    """Write zeros into every hole of fd within [start, end).

    Data ranges are skipped, never rewritten. Returns the bytes written.
    """
    zeros = bytes(ZERO_CHUNK)
    written = 0
    for offset, length in list(holes(fd, start, end)):
        stop = offset + length
        while offset < stop:
            count = min(ZERO_CHUNK, stop - offset)
            written += _write_zeros_where_zero(fd, offset, count, zeros)
            offset += count
    if written:
        os.fdatasync(fd)
    return written
