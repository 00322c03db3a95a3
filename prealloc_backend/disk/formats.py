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


"""A disk's format, from nova's records; the checks a qcow2 disk and a base
image pass before qemu-img runs on them.

A disk's format comes from nova's records, never from its header alone (a
guest writes the first bytes of a raw disk): the source host's domain XML
during a migration (the caller passes it: ``migration_format``), else
nova's disk.info, else the backend that made the disk
(``recorded_format``). The header (its
first HEADER_PREFIX bytes, whatever it says) is read (format_inspector, no
qemu-img) only to refuse a disk whose header and record disagree
(``checked_format``), never when the record says raw; a qcow2 disk is
checked (``check_qcow2_disk``) before any qemu-img command other than
``info -f qcow2`` runs on it.

The disk operation (adapter/operation.py) calls these functions with its
disk's path, its disk.info, the format its backend makes and the record of
a migration being finished; nothing is kept here between calls.
"""

import collections
import json
import os

from nova import exception as nova_exception
from nova import utils as nova_utils
from nova.virt import images
from oslo_log import log as logging
from oslo_utils.imageutils import format_inspector
from oslo_utils import units

from prealloc_backend import conf
from prealloc_backend.disk import qemu
from prealloc_backend import exception
from prealloc_backend.planner import diskplan
from prealloc_backend.system import fileops

LOG = logging.getLogger(__name__)
CONF = conf.CONF

# Header formats (format_inspector's names) that are raw data for QEMU.
RAW_HEADERS = ('raw', 'gpt', 'iso')
# Formats the plugin grows and allocates.
FORMATS = {'raw': diskplan.DiskFormat.RAW, 'qcow2': diskplan.DiskFormat.QCOW2}
# qemu-img's names of format_inspector's formats, where they differ.
QEMU_NAMES = {'vhd': 'vpc'}
# Formats a qcow2 instance disk's backing file may have.
BACKING_FORMATS = ('raw', 'qcow2')
# How much of a disk header_format reads, whatever its header says: what
# format_inspector needs to name a format lies within it (the furthest,
# VHDX's region table, ends at 256 KiB).
HEADER_PREFIX = units.Mi


class Checked(collections.namedtuple('Checked',
                                     'backing backing_fmt info')):
    """A qcow2 disk that passed check_qcow2_disk: its backing file's
    absolute name and format (None, None without one) and its ImageInfo
    (``qemu-img info -f qcow2``, read for the check).
    """


def header_format(path):
    """The format a disk's header claims (format_inspector's name, 'raw'
    when nothing matches), from its first HEADER_PREFIX bytes only: read,
    never believed alone. No qemu-img runs.

    NOTE(oslo.utils): not format_inspector.detect_file_format: it reads until
    every inspector is done, and a header the guest writes (a VMDK grain
    directory "at end", a VHDX region table naming the disk's last MiB) keeps
    one waiting for the file's end: a whole-disk scan, 4 KiB at a time, ~17 s
    per GiB of a sparse disk. An inspector still waiting at the prefix's end
    sees the end of the file there.
    """
    with open(path, 'rb') as f:
        source = _Prefix(f, HEADER_PREFIX)
        wrapper = format_inspector.InspectWrapper(source)
        try:
            # As detect_file_format, within the prefix.
            while wrapper.read(4096) and wrapper.formats is None:
                pass
        finally:
            wrapper.close()
    try:
        inspector = wrapper.format
    except format_inspector.ImageFormatError as exc:
        return 'ambiguous (%s)' % exc
    return str(inspector) if inspector is not None else 'raw'


class _Prefix:
    """The first ``limit`` bytes of the file object ``f``, read as they are
    asked for: end of file after them, whatever a header says lies beyond.
    """

    def __init__(self, f, limit):
        self._f = f
        self._left = limit
        self.name = f.name

    def read(self, size):
        data = self._f.read(max(0, min(size, self._left)))
        self._left -= len(data)
        return data


def is_raw_header(header):
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
    # NOTE(oslo.utils): not check_unknown_features: its QcowInspector knows
    # incompatible feature bits 0-3 only (I_FEATURES_MAX_BIT = 4, in 10.2
    # and on master at 2efc66a), so extended_l2 (bit 4, the plugin's
    # overlays) counts as unknown. No upstream report of it was found.
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

    Returns a Checked: the backing file's absolute name and format (None
    without one) and the disk's ImageInfo.
    """
    _no_data_file(path, path, 'the disk')
    return _checked(path, qemu.info(path, 'qcow2'))


def checked_overlay(path, info):
    """The Checked of the overlay at ``path`` that the caller has just
    made (qcow2.create_overlay) of a base checked_base passed (no backing
    file nor data-file of its own), whose ImageInfo is ``info``
    (qemu.check_overlay's, which holds the base's name and format):
    check_qcow2_disk's refusals, from what is known, with no qemu-img run.
    """
    return _checked(path, info, base_checked=True)


def _checked(path, info, base_checked=False):
    """check_qcow2_disk's verdict on the disk at ``path`` whose ImageInfo
    is ``info``; ``base_checked``: its backing file is known to have
    neither a backing file nor a data-file.
    """
    why = info.refusal()
    if why:
        _refuse(path, why)
    if not info.has_backing:
        return Checked(None, None, info)
    named = info.backing_file
    # qemu resolves a relative name against the disk's directory; realpath
    # of the joined name resolves '..' after symlinks, as the kernel does
    # (abspath would drop 'x/..' by text first).
    backing = os.path.realpath(os.path.join(os.path.dirname(path), named))
    root = os.path.realpath(cache_dir())
    if (os.path.commonpath([root, backing]) != root or backing == root or
            not os.path.isfile(backing)):
        _refuse(path, 'backing file %r is not a file beneath %s'
                % (named, root))
    backing_fmt = info.backing_format
    if backing_fmt is None:
        # An overlay made before nova recorded the backing format (it
        # does since Wallaby): the format of nova's own cache file, read
        # from that file, which its guest cannot write.
        backing_fmt = header_format(backing)
        if is_raw_header(backing_fmt):
            backing_fmt = 'raw'
    if backing_fmt not in BACKING_FORMATS:
        _refuse(path, 'backing file %r has format %r, not raw or qcow2'
                % (named, backing_fmt))
    if backing_fmt == 'qcow2' and not base_checked:
        _no_data_file(path, backing, 'backing file %s' % backing)
        if not qemu.info(backing, 'qcow2').standalone:
            _refuse(path, 'backing file %s has a backing file or data-file '
                          'of its own' % backing)
    return Checked(backing, backing_fmt, info)


# nova's temporary name for a disk.info being written (imagebackend's
# write_to_disk_info_file), which record_format uses too.
DISK_INFO_TMP_SUFFIX = '.tmp'


def _disk_info_lock(disk_info_path):
    # nova's own lock around its disk.info writes.
    return nova_utils.synchronized(
        disk_info_path, external=False,
        lock_path=os.path.join(CONF.instances_path, 'locks'))


def record_format(path, fmt):
    """Record ``fmt`` as the format of ``path`` in its directory's
    disk.info (nova's record), replacing any entry it had: written to a
    temporary file renamed into place, as nova writes it, durably.
    """
    disk_info_path = os.path.join(os.path.dirname(path), 'disk.info')

    @_disk_info_lock(disk_info_path)
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
        # Flushed before and after the rename (fileops.write_file): a power
        # cut leaves the old record or the new, never an empty file.
        fileops.write_file(disk_info_path, '%s\n' % json.dumps(dct),
                           suffix=DISK_INFO_TMP_SUFFIX)

    write()


def remove_partial_record(path):
    """Remove the temporary disk.info a crash left beside the disk at
    ``path`` (record_format's or nova's, killed before its rename), under
    the lock of the writers: disk.info itself is the old record, whole.
    NOTE(nova): nova opens that file without O_TRUNC and writes over it:
    a longer file left there would leave its tail after nova's record.
    """
    disk_info_path = os.path.join(os.path.dirname(path), 'disk.info')
    tmp = disk_info_path + DISK_INFO_TMP_SUFFIX
    if not os.path.lexists(tmp):
        return

    @_disk_info_lock(disk_info_path)
    def remove():
        fileops.remove(tmp)

    remove()


def disk_info_format(disk_info_path, path):
    """The format nova's disk.info at ``disk_info_path`` records for
    ``path``, or None (no file, no entry, not JSON).
    """
    try:
        with open(disk_info_path) as f:
            return json.loads(f.read() or '{}').get(path)
    except (OSError, TypeError, ValueError, AttributeError, RecursionError):
        return None


def recorded_format(path, disk_info_path, made_as, migration_format=None):
    """(format, where it is recorded) of the disk at ``path`` by nova's
    records: ``migration_format``, the source host's domain XML while a
    migration is finished here, else nova's disk.info, else ``made_as``,
    the format of the backend that made it.
    """
    fmt = migration_format
    if fmt:
        return fmt, 'the source host\'s domain XML'
    fmt = disk_info_format(disk_info_path, path)
    if fmt:
        return fmt, disk_info_path
    return made_as, 'the %s backend that made it' % made_as


def checked_format(path, disk_info_path, made_as, migration_format=None):
    """(DiskFormat, Checked or None) of the existing disk at ``path`` by
    its record (recorded_format); refused when the header disagrees
    (DiskFormatMismatch) and, for qcow2, unless check_qcow2_disk passes
    (its Checked is returned).

    A disk recorded raw is raw whatever its first bytes say: they are its
    guest's data (nova's Flat, since CVE-2026-24708, runs qemu-img on it
    with ``-f raw`` too).
    """
    recorded, source = recorded_format(path, disk_info_path, made_as,
                                       migration_format)
    if recorded not in FORMATS:
        raise nova_exception.InvalidDiskFormat(disk_format=recorded)
    if recorded == 'raw':
        # Not even read: whatever the first bytes say is data.
        return diskplan.DiskFormat.RAW, None
    header = header_format(path)
    if header != recorded:
        raise exception.DiskFormatMismatch(
            path=path, recorded=recorded, source=source, header=header)
    return diskplan.DiskFormat.QCOW2, check_qcow2_disk(path)


def migration_record(path, fmt):
    """``fmt``, the format the migration being finished here records for
    the existing disk at ``path``, written to disk.info; None when there is
    no such record (``fmt`` None). Refused (DiskFormatMismatch) when it
    says other than raw and the header disagrees; a disk it records raw is
    not read.
    """
    if not fmt or not os.path.exists(path):
        return None
    if fmt != 'raw':
        header = header_format(path)
        if header != fmt:
            raise exception.DiskFormatMismatch(
                path=path, recorded=fmt,
                source='the source host\'s domain XML', header=header)
    record_format(path, fmt)
    return fmt


def unrecorded_raw_format(path, new_disk, disk_info_path):
    """The format of a disk the raw backend made and disk.info does not
    list: raw, never its header's word, except a disk ``new_disk`` (just
    made by this cache() call, a copy of a base nova checked against its
    image) whose header says qcow2.
    """
    header = header_format(path)
    if is_raw_header(header):
        return 'raw'
    if new_disk and header in FORMATS:
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
                {'path': path, 'hdr': header, 'info': disk_info_path})
    return 'raw'


def virtual_size_unchecked(path):
    """The size a refused disk shows its guest: a qcow2 header's virtual
    size (qemu.header_info: no qemu-img, which would open a data-file),
    else the file's size.
    """
    header = qemu.header_info(path)
    if header is not None:
        return header.virtual_size
    return os.stat(path).st_size


def checked_base(base, safe):
    """nova's checks of a backing file before an overlay is made on it
    (nova.virt.libvirt.utils.create_image runs the same inline, in no
    function of its own to call), through nova's own helpers. Returns the
    base's QemuImgInfo.
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
        base, format='raw' if is_raw_header(base_fmt) else
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
