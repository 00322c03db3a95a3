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

"""Privileged entrypoints: allocate the blocks of an instance disk.

Each entrypoint is a narrow verb on one disk and validates its arguments
inside the daemon, whatever the caller checked: the file must be a regular
file, opened without following a symlink, whose real path lies under
``[DEFAULT] instances_path`` as the daemon's own configuration says; sizes and
offsets must be integers within the file and the filesystem. The logic sits
in ``unprivileged_*`` functions that tests call directly.
"""

import os
import stat

from oslo_log import log as logging

from prealloc_backend import conf
from prealloc_backend import exception
from prealloc_backend import fileops
import prealloc_backend.privsep

LOG = logging.getLogger(__name__)
CONF = conf.CONF


def _check_int(value, path, name, minimum):
    # bool is an int subclass: True must not pass as 1.
    if type(value) is not int:
        raise exception.InvalidSize(
            size=value, path=path,
            reason='%s must be an integer, got %s' % (
                name, type(value).__name__))
    if value < minimum:
        raise exception.InvalidSize(
            size=value, path=path,
            reason='%s must be at least %d' % (name, minimum))


def _open_disk(path):
    """Open path for writing after checking it is a disk we may touch.

    Returns the fd; the caller closes it. The final check is made on the
    opened descriptor itself (/proc/self/fd), so swapping a path component
    for a symlink between the checks and the open gains nothing.
    """
    if not isinstance(path, str) or not path:
        raise exception.InvalidPath(path=path,
                                    reason='the path must be a non-empty '
                                           'string')
    if not os.path.isabs(path):
        raise exception.InvalidPath(path=path,
                                    reason='the path must be absolute')
    if '\0' in path:
        raise exception.InvalidPath(path=path,
                                    reason='the path contains a NUL byte')
    root = os.path.realpath(CONF.instances_path)
    real = os.path.realpath(path)
    if os.path.commonpath([root, real]) != root or real == root:
        raise exception.InvalidPath(
            path=path, reason='it resolves to %s, outside instances_path %s'
                              % (real, root))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise exception.InvalidPath(path=path, reason='it does not exist')
    except OSError as exc:
        # ENOTDIR ('disk/'), ELOOP, ENAMETOOLONG...
        raise exception.InvalidPath(path=path,
                                    reason='it cannot be examined: %s' % exc)
    if stat.S_ISLNK(st.st_mode):
        raise exception.InvalidPath(path=path, reason='it is a symlink')
    if not stat.S_ISREG(st.st_mode):
        raise exception.InvalidPath(path=path,
                                    reason='it is not a regular file')
    try:
        fd = os.open(real, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK |
                     os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise exception.InvalidPath(path=path,
                                    reason='it cannot be opened: %s' % exc)
    try:
        opened = os.path.realpath('/proc/self/fd/%d' % fd)
        fst = os.fstat(fd)
        if (not stat.S_ISREG(fst.st_mode) or
                os.path.commonpath([root, opened]) != root or
                (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino)):
            raise exception.InvalidPath(
                path=path, reason='it changed while being opened (now %s)'
                                  % opened)
        if fst.st_nlink != 1:
            # NOTE: a hard link inside instances_path to a file outside it
            # has an inside real path; nova never hard-links disks.
            raise exception.InvalidPath(
                path=path, reason='it has %d hard links (a disk has one)'
                                  % fst.st_nlink)
    except Exception:
        os.close(fd)
        raise
    return fd


def _check_range(fd, path, offset, length):
    _check_int(offset, path, 'offset', 0)
    _check_int(length, path, 'length', 1)
    fst = os.fstat(fd)
    vfs = os.fstatvfs(fd)
    fs_size = vfs.f_blocks * vfs.f_frsize
    if length > fs_size:
        raise exception.InvalidSize(
            size=length, path=path,
            reason='larger than the filesystem (%d bytes)' % fs_size)
    if offset + length > fst.st_size:
        raise exception.InvalidSize(
            size=length, path=path,
            reason='range [%d, %d) ends past the end of the file (%d bytes); '
                   'the plugin never changes a disk\'s size here'
                   % (offset, offset + length, fst.st_size))


@prealloc_backend.privsep.ctx.entrypoint
def fallocate_range(path, offset, length):
    """Allocate the blocks of [offset, offset+length) of an instance disk."""
    return unprivileged_fallocate_range(path, offset, length)


def unprivileged_fallocate_range(path, offset, length):
    """Reserve blocks with fallocate(2), keeping the file size.

    Data already in the range is untouched (fallocate only allocates holes,
    as unwritten extents that read as zeros). Raises OSError with EOPNOTSUPP
    where the filesystem cannot do it.
    """
    fd = _open_disk(path)
    try:
        _check_range(fd, path, offset, length)
        fileops.fallocate(fd, offset, length, keep_size=True)
    finally:
        os.close(fd)


@prealloc_backend.privsep.ctx.entrypoint
def zero_fill_range(path, offset, length):
    """Write zeros into the holes of [offset, offset+length) of a disk."""
    return unprivileged_zero_fill_range(path, offset, length)


def unprivileged_zero_fill_range(path, offset, length):
    """Zero-fill the holes of a range; data is never overwritten.

    Returns the number of bytes written.
    """
    fd = _open_disk(path)
    try:
        _check_range(fd, path, offset, length)
        return fileops.zero_fill(fd, offset, offset + length)
    finally:
        os.close(fd)
