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
inside the daemon, whatever the caller checked:

* the daemon pins ``[DEFAULT] instances_path`` as its own configuration
  says, once (``pinned_root``), and resolves every disk path beneath that
  descriptor without following a symlink in any component and without
  crossing a mount (``beneath``);
* what it opened (``O_PATH``, which opens nothing for reading or writing)
  must be a regular file with one link, on the root's filesystem, owned by
  the owner of instances_path (nova's user) or by QEMU's user
  (``[prealloc_backend] qemu_users``), never by root (nor may root own
  instances_path) in the daemon; only then is it reopened for writing;
* sizes and offsets must be integers within the file, and the blocks to
  allocate must fit in what an unprivileged user may still use (f_bavail):
  the daemon never eats the blocks a filesystem reserves for root;
* a disk whose QEMU image lock a running guest holds is never zero-filled,
  and while the daemon zero-fills one it holds the lock bytes that stop a
  QEMU process from opening it for writing.

Refusals are typed (``prealloc_backend.exception``) and say nothing about
what lies outside instances_path beyond "refused". The logic sits in
``unprivileged_*`` functions that tests call directly.
"""

import errno
import os
import pwd
import stat
import sys
import threading

from oslo_log import log as logging

from prealloc_backend import conf
from prealloc_backend import exception
import prealloc_backend.privsep
from prealloc_backend.privsep import beneath
from prealloc_backend.system import fileops

LOG = logging.getLogger(__name__)
CONF = conf.CONF

# Why a path could not be resolved beneath instances_path. Resolution never
# leaves the tree, so each reason is about the tree itself.
_RESOLVE_REASONS = {
    errno.ENOENT: 'it does not exist',
    errno.ELOOP: 'refused: a directory in the path is a symlink',
    errno.EXDEV: 'refused: the path crosses a mount point',
    errno.ENOTDIR: 'refused: a component of the path is not a directory',
    errno.ENAMETOOLONG: 'refused: the path is too long',
}

_root = None
_root_lock = threading.Lock()

# One lock per filesystem (st_dev), held around "check f_bavail, then
# allocate": oslo.privsep serves calls on a thread pool, and two calls that
# both passed the check against the same f_bavail would otherwise both
# allocate, the second one out of root's reserve.
_space_locks = {}
_space_locks_guard = threading.Lock()


def _space_lock(fd):
    dev = os.fstat(fd).st_dev
    with _space_locks_guard:
        return _space_locks.setdefault(dev, threading.Lock())


def pin(configured, root_may_own):
    """The pin rules for instances_path: a beneath.Root of ``configured``,
    or InstancesPathUnusable saying which rule refused it.

    The daemon's ``pinned_root`` and ``prealloc-backend check`` both call
    this, so that the check reports exactly what the daemon does. The
    rules: an absolute path, not '/', every component a real directory (no
    symlink in any component, the last included: it is opened from '/'
    without following any), and not owned by root unless ``root_may_own``
    (never in the daemon: ``_root_may_own``). Nothing is logged here; the
    caller closes the Root it gets.
    """
    try:
        root = beneath.Root(configured)
    except beneath.Unusable as exc:
        raise exception.InstancesPathUnusable(path=configured,
                                              reason=str(exc))
    if root.uid == 0 and not root_may_own:
        root.close()
        raise exception.InstancesPathUnusable(path=configured,
                                              reason=ROOT_OWNED)
    return root


# The reason a root-owned instances_path is refused (pin).
ROOT_OWNED = ('it is owned by root; nova\'s user must own it (the daemon '
              'never works on root\'s files)')


def pinned_root():
    """The daemon's pinned instances_path (a beneath.Root).

    NOTE(oslo.privsep): oslo.privsep gives a context no hook that runs when its
    daemon starts (privsep-helper imports the context's module, which
    nova-compute imports too, then runs the request loop), so the root is
    pinned by the first call that reaches the daemon, under a lock. That first
    call comes from nova-compute right after it started the daemon, and the pin
    is kept for the daemon's life. It is keyed by the configured string: the
    daemon never reloads its configuration, so in the daemon it is pinned
    exactly once; in-process (tests) a test that points instances_path
    elsewhere gets a new pin. If instances_path cannot be pinned (``pin``:
    missing, '/', a symlink, not a directory, root's) every call fails with
    InstancesPathUnusable, logged, and nothing is touched.
    """
    global _root
    with _root_lock:
        configured = CONF.instances_path
        if _root is not None and _root.configured == configured:
            return _root
        try:
            root = pin(configured, _root_may_own())
        except exception.InstancesPathUnusable as exc:
            LOG.error('Refusing to work on instance disks: [DEFAULT] '
                      'instances_path %(path)r cannot be used: %(reason)s',
                      {'path': configured, 'reason': exc.kwargs['reason']})
            raise
        root.allowed_uids = _allowed_uids(root)
        if _root is not None:
            _root.close()
        _root = root
        LOG.info('Pinned instances_path %(path)s (device %(dev)d, inode '
                 '%(ino)d); disks owned by uids %(uids)s are accepted',
                 {'path': root.path, 'dev': root.dev, 'ino': root.ino,
                  'uids': sorted(root.allowed_uids)})
        return root


def in_daemon():
    """True in a privsep daemon (privsep-helper, whose command line always
    names ``--privsep_context``), False when entrypoints run in-process.
    """
    return any(arg == '--privsep_context' or
               arg.startswith('--privsep_context=') for arg in sys.argv)


def _root_may_own():
    """Whether uid 0 may own a disk (or instances_path): only in-process
    when this process is root itself. Its caller then crosses no privilege
    boundary: it could write root's files without the plugin. In the
    daemon, never: its client is nova-compute, and even a configuration
    file of the nova user's choosing (rootwrap's built-in privsep-helper
    rule) must not let it reach root's files.
    """
    return not in_daemon() and os.geteuid() == 0


def _allowed_uids(root):
    """uids that may own a disk: the owner of instances_path (nova's user:
    nova creates the instance directories and disks) and QEMU's user, to
    which libvirt's dynamic_ownership gives a running guest's disks. Never
    uid 0 in the daemon (``_root_may_own``).

    NOTE(oslo.privsep): the client's uid (SO_PEERCRED on the privsep socket)
    would be a better anchor than the owner of instances_path, but oslo.privsep
    gives an entrypoint no access to its channel's socket (only a scan of
    /proc/self/fd could find it). The owner of instances_path is not chosen by
    a configuration file alone: root-owned directories are refused when pinned.
    """
    uids = {root.uid}
    for name in CONF.prealloc_backend.qemu_users:
        try:
            uid = pwd.getpwnam(name).pw_uid
        except KeyError:
            continue
        uids.add(uid)
    if not _root_may_own():
        uids.discard(0)
    return uids


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


def _check_disk(path, st, root):
    """Refuse anything but a regular, singly linked file of nova's (or
    QEMU's) on the root's filesystem.
    """
    if stat.S_ISLNK(st.st_mode):
        raise exception.InvalidPath(path=path, reason='it is a symlink')
    if not stat.S_ISREG(st.st_mode):
        raise exception.InvalidPath(path=path,
                                    reason='it is not a regular file')
    if st.st_dev != root.dev:
        raise exception.InvalidPath(
            path=path, reason='refused: it is on another filesystem than '
                              'instances_path')
    if st.st_nlink != 1:
        # nova never hard-links disks; a second link could be a file
        # outside the tree.
        raise exception.InvalidPath(
            path=path, reason='it has %d hard links (a disk has one)'
                              % st.st_nlink)
    if st.st_uid not in root.allowed_uids:
        if st.st_uid == 0:
            raise exception.DiskOwnedByRoot(path=path)
        raise exception.InvalidPath(
            path=path, reason='it is owned by uid %d, neither the owner of '
                              'instances_path (uid %d) nor QEMU\'s user '
                              '([prealloc_backend] qemu_users)'
                              % (st.st_uid, root.uid))


def _open_disk(path):
    """Open path for writing after checking it is a disk we may touch.

    Returns the fd; the caller closes it. The file is found beneath the
    pinned instances_path (``beneath.open_beneath``) as an ``O_PATH``
    descriptor, checked with fstat, and only then reopened for writing
    through /proc/self/fd (the descriptor itself, not a path: nothing can
    be swapped in between; O_NOFOLLOW cannot be given there, it would
    refuse the magic link itself). The reopened descriptor must be the
    same file.
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
    root = pinned_root()
    try:
        parts = root.relative(path)
    except ValueError as exc:
        raise exception.InvalidPath(path=path, reason=str(exc))
    try:
        pfd = beneath.open_beneath(root.fd, parts)
    except OSError as exc:
        raise exception.InvalidPath(
            path=path, reason=_RESOLVE_REASONS.get(
                exc.errno, 'refused: it cannot be resolved beneath '
                           'instances_path (%s)'
                           % errno.errorcode.get(exc.errno, exc.errno)))
    try:
        st = os.fstat(pfd)
        _check_disk(path, st, root)
        try:
            fd = os.open('/proc/self/fd/%d' % pfd,
                         os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC |
                         os.O_NOCTTY)
        except OSError as exc:
            raise exception.InvalidPath(
                path=path, reason='it cannot be opened for writing (%s)'
                                  % errno.errorcode.get(exc.errno,
                                                        exc.errno))
    finally:
        os.close(pfd)
    try:
        fst = os.fstat(fd)
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            raise exception.InvalidPath(
                path=path, reason='refused: it changed while being opened')
        _check_disk(path, fst, root)
    except Exception:
        os.close(fd)
        raise
    return fd


def _free_bytes(fd):
    """What an unprivileged user may still allocate (never root's
    reserved blocks).
    """
    vfs = os.fstatvfs(fd)
    return vfs.f_bavail * vfs.f_frsize


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


def _check_space(fd, path, offset, length):
    """Refuse an allocation larger than what an unprivileged user could
    still use; return the bytes it needs.
    """
    needed = length - fileops.allocated_bytes(fd, offset, offset + length)
    free = _free_bytes(fd)
    if needed > free:
        raise exception.AllocationOutOfSpace(path=path, needed=needed,
                                             free=free)
    return needed


def _space_error(exc, path, needed, fd):
    """A typed error for ENOSPC/EDQUOT met inside the daemon."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return exception.AllocationOutOfSpace(path=path, needed=needed,
                                              free=_free_bytes(fd))
    return None


@prealloc_backend.privsep.ctx.entrypoint
def fallocate_range(path, offset, length):
    """Allocate the blocks of [offset, offset+length) of an instance disk."""
    return unprivileged_fallocate_range(path, offset, length)


def unprivileged_fallocate_range(path, offset, length):
    """Reserve blocks with fallocate(2), keeping the file size.

    Data already in the range is untouched (fallocate only allocates holes,
    as unwritten extents that read as zeros), so a disk in use may be
    allocated. Raises OSError with EOPNOTSUPP where the filesystem cannot
    do it, InsufficientDiskSpace when the blocks are not there for an
    unprivileged user.
    """
    fd = _open_disk(path)
    try:
        _check_range(fd, path, offset, length)
        needed = length
        try:
            with _space_lock(fd):
                needed = _check_space(fd, path, offset, length)
                fileops.fallocate(fd, offset, length, keep_size=True)
        except OSError as exc:
            if fileops.is_unsupported(exc):
                raise
            typed = _space_error(exc, path, needed, fd)
            if typed is not None:
                raise typed
            raise exception.AllocationFailed(
                path=path, reason='fallocate: %s' % os.strerror(exc.errno))
        # The reservation reaches the device before the caller removes
        # the disk's journal: a power cut must not leave a disk recorded
        # as allocated sparse again (the nova user may not open it to
        # flush it: libvirt gave it to the qemu user).
        os.fdatasync(fd)
    finally:
        os.close(fd)


@prealloc_backend.privsep.ctx.entrypoint
def zero_fill_range(path, offset, length):
    """Write zeros into the holes of [offset, offset+length) of a disk."""
    return unprivileged_zero_fill_range(path, offset, length)


def _lock_against_qemu(fd, path):
    """Hold the lock bytes a QEMU process must be able to take to open the
    disk for writing, then refuse if a QEMU process already holds them.

    QEMU applies its locks, then tests the other side's bytes; doing the
    same, whichever of the two comes second sees the other. Held through
    fd's open file description until it is closed.
    """
    for byte in (fileops.QEMU_WRITER_BYTE, fileops.QEMU_NO_OTHER_WRITER_BYTE):
        fileops.ofd_lock_shared(fd, byte)
    for byte, what in ((fileops.QEMU_WRITER_BYTE, 'it is open for writing'),
                       (fileops.QEMU_NO_OTHER_WRITER_BYTE,
                        'it refuses other writers')):
        if fileops.ofd_lock_held(fd, byte):
            raise exception.DiskInUse(path=path,
                                      lock='lock byte %d: %s' % (byte, what))


def unprivileged_zero_fill_range(path, offset, length):
    """Zero-fill the holes of a range; data is never overwritten.

    Refused while a QEMU process holds the disk's image lock; while it
    runs, no QEMU process can open the disk for writing. Returns the number
    of bytes written.
    """
    fd = _open_disk(path)
    try:
        _check_range(fd, path, offset, length)
        try:
            _lock_against_qemu(fd, path)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise exception.AllocationFailed(
                    path=path, reason='locking the image: %s'
                                      % os.strerror(exc.errno))
            # Someone holds a write lock on one of QEMU's bytes.
            raise exception.DiskInUse(path=path,
                                      lock='a write lock on its lock bytes')
        needed = _check_space(fd, path, offset, length)
        state = {'left': needed}

        def before_write(count):
            # Called under the filesystem's space lock, before every write
            # (at most fileops.ZERO_CHUNK bytes): the fill stops before it
            # would reach root's blocks, not one chunk after.
            free = _free_bytes(fd)
            if count > free:
                # Others used the space meanwhile: stop before root's.
                raise exception.AllocationOutOfSpace(
                    path=path, needed=state['left'], free=free)
            state['left'] = max(0, state['left'] - count)

        try:
            written = fileops.zero_fill(fd, offset, offset + length,
                                        before_write=before_write,
                                        lock=_space_lock(fd))
            # As in unprivileged_fallocate_range: on the device before the
            # caller's journal goes.
            os.fdatasync(fd)
            return written
        except fileops.SizeChanged as exc:
            raise exception.DiskChangedDuringFill(
                path=path, before=exc.before, after=exc.after,
                written=exc.written)
        except OSError as exc:
            typed = _space_error(exc, path, state['left'], fd)
            if typed is not None:
                raise typed
            raise exception.AllocationFailed(
                path=path, reason='zero-fill: %s' % os.strerror(exc.errno))
    finally:
        os.close(fd)
