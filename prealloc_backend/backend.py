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

"""The image backend: nova's Flat and Qcow2, preallocating.

Every file disk nova's libvirt driver creates or grows goes through
``Image.cache()`` (root, ephemeral, swap, rescue, unshelve, rebuild, hard
reboot, resize and migration targets). The subclasses here:

* create qcow2 overlays themselves, with extended_l2, a cluster size chosen
  for the disk and ``preallocation=`` for the mode, into a temporary file
  renamed into place only when complete;
* grow qcow2 disks with ``qemu-img resize --preallocation``;
* allocate raw disks after nova made them (fallocate, or zero-fill of the
  holes), through the plugin's privsep daemon;
* switch off nova's own ``fallocate -n`` step (``self.preallocate``), which
  inflates metadata-mode overlays to full allocation;
* add ``<metadata_cache>`` to qcow2 disks in the guest XML;
* keep a journal file beside a disk while it is being made, so that a
  creation interrupted by a crash is removed, not reused, next time.

LVM, RBD and ploop keep nova's classes and behaviour.

This module is the adapter only: nova calls in, one DiskPlan is made per
disk operation (``_plan``: the flavor read there, the filesystem probed
unless the mode is none) and executors carry it out: allocate.py (the
blocks of a raw file), qcow2.py (overlays, growth), journal.py (the crash
journal), qemu.py (qemu-img).

A disk's format comes from nova's records, never from its header alone (a
guest writes the first bytes of a raw disk): the source host's domain XML
during a migration (``migration_formats``), else nova's disk.info, else
the backend that made the disk. The header is read (format_inspector, no
qemu-img) only to refuse a disk whose header and record disagree, and a
qcow2 disk is checked (``check_qcow2_disk``) before any qemu-img command
other than ``info -f qcow2`` runs on it. Everything here runs as the
nova-compute user; only allocate.py's calls go to the privileged daemon.
"""

import contextlib
import json
import os
import threading

from nova.compute import task_states
from nova import exception as nova_exception
from nova import utils as nova_utils
from nova.virt.disk import api as disk_api
from nova.virt.disk.mount import api as mount
from nova.virt.image import model as imgmodel
from nova.virt import images
from nova.virt.libvirt import imagebackend
from oslo_concurrency import processutils
from oslo_log import log as logging
from oslo_utils import fileutils
from oslo_utils.imageutils import format_inspector

from prealloc_backend import allocate
from prealloc_backend import conf
from prealloc_backend import exception
from prealloc_backend import fsprobe
from prealloc_backend import guestxml
from prealloc_backend import journal
from prealloc_backend import modes
from prealloc_backend import policy
from prealloc_backend import process
from prealloc_backend import qcow2
from prealloc_backend import qemu

LOG = logging.getLogger(__name__)
CONF = conf.CONF

JOURNAL_SUFFIX = journal.JOURNAL_SUFFIX
TMP_SUFFIX = journal.TMP_SUFFIX
_Journal = journal.Journal
# Disks made by Flat that are not instance disks: nothing to allocate.
NOT_DISKS = ('kernel', 'ramdisk')

_not_applied_lock = threading.Lock()
_not_applied_logged = set()

# Header formats (format_inspector's names) that are raw data for QEMU.
RAW_HEADERS = ('raw', 'gpt', 'iso')
# Formats the plugin grows and allocates.
FORMATS = {'raw': policy.DiskFormat.RAW, 'qcow2': policy.DiskFormat.QCOW2}
# qemu-img's names of format_inspector's formats, where they differ.
QEMU_NAMES = {'vhd': 'vpc'}
# Formats a qcow2 instance disk's backing file may have.
BACKING_FORMATS = ('raw', 'qcow2')

# The formats the source host's domain XML gave the disks of the instance
# whose migration this thread is finishing (see migration_formats).
_migration = threading.local()


@contextlib.contextmanager
def migration_formats(instance_uuid, formats):
    """While the block runs in this thread, ``formats`` ({disk file name:
    format}) is the record of the disks of ``instance_uuid``: what the
    source host's domain XML said (finish_migration's disk_info), the
    format QEMU opened each disk with there. It wins over disk.info, which
    a move can leave stale or lose.
    """
    previous = getattr(_migration, 'record', None)
    _migration.record = (instance_uuid, dict(formats))
    try:
        yield
    finally:
        _migration.record = previous


def _migration_format(path):
    record = getattr(_migration, 'record', None)
    if not record:
        return None
    uuid, formats = record
    if os.path.basename(os.path.dirname(path)) != uuid:
        return None
    return formats.get(os.path.basename(path))


def converted(path, fmt):
    """nova converted the disk at ``path`` to ``fmt`` while a migration is
    finished here: the record says so from now on (disk.info, and the
    migration's record for the rest of the move).
    """
    record = getattr(_migration, 'record', None)
    if record and os.path.basename(os.path.dirname(path)) == record[0]:
        record[1][os.path.basename(path)] = fmt
    record_format(path, fmt)


def header_format(path):
    """The format a disk's header claims (format_inspector's name, 'raw'
    when nothing matches): read, never believed alone. No qemu-img runs.
    """
    try:
        inspector = format_inspector.detect_file_format(path)
    except format_inspector.ImageFormatError as exc:
        return 'ambiguous (%s)' % exc
    return str(inspector) if inspector is not None else 'raw'


def _is_raw_header(header):
    return header in RAW_HEADERS


def cache_dir():
    """nova's image cache directory of this host's instances_path."""
    return os.path.join(CONF.instances_path,
                        CONF.image_cache.subdirectory_name)


def _refuse(path, reason):
    raise exception.UnsafeDiskHeader(path=path, reason=reason,
                                     cache_dir=cache_dir())


def _no_data_file(disk, path, what):
    """Refuse a qcow2 file whose header names a data-file (read with
    format_inspector, before qemu-img opens it and the data-file with it).
    """
    inspector = format_inspector.QcowInspector()
    with open(path, 'rb') as f:
        inspector.eat_chunk(f.read(64 * 1024))
    if not inspector.format_match:
        _refuse(disk, '%s is not a qcow2 file' % what)
    # NOTE: not check_unknown_features: oslo.utils counts extended_l2
    # (incompatible feature bit 4, the plugin's overlays) as unknown.
    try:
        inspector.check_data_file()
    except format_inspector.SafetyViolation as exc:
        _refuse(disk, '%s: %s' % (what, exc))


def check_qcow2_disk(path):
    """Refuse (UnsafeDiskHeader, an InvalidDiskInfo) the qcow2 instance
    disk at ``path`` unless it has no data-file and its backing file, if
    any, resolves beneath this instances_path's image cache directory, is
    a raw or qcow2 regular file of that format, with neither a backing file
    nor a data-file of its own. Only ``qemu-img info -f`` runs, after
    format_inspector found no data-file.

    Returns (the backing file's absolute name or None, its format or
    None).
    """
    _no_data_file(path, path, 'the disk')
    info = qemu.info(path, 'qcow2')
    specific = info.get('format-specific', {}).get('data', {})
    if specific.get('data-file'):
        _refuse(path, 'it has data-file %r' % specific['data-file'])
    named = info.get('backing-filename')
    if not named:
        return None, None
    for name in (named, info.get('full-backing-filename') or ''):
        # NOTE: qemu reads a name with a ':' before its first '/' as a
        # protocol (http:, nbd:, ssh:, json:{...}), not a file: the host
        # would fetch what a guest-written header names. nova's image cache
        # names never hold one.
        if ':' in name:
            _refuse(path, 'backing file %r is not a plain file name' % name)
    # qemu resolves a relative name against the disk's directory; realpath
    # of the joined name resolves '..' after symlinks, as the kernel does
    # (abspath would drop 'x/..' by text first).
    backing = os.path.realpath(os.path.join(os.path.dirname(path), named))
    root = os.path.realpath(cache_dir())
    if (os.path.commonpath([root, backing]) != root or backing == root or
            not os.path.isfile(backing)):
        _refuse(path, 'backing file %r is not a file beneath %s'
                % (named, root))
    backing_fmt = info.get('backing-filename-format')
    if backing_fmt is None:
        # An overlay made before nova recorded the backing format (it
        # does since Wallaby): the format of nova's own cache file, read
        # from that file, which its guest cannot write.
        backing_fmt = header_format(backing)
        if _is_raw_header(backing_fmt):
            backing_fmt = 'raw'
    if backing_fmt not in BACKING_FORMATS:
        _refuse(path, 'backing file %r has format %r, not raw or qcow2'
                % (named, backing_fmt))
    if backing_fmt == 'qcow2':
        _no_data_file(path, backing, 'backing file %s' % backing)
        base_info = qemu.info(backing, 'qcow2')
        base_specific = base_info.get('format-specific', {}).get('data', {})
        if base_info.get('backing-filename') or base_specific.get(
                'data-file'):
            _refuse(path, 'backing file %s has a backing file or data-file '
                          'of its own' % backing)
    return backing, backing_fmt


def record_format(path, fmt):
    """Record ``fmt`` as the format of ``path`` in its directory's
    disk.info (nova's record), replacing any entry it had: written to a
    temporary file renamed into place, as nova writes it.
    """
    disk_info_path = os.path.join(os.path.dirname(path), 'disk.info')
    lock_path = os.path.join(CONF.instances_path, 'locks')

    @nova_utils.synchronized(disk_info_path, external=False,
                             lock_path=lock_path)
    def write():
        try:
            with open(disk_info_path) as f:
                dct = json.loads(f.read() or '{}')
        except FileNotFoundError:
            dct = {}
        except ValueError:
            raise nova_exception.InvalidDiskInfo(
                reason='%s is not JSON' % disk_info_path)
        if dct.get(path) == fmt:
            return
        dct[path] = fmt
        tmp = disk_info_path + '.tmp'
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        with os.fdopen(fd, 'w') as f:
            f.write('%s\n' % json.dumps(dct))
        os.rename(tmp, disk_info_path)

    write()


def _extra_specs(instance):
    """The instance's flavor extra specs; {} when there is no instance.

    NOTE: read only when the caller loaded the flavor
    (``obj_attr_is_set``): reading ``instance.flavor`` otherwise makes
    nova lazy-load it from the database, which fails with
    OrphanedObjectError on an instance without a context. Every nova path
    that creates or grows a disk (spawn, rebuild, unshelve, resize,
    migration, hard reboot, rescue) passes an instance with its flavor.
    """
    if instance is None:
        return {}
    try:
        if not instance.obj_attr_is_set('flavor'):
            return {}
        return dict(instance.flavor.extra_specs or {})
    except (AttributeError, NotImplementedError,
            nova_exception.ObjectActionError):
        return {}


def _make_plan(extra_specs, path, fmt, virtual_size, existing=None,
               backing=True, directory=None):
    """(DiskPlan, filesystem facts or None) of a disk at ``path``: the one
    place the backend asks policy.make_plan, probing the filesystem of
    ``directory`` (default: the disk's) unless the mode is none.
    """
    mode = policy.disk_mode(extra_specs, modes.host_mode(CONF))
    fs = None
    if mode is not modes.Mode.NONE:
        fs = fsprobe.facts(directory or os.path.dirname(path))
    plan = policy.make_plan(CONF.prealloc_backend, extra_specs, mode, fmt,
                            virtual_size, fs, backing=backing,
                            existing=existing, path=path)
    return plan, fs


def plan_new_disk(instance, path, fmt, virtual_size, backing=True,
                  directory=None):
    """The DiskPlan of a new disk this host would make at ``path`` (what
    cache() plans for it), without making it and without raising for
    space: ``fits`` and ``to_allocate`` say. For the checks a migration's
    destination makes before anything moves; ``directory`` names the
    filesystem to probe while the disk's own directory does not exist yet.
    """
    plan, _fs = _make_plan(_extra_specs(instance), path, fmt, virtual_size,
                           backing=backing, directory=directory)
    return plan


def _flushed(fetch_func):
    """fetch_func, then the file it wrote flushed to disk.

    NOTE: nova copies a raw base into the instance disk with cp, which
    finds data with SEEK_DATA. On ext4 without extents (kernel 6.18,
    coreutils 9.1 seen here) SEEK_DATA misses data not yet written back,
    so cp copies it as holes: the disk silently lacks part of its image.
    nova does not flush a download; flushing it costs one fsync.
    """
    def fetch(*args, **kwargs):
        fetch_func(*args, **kwargs)
        target = kwargs.get('target')
        if target and os.path.isfile(target):
            fd = os.open(target, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    return fetch


class _PreallocImage:
    """What Flat and Qcow2 share: the mode, the journal, the guest XML."""

    def _init_prealloc(self, instance):
        # Records its arguments only, as nova's constructors do: the
        # flavor is read and the plan made when a disk is created or
        # grown (see cache()), never here.
        self._prealloc_instance = instance
        self._extra = None
        self._new_disk = False
        # nova's Image.cache() runs 'fallocate -n' on every sized call when
        # this is set: never on our disks, which we allocate ourselves.
        self.preallocate = False

    @property
    def prealloc_mode(self):
        """The mode of this disk's current operation."""
        return policy.disk_mode(self._extra_specs(), modes.host_mode(CONF))

    def _extra_specs(self):
        if self._extra is None:
            self._extra = _extra_specs(self._prealloc_instance)
        return self._extra

    @property
    def _opts(self):
        return CONF.prealloc_backend

    def _plan(self, fmt, virtual_size, existing=None, backing=True):
        """The disk plan of this operation (the flavor read once per
        cache() call); probes the filesystem unless the mode is none.
        """
        plan, fs = _make_plan(self._extra_specs(), self.path, fmt,
                              virtual_size, existing=existing,
                              backing=backing)
        if plan.warning:
            LOG.warning('%(path)s: %(warning)s',
                        {'path': self.path, 'warning': plan.warning})
        if not plan.fits:
            raise exception.InsufficientDiskSpace(
                path=self.path, needed=plan.to_allocate,
                free=fs.free_bytes, directory=os.path.dirname(self.path))
        return plan

    def _existing(self, fmt):
        """The ExistingDisk of this raw file as it is now."""
        st = os.stat(self.path)
        return policy.ExistingDisk(allocated_bytes=st.st_blocks * 512,
                                   virtual_size=st.st_size)

    # The format of the disks this backend makes (its record of a disk
    # nova's disk.info and the migration do not name).
    MADE_AS = None
    # True while cache() makes this disk (see _get_driver_format).
    _new_disk = False

    def _recorded_format(self):
        """(format, where it is recorded) of this disk by nova's records:
        the source host's domain XML while a migration is finished here,
        nova's disk.info, else the format this backend makes.
        """
        fmt = _migration_format(self.path)
        if fmt:
            return fmt, 'the source host\'s domain XML'
        fmt = self._disk_info_format()
        if fmt:
            return fmt, self.disk_info_path
        return self.MADE_AS, 'the %s backend that made it' % self.MADE_AS

    def _disk_format(self):
        """The DiskFormat of this existing disk by its record; refused when
        the header disagrees (DiskFormatMismatch) and, for qcow2, unless
        check_qcow2_disk passes.

        A disk recorded raw is raw whatever its first bytes say: they are
        its guest's data (nova's Flat, since CVE-2026-24708, runs qemu-img
        on it with ``-f raw`` too).
        """
        recorded, source = self._recorded_format()
        if recorded not in FORMATS:
            raise nova_exception.InvalidDiskFormat(disk_format=recorded)
        if recorded == 'raw':
            # Not even read: whatever the first bytes say is data.
            return policy.DiskFormat.RAW
        header = header_format(self.path)
        if header != recorded:
            raise exception.DiskFormatMismatch(
                path=self.path, recorded=recorded, source=source,
                header=header)
        check_qcow2_disk(self.path)
        return policy.DiskFormat.QCOW2

    def _existing_format(self):
        """_disk_format of a disk that already holds a guest's data (a hard
        reboot, a migration's arrival), or None where it is refused: the
        refusal is logged, the plugin runs nothing more on the disk (it is
        left as it is, not allocated), and the instance's start is never
        failed for it. Growing or converting it still raises.
        """
        try:
            return self._disk_format()
        except (exception.UnsafeDiskHeader,
                exception.DiskFormatMismatch) as exc:
            LOG.warning('%(path)s left as it is, not allocated: %(err)s',
                        {'path': self.path, 'err': exc.format_message()})
            return None

    def resolve_driver_format(self):
        # NOTE: nova reads disk.info first and only asks
        # _get_driver_format for a disk it does not list. While a migration
        # is finished here the source's domain XML is the record: it wins,
        # and replaces what disk.info said (a move can leave it stale: a
        # disk converted to qcow2 stays 'raw' there, nova never rewrites an
        # entry).
        fmt = _migration_format(self.path)
        if fmt and self.disk_info_path and os.path.exists(self.path):
            header = header_format(self.path)
            if fmt != 'raw' and header != fmt:
                raise exception.DiskFormatMismatch(
                    path=self.path, recorded=fmt,
                    source='the source host\'s domain XML', header=header)
            record_format(self.path, fmt)
            return fmt
        return super().resolve_driver_format()

    def _get_driver_format(self):
        """A disk disk.info does not list: never its header's word.

        NOTE: nova's Flat asks ``qemu-img info`` without ``-f`` here and
        records what the header says (nova bug 1221190's class): a raw
        disk whose guest wrote a qcow2 header would be handed to QEMU as
        qcow2, its backing file read for the guest.
        """
        if self.MADE_AS != 'raw' or not os.path.exists(self.path):
            # nova's Qcow2: its own format (a disk recorded otherwise, or
            # whose header disagrees, is refused by _disk_format when it
            # is grown or allocated).
            return super()._get_driver_format()
        header = header_format(self.path)
        if _is_raw_header(header):
            return 'raw'
        if self._new_disk and header in FORMATS:
            # Just made by this cache() call, a copy of a base nova checked
            # against its image (fetch_to_raw) before any guest ran on it:
            # a qcow2 image kept qcow2 (force_raw_images = False).
            return header
        # No record but the backend's: raw. Not refused: this runs
        # wherever nova builds the guest's XML (hard reboot, start), where
        # an error would put an existing instance in ERROR.
        LOG.warning('%(path)s is not in disk.info and its header says '
                    '%(hdr)s: handled as raw, the format of the disks the '
                    'raw backend makes (a header is its guest\'s data, never '
                    'a record); if this disk really is %(hdr)s, record it '
                    'in %(info)s',
                    {'path': self.path, 'hdr': header,
                     'info': self.disk_info_path})
        return 'raw'

    def _disk_info_format(self):
        try:
            with open(self.disk_info_path) as f:
                return json.loads(f.read() or '{}').get(self.path)
        except (OSError, TypeError, ValueError, AttributeError):
            return None

    def cache(self, fetch_func, filename, size=None, safe=False, *args,
              **kwargs):
        fileutils.ensure_tree(os.path.dirname(self.path))
        self._extra = None  # read the flavor once for this operation
        journal = _Journal(self.path)
        journal.recover()
        created = not self.exists()
        if created:
            self._check_space_for_new_disk(size)
        journal.begin(created)
        self._new_disk = created
        try:
            super().cache(_flushed(fetch_func), filename, size, safe, *args,
                          **kwargs)
            self._new_disk = False
            self._allocate_existing(created)
        except BaseException:
            self._new_disk = False
            if created and self.exists():
                LOG.warning('Removing %(path)s: creating it failed',
                            {'path': self.path})
                fileutils.delete_if_exists(self.path)
            fileutils.delete_if_exists(self.path + TMP_SUFFIX)
            journal.end()
            raise
        journal.end()

    def _allocate_copied_qcow2(self):
        """Bring an existing qcow2 file (a Qcow2 disk, or a qcow2 disk on a
        raw host's Flat) to this host's mode after nova copied it.
        """
        # NOTE: nova copies the disks of a resized or cold-migrated
        # instance with 'cp -r' (same host or shared storage) or 'rsync
        # --sparse': the blocks preallocation=falloc reserved come out as
        # holes, while the qcow2 metadata still maps every cluster (seen
        # under real libvirt: a 1 GiB space overlay resized to 2 GiB kept
        # only the new GiB allocated). Reserve the file's blocks again as
        # for a raw file; a disk this plugin just made has no holes.
        if self.prealloc_mode in (modes.Mode.SPACE, modes.Mode.FULL):
            self._allocate_file(created=False)
        elif (self.prealloc_mode == modes.Mode.METADATA and
              self._finishing_migration()):
            self._thin_copied_zeros()

    def _finishing_migration(self):
        instance = self._prealloc_instance
        # Never a hidden lazy-load (an instance without a context raises).
        return (instance is not None and
                getattr(instance, 'obj_attr_is_set', None) is not None and
                instance.obj_attr_is_set('task_state') and
                instance.task_state == task_states.RESIZE_FINISH)

    def _thin_copied_zeros(self):
        """A metadata-mode disk that arrived on this host fully written.

        NOTE: nova's default transport (``[libvirt]
        remote_filesystem_transport = ssh``: scp, SshDriver in
        nova/virt/libvirt/volume/remotefs.py) writes every
        byte of a cold-migrated disk, zeros included, so a metadata overlay
        (mapped clusters, no data blocks) arrives fully allocated. Punch
        holes where whole blocks read as zeros (util-linux ``fallocate
        --dig-holes``): what the guest reads is unchanged (a hole reads as
        zeros, the qcow2 metadata keeps every cluster mapped), the disk is
        what metadata preallocation makes. Only in finish_migration, where
        the copy just happened: it reads the whole file.
        """
        st = os.stat(self.path)
        before = st.st_blocks * 512
        if before <= st.st_size // 2:
            return
        try:
            process.execute('fallocate', '--dig-holes', self.path)
        except exception.PreallocError as exc:
            # Only makes the disk thinner: never fails the migration.
            LOG.warning('%(path)s arrived fully written; punching holes '
                        'where it reads zeros failed, left as it is: '
                        '%(error)s', {'path': self.path, 'error': exc})
            return
        LOG.info('%(path)s arrived fully written (a full copy): holes '
                 'punched where it read zeros for mode metadata, %(before)d '
                 'then %(after)d bytes allocated',
                 {'path': self.path, 'before': before,
                  'after': os.stat(self.path).st_blocks * 512})

    def _check_space_for_new_disk(self, size):
        """Hook: fail early when a disk about to be made cannot fit."""

    def _allocate_existing(self, created):
        """Hook: allocate the blocks of the disk as it now is."""

    def _allocate_file(self, created):
        """Allocate the holes of the file as it is now, as the plan says
        (allocate.py). A disk that existed before is planned as such: never
        failed for space, left thin.
        """
        existing = (None if created else
                    self._existing(policy.DiskFormat.RAW))
        size = os.stat(self.path).st_size

        def replan():
            return self._plan(policy.DiskFormat.RAW, size, existing=existing)

        allocate.allocate_file(
            self.path, replan(), replan, created, self._opts,
            check_cancelled=lambda: allocate.check_not_deleted(
                self._prealloc_instance, self.path))

    def _grow(self, size):
        """Grow the disk to ``size`` in its recorded format (raw or qcow2,
        see _disk_format), preallocating as planned; then the guest
        filesystem where nova would resize it.
        """
        try:
            fmt = self._disk_format()
        except (exception.UnsafeDiskHeader,
                exception.DiskFormatMismatch):
            # nova's cache() asks every existing disk to grow to its
            # flavor's size (a hard reboot too): one already that large is
            # left as it is (logged), never failing the instance's start;
            # growing a refused disk is refused.
            if self._virtual_size_unchecked() >= size:
                self._existing_format()
                return
            raise
        if fmt is policy.DiskFormat.RAW:
            _grow_raw(self.path, size)
            return
        if self._grow_qcow2(size) and CONF.resize_fs_using_block_device:
            _resize_fs_like_nova(self.path)

    def _virtual_size_unchecked(self):
        """The size a refused disk shows its guest: a qcow2 header's
        virtual size (read with format_inspector: no qemu-img, which would
        open a data-file), else the file's size.
        """
        inspector = format_inspector.QcowInspector()
        with open(self.path, 'rb') as f:
            inspector.eat_chunk(f.read(64 * 1024))
        if inspector.format_match:
            return inspector.virtual_size
        return os.stat(self.path).st_size

    def _grow_qcow2(self, size):
        """Grow a qcow2 file (checked by _disk_format) to ``size``,
        preallocating the new area.
        """
        existing, info = qcow2.existing(self.path)
        if size <= existing.virtual_size:
            return False
        if (info.get('backing-filename') and not existing.extended_l2 and
                self.prealloc_mode is not modes.Mode.NONE and
                self._opts.qcow2_extended_l2):
            self._relayout_overlay(existing.virtual_size)
            existing, info = qcow2.existing(self.path)
        plan = self._plan(policy.DiskFormat.QCOW2, size, existing=existing,
                          backing=bool(info.get('backing-filename')))
        qcow2.grow(self.path, existing.virtual_size, plan,
                   timeout=self._opts.allocation_timeout)
        return True

    def _relayout_overlay(self, virtual_size):
        """Rewrite an overlay without extended_l2 (stock nova's, or the
        plugin's mode none) with this mode's layout, before it grows.

        QEMU cannot preallocate an overlay with a backing file without
        extended_l2, so a disk made in mode none and resized to a flavor
        asking for metadata, space or full would stay thin. ``qemu-img
        convert -B`` writes the overlay's own data into a new overlay of the
        same backing file (what the guest reads is unchanged: checked with
        ``qemu-img compare`` before the rename), made with the plan's
        cluster size, extended_l2 and preallocation. Only while nova grows a
        disk (resize, spawn), never under a running guest.
        """
        plan = self._plan(policy.DiskFormat.QCOW2, virtual_size)
        # The backing file as check_qcow2_disk resolved and checked it,
        # never as read from the header again.
        backing, backing_fmt = check_qcow2_disk(self.path)
        if ',' in backing or ',' in backing_fmt:
            LOG.warning('%(path)s: backing file %(backing)r has a comma: '
                        'not rewritten, grown without preallocation',
                        {'path': self.path, 'backing': backing})
            return
        tmp = self.path + TMP_SUFFIX
        with fileutils.remove_path_on_error(tmp):
            qemu.execute(
                'convert', '-f', 'qcow2', '-O', 'qcow2', '-B', backing,
                '-F', backing_fmt, '-o',
                'cluster_size=%d,extended_l2=on,preallocation=%s' % (
                    plan.cluster_size, plan.preallocation.value),
                self.path, tmp, heavy=True,
                timeout=self._opts.allocation_timeout or None, path=tmp)
            qemu.execute('compare', '-f', 'qcow2', '-F', 'qcow2',
                         self.path, tmp, heavy=True, path=tmp)
            os.rename(tmp, self.path)
        LOG.info('Rewrote %(path)s with extended_l2, cluster_size=%(cluster)d'
                 ' and preallocation=%(prealloc)s before growing it',
                 {'path': self.path, 'cluster': plan.cluster_size,
                  'prealloc': plan.preallocation.value})

    def libvirt_info(self, cache_mode, extra_specs, boot_order=None,
                     disk_unit=None):
        # extra_specs: the flavor's, which nova passes here.
        mode = policy.disk_mode(extra_specs, modes.host_mode(CONF))
        # As nova does for preallocate_images=space (it turns 'native'
        # back into 'threads' when the cache mode needs it).
        self.driver_io = 'native' if mode.preallocates else None
        info = super().libvirt_info(cache_mode, extra_specs,
                                    boot_order=boot_order,
                                    disk_unit=disk_unit)
        fmt = (policy.DiskFormat.QCOW2 if self.driver_format == 'qcow2'
               else policy.DiskFormat.RAW)
        info.driver_discard = policy.guest_discard(
            mode, fmt, info.driver_discard, self._opts.guest_discard)
        if (mode is modes.Mode.NONE or self.driver_format != 'qcow2' or
                self._opts.qcow2_l2_cache != 'full-coverage' or
                not os.path.exists(self.path)):
            return info
        try:
            existing, qinfo = qcow2.existing(self.path)
        except exception.PreallocError as exc:
            LOG.warning('No <metadata_cache> for %(path)s: %(err)s',
                        {'path': self.path, 'err': exc})
            return info
        block = policy.physical_block_size(self._opts, mode, existing)
        if block:
            # <blockio>: a 512e disk whose physical block is a subcluster.
            info.physical_block_size = str(block)
        max_size = policy.metadata_cache_for(
            self._opts, existing.virtual_size, existing.cluster_size,
            existing.extended_l2)
        if max_size:
            info = guestxml.with_metadata_cache(info, max_size)
        return info


def _grow_raw(path, size):
    """Grow the raw file at ``path`` to ``size`` as nova's disk.api.extend
    does (``qemu-img resize -f raw``, then e2fsck/resize2fs when it holds
    an ext filesystem), without its header-probing ``qemu-img info``.

    NOTE: nova 34's extend() first asks ``qemu-img info`` without ``-f``
    for the current size (can_resize_image): a raw disk's guest-written
    qcow2 header would decide it, and qemu-img would open the data-file
    that header names. A raw file's size is its length.
    """
    if size <= os.stat(path).st_size:
        return
    qemu.resize(path, 'raw', size, policy.Qcow2Preallocation.OFF)
    image = imgmodel.LocalFileImage(path, imgmodel.FORMAT_RAW)
    if not disk_api.is_image_extendable(image):
        return
    try:
        disk_api.resize2fs(path, check_exit_code=[0])
    except processutils.ProcessExecutionError as exc:
        LOG.debug('Resizing the file system with resize2fs has failed with '
                  'error: %s', exc)


def _resize_fs_like_nova(path):
    """Resize the filesystem of a grown qcow2 disk as nova's disk.api.extend
    does with ``[DEFAULT] resize_fs_using_block_device = True``.

    NOTE: nova 34's extend() runs 'qemu-img resize' and then, for qcow2
    only when that option is set, resize2fs on the disk mounted through
    nbd (errors logged at debug level). It does nothing when the disk is
    already at its size, which is how the plugin leaves it: so the plugin
    runs that step itself, with nova's own helpers.
    """
    image = imgmodel.LocalFileImage(path, imgmodel.FORMAT_QCOW2)
    if not disk_api.is_image_extendable(image):
        return
    mounter = mount.Mount.instance_for_format(image, None, None)
    if not mounter.get_dev():
        return
    try:
        disk_api.resize2fs(mounter.device, run_as_root=True,
                           check_exit_code=[0])
    except processutils.ProcessExecutionError as exc:
        LOG.debug('Resizing the file system with resize2fs has failed with '
                  'error: %s', exc)
    finally:
        mounter.unget_dev()


class Flat(_PreallocImage, imagebackend.Flat):
    """nova's Flat (raw files, or qcow2 copies), allocated after creation."""

    MADE_AS = 'raw'

    def __init__(self, instance=None, disk_name=None, path=None,
                 disk_info_mapping=None):
        super().__init__(instance=instance, disk_name=disk_name, path=path,
                         disk_info_mapping=disk_info_mapping)
        self._init_prealloc(instance)

    def _is_instance_disk(self):
        return self.disk_name not in NOT_DISKS

    def _check_space_for_new_disk(self, size):
        if not size or not self._is_instance_disk():
            return
        # Worst case: every byte of the disk ends up allocated.
        self._plan(policy.DiskFormat.RAW, size)

    def resize_image(self, size):
        # NOTE: right after nova's copy of the base, driver_format still
        # says 'raw' even for a qcow2 copy (force_raw_images=False): nova
        # would grow it with 'qemu-img resize -f raw', extending the qcow2
        # file as raw data, after which a preallocating qcow2 grow fails.
        self.correct_format()
        if self.driver_format in FORMATS:
            self._grow(size)
        else:
            super().resize_image(size)

    def _allocate_existing(self, created):
        if (not self._is_instance_disk() or not self.exists() or
                self.prealloc_mode is modes.Mode.NONE):
            return
        if self.driver_format == 'raw':
            self._allocate_file(created)
        elif self.driver_format == 'qcow2' and not created:
            # A qcow2 disk on a raw host: nova keeps a migrated overlay
            # qcow2 (it never converts to raw); this host's mode applies.
            self._allocate_copied_qcow2()


class Qcow2(_PreallocImage, imagebackend.Qcow2):
    """nova's Qcow2, with preallocated extended_l2 overlays."""

    MADE_AS = 'qcow2'

    def __init__(self, instance=None, disk_name=None, path=None,
                 disk_info_mapping=None):
        super().__init__(instance=instance, disk_name=disk_name, path=path,
                         disk_info_mapping=disk_info_mapping)
        self._init_prealloc(instance)

    def create_image(self, prepare_template, base, size, safe=False, *args,
                     **kwargs):
        if self.exists():
            # An existing disk (a migration's, a hard reboot's) whose base
            # this host may not have yet: fetched first, as nova does, so
            # that an overlay's backing file exists when it is checked.
            if not os.path.exists(base):
                prepare_template(target=base, *args, **kwargs)
            fmt = self._existing_format()
            if fmt is None:
                return None
            if fmt is policy.DiskFormat.RAW:
                # A raw disk (from a raw host, before finish_migration
                # converts it): only its base is checked here, never
                # nova's legacy-backing probe ('qemu-img info' without -f,
                # which would believe a qcow2 header its guest wrote).
                self._checked_base(base, safe)
                imagebackend._update_utime_ignore_eacces(base)
                return None
        if self.exists() or self.prealloc_mode is modes.Mode.NONE:
            # An existing qcow2 disk, checked above (_disk_format): nova's
            # code only re-creates a legacy '_<size>' backing file here.
            # Mode none: nova's own overlay (see policy._none_plan).
            return super().create_image(prepare_template, base, size, safe,
                                        *args, **kwargs)
        if not os.path.exists(base):
            prepare_template(target=base, *args, **kwargs)
        base_info = self._checked_base(base, safe)
        imagebackend._update_utime_ignore_eacces(base)
        self.verify_base_size(base, size)
        virtual_size = max(size or 0, base_info.virtual_size)
        plan = self._plan(policy.DiskFormat.QCOW2, virtual_size)

        @nova_utils.synchronized(self._get_lock_name(base), external=True,
                                 lock_path=self.lock_path)
        def create_overlay():
            qcow2.create_overlay(self.path, virtual_size, base,
                                 base_info.file_format, plan,
                                 timeout=self._opts.allocation_timeout)

        create_overlay()

    def _allocate_existing(self, created):
        if not self.exists() or created:
            return
        fmt = self._existing_format()
        if fmt is None:
            return
        if fmt is policy.DiskFormat.RAW:
            # A raw disk in a qcow2 instance (a migration from a raw host,
            # before nova converts it): allocated as a raw file.
            if self.prealloc_mode is not modes.Mode.NONE:
                self._allocate_file(created)
            return
        self._allocate_copied_qcow2()

    @staticmethod
    def _checked_base(base, safe):
        """nova's checks of a backing file before an overlay is made on it
        (nova.virt.libvirt.utils.create_image does the same), called through
        nova's own helpers. Returns the base's QemuImgInfo.
        """
        if not CONF.workarounds.disable_deep_image_inspection and not safe:
            try:
                images.get_image_format(base).safety_check()
            except format_inspector.SafetyCheckFailed as exc:
                LOG.warning('Base image %s failed safety check: %s', base,
                            exc)
                raise nova_exception.InvalidDiskInfo(
                    reason='Base image failed safety check')
        # -f: the format the safety-checked header of nova's own cache file
        # says (nova's images.qemu_img_info would probe).
        base_fmt = header_format(base)
        base_info = images.qemu_img_info(
            base, format='raw' if _is_raw_header(base_fmt) else
            QEMU_NAMES.get(base_fmt, base_fmt))
        if base_info.file_format == 'vmdk':
            images.check_vmdk_image('base', base_info)
        try:
            data_file = base_info.format_specific['data']['data-file']
        except (KeyError, TypeError, AttributeError):
            data_file = None
        if base_info.backing_file is not None or data_file is not None:
            LOG.warning('Base image %s failed safety check', base)
            raise nova_exception.InvalidDiskInfo(
                reason='Base image failed safety check')
        return base_info

    def resize_image(self, size):
        # Format-aware: a raw file (from a raw host) grows as raw, never
        # 'qemu-img resize -f qcow2' on it (nova 34 fails there).
        self._grow(size)


class Backend(imagebackend.Backend):
    """nova's Backend with the preallocating Flat and Qcow2."""

    def __init__(self, use_cow):
        super().__init__(use_cow)
        self.BACKEND.update({
            'raw': Flat,
            'flat': Flat,
            'qcow2': Qcow2,
            'default': Qcow2 if use_cow else Flat,
        })

    def backend(self, image_type=None):
        image = super().backend(image_type)
        if image not in (Flat, Qcow2):
            name = image_type or CONF.libvirt.images_type
            with _not_applied_lock:
                first = name not in _not_applied_logged
                _not_applied_logged.add(name)
            if first:
                LOG.info('prealloc_backend does not apply to images_type='
                         '%s: its disks keep nova\'s own behaviour', name)
        return image
