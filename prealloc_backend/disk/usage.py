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

"""What the instances filesystem holds: its figures and each disk's, read
through a directory descriptor, with bounded work per disk.

``scan(fd, ...)`` walks the directory ``fd`` (instances_path, opened by
the caller): the filesystem's statvfs; each instance directory (a name
that is a UUID) and its flavor disks (disk, disk.local, disk.eph*,
disk.swap; planner.capacity.disk_group); the base images (``[image_cache]
subdirectory_name``). Every other file counts only through the
filesystem's used blocks.

Per disk it reads what it must and nothing more:

- ``fstat``: its size and allocated blocks (st_blocks);
- its format from nova's record, the directory's disk.info (at most
  DISK_INFO_MAX bytes of it), else the host's format: the header of a disk
  recorded raw is never read (a guest writes a raw disk's first bytes);
- for a qcow2 disk, its first qemu.HEADER bytes, read by
  qemu.ImageInfo.from_header (virtual size, cluster size, backing file or
  not, extended_l2), its magic checked;
- with ``fiemap``, its extent map (FIEMAP, no flush) for the bytes in
  unwritten extents, at most ``max_extents`` extents.

Never the data. Every name is opened relative to its directory's
descriptor without following a symlink (O_NOFOLLOW), regular files only,
O_NONBLOCK, O_NOATIME where the caller may. Whoever calls it runs as the
user it reads as: nova-compute as the nova user; ``prealloc-backend
report`` and ``check`` in a child that dropped to the owner of
instances_path (checks/capacity.py).
"""

import dataclasses
import errno
import json
import os
import stat

from oslo_utils import uuidutils

from prealloc_backend.disk import qemu
from prealloc_backend.planner import capacity
from prealloc_backend.planner import diskplan
from prealloc_backend.system import fileops

DISK_INFO = 'disk.info'
# nova's disk.info holds one short entry per disk.
DISK_INFO_MAX = 64 * 1024
# FIEMAP extents read per disk before the count is given up as partial
# (a 1 TiB disk reserved by fallocate(2) on ext4 is about 8200 extents).
MAX_EXTENTS = 200000

_NOATIME = getattr(os, 'O_NOATIME', 0)
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclasses.dataclass(frozen=True)
class DiskFacts:
    """One flavor disk of an instance directory, as read."""
    instance: str
    name: str
    fmt: str                 # 'qcow2' or 'raw'
    virtual_size: int
    allocated: int           # st_blocks * 512
    size: int                # st_size
    cluster_size: int = None     # qcow2
    extended_l2: bool = False    # qcow2
    backing: bool = False        # qcow2: has a backing file
    unwritten: int = None    # bytes in unwritten extents (fiemap), or None
    partial: bool = False    # unwritten is a lower bound (MAX_EXTENTS)

    @property
    def eventual(self):
        return capacity.eventual_bytes(self.fmt, self.virtual_size,
                                       self.cluster_size, self.extended_l2)

    def use(self):
        return capacity.DiskUse(self.instance, self.name, self.allocated,
                                self.eventual)

    def to_list(self):
        """A compact JSON form (a host may hold thousands)."""
        return [self.instance, self.name, self.fmt, self.virtual_size,
                self.allocated, self.size, self.cluster_size,
                self.extended_l2, self.backing, self.unwritten,
                self.partial]

    @classmethod
    def from_list(cls, values):
        return cls(*values)


@dataclasses.dataclass(frozen=True)
class Scan:
    """What scan() found."""
    fs: capacity.FsFigures
    disks: list
    base_bytes: int = 0          # allocated bytes of the base images
    base_files: int = 0
    # '<uuid>/<name>: why' of each disk that could not be read whole.
    problems: list = dataclasses.field(default_factory=list)

    def to_dict(self):
        return {'fs': [self.fs.size, self.fs.available],
                'disks': [d.to_list() for d in self.disks],
                'base_bytes': self.base_bytes,
                'base_files': self.base_files,
                'problems': self.problems}

    @classmethod
    def from_dict(cls, data):
        return cls(fs=capacity.FsFigures(*data['fs']),
                   disks=[DiskFacts.from_list(d) for d in data['disks']],
                   base_bytes=data['base_bytes'],
                   base_files=data['base_files'],
                   problems=list(data['problems']))


def fs_figures(fd):
    vfs = os.fstatvfs(fd)
    return capacity.FsFigures(size=vfs.f_blocks * vfs.f_frsize,
                              available=vfs.f_bavail * vfs.f_frsize)


def _open(name, dir_fd, flags):
    try:
        return os.open(name, flags | _NOATIME, dir_fd=dir_fd)
    except PermissionError:
        if not _NOATIME:
            raise
        # O_NOATIME needs the file's owner (libvirt gives a running
        # guest's disk to QEMU's user).
        return os.open(name, flags, dir_fd=dir_fd)


def recorded_formats(dir_fd):
    """{disk name: format} of the directory's disk.info (nova's record:
    absolute paths to 'raw' or 'qcow2'), {} when absent or unreadable.
    """
    try:
        fd = _open(DISK_INFO, dir_fd, FILE_FLAGS)
    except OSError:
        return {}
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}
        data = os.read(fd, DISK_INFO_MAX)
    except OSError:
        return {}
    finally:
        os.close(fd)
    try:
        record = json.loads(data or b'{}')
    except (ValueError, RecursionError):
        # Not JSON, or nested past the parser's depth (the nova user
        # writes disk.info).
        return {}
    if not isinstance(record, dict):
        return {}
    return {os.path.basename(str(path)): fmt for path, fmt in record.items()
            if fmt in ('raw', 'qcow2')}


def read_disk(dir_fd, instance, name, fmt, fiemap=False,
              max_extents=MAX_EXTENTS):
    """The DiskFacts of ``name`` in the directory ``dir_fd``, whose
    recorded format is ``fmt``; None when it is not a regular file.
    A qcow2 record whose header is not qcow2 is read as raw (its size).
    """
    fd = _open(name, dir_fd, FILE_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        facts = dict(instance=instance, name=name, fmt='raw',
                     virtual_size=st.st_size, allocated=st.st_blocks * 512,
                     size=st.st_size)
        if fmt == 'qcow2':
            info = qemu.ImageInfo.from_header(
                os.pread(fd, qemu.HEADER, 0))
            if info is not None:
                facts.update(fmt='qcow2', virtual_size=info.virtual_size,
                             cluster_size=info.cluster_size,
                             extended_l2=info.extended_l2,
                             backing=info.has_backing)
        if fiemap:
            try:
                facts['unwritten'] = fileops.unwritten_bytes(
                    fd, st.st_size, max_extents)
            except fileops.ExtentLimit as exc:
                facts.update(unwritten=exc.counted, partial=True)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.ENOTTY):
                    raise
        return DiskFacts(**facts)
    finally:
        os.close(fd)


def stat_only(dir_fd, instance, name):
    """The DiskFacts of a disk this user may not open (a mode 0600 file of
    QEMU's user): its stat alone, counted as a raw file of its size (its
    header unread); None when not a regular file.
    """
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return DiskFacts(instance=instance, name=name, fmt='raw',
                     virtual_size=st.st_size, allocated=st.st_blocks * 512,
                     size=st.st_size)


def _instance_disks(top, entry, host_fmt, fiemap, max_extents, problems):
    try:
        sub = os.open(entry, DIR_FLAGS, dir_fd=top)
    except OSError as exc:
        problems.append('%s: %s' % (entry, exc.strerror or exc))
        return []
    found = []
    try:
        try:
            names = sorted(os.listdir(sub))
        except OSError as exc:
            problems.append('%s: %s' % (entry, exc.strerror or exc))
            return []
        recorded = None
        for name in names:
            if capacity.disk_group(name) is None:
                continue
            if recorded is None:
                recorded = recorded_formats(sub)
            try:
                disk = read_disk(sub, entry, name,
                                 recorded.get(name, host_fmt), fiemap,
                                 max_extents)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    continue   # removed since listed
                problems.append('%s/%s: %s' % (entry, name,
                                               exc.strerror or exc))
                if exc.errno != errno.EACCES:
                    continue
                disk = stat_only(sub, entry, name)
            if disk is not None:
                found.append(disk)
                if disk.partial:
                    problems.append('%s/%s: more than %d extents, unwritten '
                                    'bytes counted in the first ones only'
                                    % (entry, name, max_extents))
    finally:
        os.close(sub)
    return found


def _base_images(top, subdirectory):
    try:
        sub = os.open(subdirectory, DIR_FLAGS, dir_fd=top)
    except OSError:
        return 0, 0
    total = files = 0
    try:
        for name in os.listdir(sub):
            try:
                st = os.stat(name, dir_fd=sub, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_blocks * 512
                files += 1
    finally:
        os.close(sub)
    return total, files


def scan(fd, host_format, base_subdirectory='_base', fiemap=False,
         max_extents=MAX_EXTENTS):
    """The Scan of the instances directory held open as ``fd``.

    ``host_format``: 'qcow2' or 'raw', the format of new disks on this
    host (diskplan.host_disk_format), for disks without a disk.info entry.
    """
    host_format = diskplan.DiskFormat(host_format).value
    before = fs_figures(fd)
    disks, problems = [], []
    base_bytes = base_files = 0
    for entry in sorted(os.listdir(fd)):
        if entry == base_subdirectory:
            base_bytes, base_files = _base_images(fd, entry)
        elif uuidutils.is_uuid_like(entry):
            disks += _instance_disks(fd, entry, host_format, fiemap,
                                     max_extents, problems)
    # A disk made or grown during the walk is in the disks' blocks: the
    # filesystem's figures must count it too (the later reading). A file
    # removed meanwhile leaves the earlier reading the stricter. The one
    # with less available is never looser than what the disks hold.
    figures = min(before, fs_figures(fd), key=lambda f: f.available)
    return Scan(fs=figures, disks=disks, base_bytes=base_bytes,
                base_files=base_files, problems=problems)


def scan_path(path, host_format, **kwargs):
    """scan() of the directory at ``path`` (for the caller's own
    directory: nova-compute's instances_path).
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return scan(fd, host_format, **kwargs)
    finally:
        os.close(fd)
