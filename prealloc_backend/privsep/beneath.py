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

"""Open files beneath a pinned directory, never leaving it.

The privileged daemon pins ``[DEFAULT] instances_path`` once (``Root``): an
``O_PATH`` descriptor of the directory, reached from ``/`` without following
a symlink in any component (``open_absolute_dir``), whose device and inode
are recorded. A disk path is then resolved beneath
that descriptor in one step, by the kernel: ``openat2(2)`` with
``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
RESOLVE_NO_XDEV`` (Linux 5.6+; Python has no wrapper, so the system call is
made through ctypes). Where the kernel lacks it (ENOSYS, or EPERM from a
seccomp filter that does not know it), the path is walked
one component at a time with ``openat(O_PATH | O_NOFOLLOW | O_DIRECTORY)``
from the pinned descriptor, each directory checked to be on the root's
mount. Either way no symlink is followed in any component, no mount point
is crossed and nothing outside the pinned directory is ever reached, however
the nova user renames or replaces directories meanwhile: what the path
names is decided by the descriptors, not by a second look at a string.

Nothing here is privileged; the daemon's entrypoints use it, tests call it
directly (``force_walk`` exercises the fallback on any kernel).
"""

import ctypes
import errno
import os
import platform
import stat

# include/uapi/linux/openat2.h
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE = (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
           RESOLVE_NO_XDEV)
# openat2 has number 437 in the unified system call table of every 64-bit
# architecture nova runs on.
SYS_OPENAT2 = {'x86_64': 437, 'aarch64': 437, 'ppc64le': 437,
               's390x': 437, 'riscv64': 437}.get(platform.machine())

O_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    # struct open_how {u64 flags; u64 mode; u64 resolve;}
    _fields_ = [('flags', ctypes.c_uint64), ('mode', ctypes.c_uint64),
                ('resolve', ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p,
                     ctypes.c_void_p, ctypes.c_size_t]

# Set once openat2 answered ENOSYS: every later call walks.
_openat2_missing = SYS_OPENAT2 is None


class Unusable(Exception):
    """The directory cannot be pinned; str() is the reason."""


def openat2(dirfd, path, flags, resolve, mode=0):
    """openat2(2): return a new descriptor or raise OSError."""
    how = _OpenHow(flags, mode, resolve)
    fd = _syscall(SYS_OPENAT2, dirfd, os.fsencode(path), ctypes.byref(how),
                  ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


def mount_id(fd):
    """The mount id of fd (/proc/self/fdinfo), or None where not shown."""
    try:
        with open('/proc/self/fdinfo/%d' % fd) as f:
            for line in f:
                if line.startswith('mnt_id:'):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _raise(err, name):
    raise OSError(err, os.strerror(err), name)


def _check_same_mount(fd, name, root_dev, root_mnt):
    if os.fstat(fd).st_dev != root_dev:
        _raise(errno.EXDEV, name)
    if root_mnt is not None and mount_id(fd) != root_mnt:
        _raise(errno.EXDEV, name)


def walk(dirfd, parts):
    """Open ``parts`` beneath dirfd one component at a time (``O_PATH``).

    Raises OSError like openat2 with RESOLVE would: ELOOP for a symlink in
    a directory component, EXDEV for a mount crossed, ENOTDIR, ENOENT. The
    last component is opened with O_NOFOLLOW: a symlink there gives a
    descriptor of the link itself, which the caller's type check refuses.
    """
    root_dev = os.fstat(dirfd).st_dev
    root_mnt = mount_id(dirfd)
    current = dirfd
    try:
        for name in parts[:-1]:
            try:
                nxt = os.open(name, O_PATH_FLAGS | os.O_DIRECTORY,
                              dir_fd=current)
            except NotADirectoryError:
                # O_PATH|O_NOFOLLOW|O_DIRECTORY on a symlink: ENOTDIR. Say
                # ELOOP as openat2 does (a race here only changes which
                # refusal is given).
                try:
                    st = os.stat(name, dir_fd=current, follow_symlinks=False)
                except OSError:
                    raise
                if stat.S_ISLNK(st.st_mode):
                    _raise(errno.ELOOP, name)
                raise
            if current != dirfd:
                os.close(current)
            current = nxt
            _check_same_mount(current, name, root_dev, root_mnt)
        fd = os.open(parts[-1], O_PATH_FLAGS, dir_fd=current)
        try:
            _check_same_mount(fd, parts[-1], root_dev, root_mnt)
        except OSError:
            os.close(fd)
            raise
        return fd
    finally:
        if current != dirfd:
            os.close(current)


def open_beneath(dirfd, parts, force_walk=False):
    """An ``O_PATH`` descriptor of ``parts`` (path components, none empty,
    '.' or '..') beneath dirfd, reached without symlinks or mount points.
    """
    global _openat2_missing
    if not parts or any(p in ('', '.', '..') or '/' in p or '\0' in p
                        for p in parts):
        _raise(errno.EINVAL, '/'.join(parts))
    if not (force_walk or _openat2_missing):
        try:
            return openat2(dirfd, '/'.join(parts), O_PATH_FLAGS, RESOLVE)
        except OSError as exc:
            if not _openat2_unavailable(exc):
                raise
            _openat2_missing = True
    return walk(dirfd, parts)


def _openat2_unavailable(exc):
    """ENOSYS: a kernel before 5.6. EPERM: a seccomp profile that does
    not know openat2 (older Docker and podman defaults answer EPERM, not
    ENOSYS); an O_PATH open is never refused EPERM otherwise. Either way
    the walk, just as strict, takes over.
    """
    return exc.errno in (errno.ENOSYS, errno.EPERM)


def open_absolute_dir(path, force_walk=False):
    """An ``O_PATH`` descriptor of the directory at absolute ``path``,
    reached from ``/`` without following a symlink in any component
    (openat2 with RESOLVE_NO_SYMLINKS, or a walk from ``/``); mount points
    may be crossed. Raises OSError (ELOOP for a symlink, ENOTDIR, ENOENT).
    """
    global _openat2_missing
    flags = O_PATH_FLAGS | os.O_DIRECTORY
    if not (force_walk or _openat2_missing):
        try:
            # AT_FDCWD (path is absolute); no O_NOFOLLOW: RESOLVE_NO_SYMLINKS
            # refuses a symlink in the last component too, with ELOOP.
            return openat2(-100, path, flags & ~os.O_NOFOLLOW,
                           RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
        except OSError as exc:
            if not _openat2_unavailable(exc):
                raise
            _openat2_missing = True
    current = os.open('/', flags)
    try:
        for name in [p for p in path.split('/') if p]:
            try:
                nxt = os.open(name, flags, dir_fd=current)
            except NotADirectoryError:
                st = os.stat(name, dir_fd=current, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    _raise(errno.ELOOP, name)
                raise
            os.close(current)
            current = nxt
    except BaseException:
        os.close(current)
        raise
    return current


class Root:
    """A pinned directory: opened once, never looked up by name again.

    ``path`` is the configured string (normalised); ``fd`` an O_PATH
    descriptor of it; ``dev``, ``ino``, ``uid`` (its owner) and ``mnt_id``
    as found when it was pinned.
    """

    def __init__(self, configured, force_walk=False):
        if not isinstance(configured, str) or not configured:
            raise Unusable('it is not set')
        if not os.path.isabs(configured):
            raise Unusable('it is not an absolute path')
        if '\0' in configured:
            raise Unusable('it contains a NUL byte')
        path = os.path.normpath(configured)
        if path.startswith('//'):
            path = '/' + path.lstrip('/')
        if path == '/':
            raise Unusable('it is the root directory /')
        try:
            fd = open_absolute_dir(path, force_walk=force_walk)
        except FileNotFoundError:
            raise Unusable('it does not exist')
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise Unusable('it, or a directory above it, is a symlink; '
                               'set instances_path to the real directory '
                               '(no symlink in any component)')
            if exc.errno == errno.ENOTDIR:
                raise Unusable('it is not a directory')
            raise Unusable('it cannot be opened (%s)' % (
                errno.errorcode.get(exc.errno, exc.errno)))
        try:
            st = os.fstat(fd)
            if stat.S_ISLNK(st.st_mode):
                raise Unusable('it is a symlink; set instances_path to the '
                               'directory itself (its target)')
            if not stat.S_ISDIR(st.st_mode):
                raise Unusable('it is not a directory')
            top = os.stat('/')
            if (st.st_dev, st.st_ino) == (top.st_dev, top.st_ino):
                raise Unusable('it is the root directory /')
        except Exception:
            os.close(fd)
            raise
        self.configured = configured
        self.path = path
        self.fd = fd
        self.dev = st.st_dev
        self.ino = st.st_ino
        self.uid = st.st_uid
        self.mnt_id = mount_id(fd)

    def relative(self, path):
        """The components of ``path`` beneath the root, or ValueError.

        ``path`` must be the configured instances_path string followed by
        '/' and components that are neither empty, '.' nor '..'.
        """
        prefix = self.path.rstrip('/') + '/'
        if not path.startswith(prefix):
            raise ValueError('it is not under instances_path %s' % self.path)
        parts = path[len(prefix):].split('/')
        if any(p in ('', '.', '..') for p in parts):
            raise ValueError("refused: it has an empty, '.' or '..' "
                             "component")
        return parts

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
