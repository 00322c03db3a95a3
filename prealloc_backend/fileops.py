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
    range the filesystem reports as unallocated, which reads as zeros.
    """
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
            done = os.pwrite(fd, zeros[:count] if count < ZERO_CHUNK
                             else zeros, offset)
            offset += done
            written += done
    if written:
        os.fdatasync(fd)
    return written
