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

"""qemu-img, run the way nova runs it: LC_ALL=C, prlimit, typed errors.

Every command goes through prealloc_backend.system.process (processutils,
``env LC_ALL=C LANG=C``); this module chooses the limits and turns failures
into QemuImgError and AllocationTimeout.

``info`` returns an ``ImageInfo``: the one typed reading of an image,
parsed and checked once, field by field (QemuImgOutputError for a
malformed answer), that every module reads (formats.py's checks, qcow2.py,
adoption, ``prealloc-backend check``), rather than oslo.utils'
``imageutils.QemuImgInfo``: QemuImgInfo accepts any JSON (a missing or
negative ``virtual-size`` passes), has no ``full-backing-filename``, and
gives ``extended-l2`` and ``data-file`` only through the same
``format_specific`` dict. ``ImageInfo.from_header`` reads the same facts
from a qcow2 header's first HEADER bytes, with no qemu-img, where a
process per disk is too much or a file is read as root
(checks/existing.py) or a size is verified (qcow2.grow). nova's own
``qemu_img_info`` (QemuImgInfo) is used where nova's checks are reused on
a base image of any format: formats.checked_base.

nova's prlimit (``[libvirt] images_cpu_time_limit`` and
``images_address_space_limit``) exists to contain qemu-img on untrusted
image files. The plugin keeps it for every command it runs on such files
(``info``) and for thin or metadata-only work, but lifts the CPU
limit where qemu-img writes the data area itself (``falloc`` and ``full``
preallocation), whose CPU time grows with the disk size (zeroing 100 GiB
takes minutes of system time). ``[prealloc_backend] allocation_timeout``
bounds those by wall-clock time instead.

Preallocation values are qcow2_layout.Qcow2Preallocation members, never
strings.
"""

import dataclasses
import json
import struct

from oslo_log import log as logging
from oslo_utils import units

from prealloc_backend import conf
from prealloc_backend import exception
from prealloc_backend.planner import diskplan
from prealloc_backend.planner import qcow2_layout
from prealloc_backend.system import process

LOG = logging.getLogger(__name__)
CONF = conf.CONF

QEMU_IMG = 'qemu-img'


def limits(heavy=False):
    return process.Limits(
        cpu_time=None if heavy else CONF.libvirt.images_cpu_time_limit,
        address_space=CONF.libvirt.images_address_space_limit * units.Gi)


def execute(*args, heavy=False, timeout=None, path=None):
    """Run ``qemu-img *args``; return stdout.

    Raises QemuImgError (command, exit code, stderr) when it fails. When
    ``timeout`` expires qemu-img is killed and AllocationTimeout (naming
    ``path``, the disk being made) raised, or ProcessTimeout for a command
    that makes no disk (no ``path``).
    """
    try:
        return process.execute(QEMU_IMG, *args, limits=limits(heavy),
                               timeout=timeout)
    except exception.ProcessFailed as exc:
        if exc.exit_code == -9 and not heavy:
            reason = 'killed by the prlimit of [libvirt] images_*_limit'
        else:
            reason = exc.stderr or '(no error output)'
        raise exception.QemuImgError(cmd=exc.cmd, exit_code=exc.exit_code,
                                     stderr=reason)
    except exception.ProcessTimeout:
        if path is None:
            raise
        raise exception.AllocationTimeout(path=path, timeout=timeout)


def _cmd(args):
    return ' '.join((QEMU_IMG,) + tuple(str(a) for a in args))


def _json(cmd, out, required):
    try:
        data = json.loads(out)
    except ValueError as exc:
        raise exception.QemuImgOutputError(cmd=cmd, reason='not JSON (%s)'
                                           % exc, output=out[:200])
    if not isinstance(data, dict):
        raise exception.QemuImgOutputError(cmd=cmd, reason='not a JSON '
                                           'object', output=out[:200])
    for key, kind in required.items():
        if not isinstance(data.get(key), kind) or isinstance(data.get(key),
                                                             bool):
            raise exception.QemuImgOutputError(
                cmd=cmd, reason='field %r missing or not %s'
                                % (key, kind.__name__), output=out[:200])
        if kind is int and data[key] < 0:
            raise exception.QemuImgOutputError(
                cmd=cmd, reason='field %r is negative' % key,
                output=out[:200])
    return data


# What ImageInfo.from_header reads of a qcow2 file: its header up to the
# incompatible features (v3), and the header's magic.
HEADER = 104
QCOW2_MAGIC = b'QFI\xfb'
# qcow2 v3 incompatible feature bits: an external data file (bit 2),
# extended L2 entries (bit 4).
INCOMPAT_DATA_FILE = 1 << 2
INCOMPAT_EXTENDED_L2 = 1 << 4
# The cluster sizes QEMU makes and opens: 512 bytes to 2 MiB.
MIN_CLUSTER_BITS = 9
MAX_CLUSTER_BITS = 21


@dataclasses.dataclass(frozen=True)
class ImageInfo:
    """One image as ``qemu-img info`` shows it, checked once.

    ``format`` and ``virtual_size`` always; ``cluster_size`` for a qcow2
    image (qemu-img always prints it there, a reading without it is
    refused: no default is ever guessed), None for raw; ``extended_l2``
    False unless qemu-img says so (a compat 0.10 image, or a QEMU before
    5.2, prints nothing); ``has_backing`` whether it has a backing file,
    ``backing_file`` its name as the header holds it (None without one,
    or where a header's prefix did not reach it), ``backing_format`` as
    the header records it (None: not recorded), ``full_backing_filename``
    as qemu resolves it; ``data_file`` the external data file the image
    names (None: none, or not read: from_header).
    """
    format: str
    virtual_size: int
    cluster_size: int | None = None
    extended_l2: bool = False
    has_backing: bool = False
    backing_file: str | None = None
    backing_format: str | None = None
    full_backing_filename: str | None = None
    data_file: str | None = None

    @classmethod
    def from_json(cls, out, cmd='qemu-img info'):
        """The ImageInfo of ``qemu-img info --output=json``'s answer
        ``out``; QemuImgOutputError (naming ``cmd`` and the field) for an
        answer that is not one.
        """
        data = _json(cmd, out, {'virtual-size': int, 'format': str})

        def field(container, key, kind, where=''):
            value = container.get(key)
            if value is None:
                return None
            if not isinstance(value, kind) or (kind is int and
                                               isinstance(value, bool)):
                raise exception.QemuImgOutputError(
                    cmd=cmd, reason='field %r%s is not %s'
                                    % (key, where, kind.__name__),
                    output=out[:200])
            return value

        specific = field(data, 'format-specific', dict) or {}
        specific = field(specific, 'data', dict, ' of format-specific') or {}
        cluster = field(data, 'cluster-size', int)
        if data['format'] == 'qcow2' and not _cluster_ok(cluster):
            raise exception.QemuImgOutputError(
                cmd=cmd, reason='field %r missing or not a qcow2 cluster '
                                'size (a power of 2 from %d to %d)'
                                % ('cluster-size', 1 << MIN_CLUSTER_BITS,
                                   1 << MAX_CLUSTER_BITS),
                output=out[:200])
        backing = field(data, 'backing-filename', str)
        where = ' of format-specific data'
        return cls(
            format=data['format'], virtual_size=data['virtual-size'],
            cluster_size=cluster,
            extended_l2=bool(field(specific, 'extended-l2', bool, where)),
            has_backing=bool(backing), backing_file=backing or None,
            backing_format=field(data, 'backing-filename-format', str),
            full_backing_filename=field(data, 'full-backing-filename', str),
            data_file=field(specific, 'data-file', str, where) or None)

    @classmethod
    def from_header(cls, header):
        """The ImageInfo a qcow2 file's first bytes ``header`` give (at
        least HEADER for a version 3 image's features), with no qemu-img:
        None when they are not a qcow2 header QEMU would open (magic,
        cluster size). ``backing_file`` only where ``header`` holds the
        name; ``backing_format``, ``full_backing_filename`` and
        ``data_file`` are never read here (header extensions).
        """
        if len(header) < 72 or header[:4] != QCOW2_MAGIC:
            return None
        version, backing_offset, backing_length = struct.unpack(
            '>IQI', header[4:20])
        cluster_bits, = struct.unpack('>I', header[20:24])
        size, = struct.unpack('>Q', header[24:32])
        incompatible = 0
        if version >= 3 and len(header) >= 80:
            incompatible, = struct.unpack('>Q', header[72:80])
        if not MIN_CLUSTER_BITS <= cluster_bits <= MAX_CLUSTER_BITS:
            return None
        backing = None
        end = backing_offset + backing_length
        if backing_offset and backing_length and end <= len(header):
            backing = header[backing_offset:end].decode('utf-8', 'replace')
        return cls(format='qcow2', virtual_size=size,
                   cluster_size=1 << cluster_bits,
                   extended_l2=bool(incompatible & INCOMPAT_EXTENDED_L2),
                   has_backing=backing_offset != 0, backing_file=backing)

    @property
    def standalone(self):
        """Neither a backing file nor a data-file: what a backing file of
        an instance disk must be.
        """
        return not self.has_backing and not self.data_file

    def refusal(self):
        """Why an instance disk with this reading is refused before any
        other command opens it (formats.check_qcow2_disk), in words, or
        None: a data-file, a backing file's name that qemu reads as a
        protocol. Where the backing file lies is formats.py's check.
        """
        if self.data_file:
            return 'it has data-file %r' % self.data_file
        for name in (self.backing_file or '',
                     self.full_backing_filename or ''):
            # NOTE(qemu): qemu reads a name with a ':' before its first '/'
            # as a protocol (http:, nbd:, ssh:, json:{...}), not a file:
            # the host would fetch what a guest-written header names.
            # nova's image cache names never hold one.
            if ':' in name:
                return 'backing file %r is not a plain file name' % name
        return None

    def existing(self, allocated_bytes):
        """The planner's ExistingDisk of this image, whose file holds
        ``allocated_bytes`` (st_blocks * 512).
        """
        return diskplan.ExistingDisk(
            allocated_bytes=allocated_bytes, virtual_size=self.virtual_size,
            cluster_size=self.cluster_size, extended_l2=self.extended_l2)


def _cluster_ok(cluster):
    return (cluster is not None and cluster & (cluster - 1) == 0 and
            1 << MIN_CLUSTER_BITS <= cluster <= 1 << MAX_CLUSTER_BITS)


def header_info(path):
    """ImageInfo.from_header of the file at ``path`` (its first HEADER
    bytes; None when they are not a qcow2 header). No qemu-img runs.
    """
    with open(path, 'rb') as f:
        return ImageInfo.from_header(f.read(HEADER))


def info(path, fmt):
    """``qemu-img info -f <fmt> --output=json`` of path: its ImageInfo.
    ``fmt`` is required: the format comes from nova's records, never from
    qemu-img's probe of a header a guest may have written.
    """
    if fmt not in ('raw', 'qcow2'):
        raise exception.QemuImgError(
            cmd='qemu-img info %s' % path, exit_code=None,
            stderr='refused: format %r is not raw or qcow2' % (fmt,))
    args = ['info', '--output=json', '--force-share', '-f', fmt, path]
    out = execute(*args, path=path)
    return ImageInfo.from_json(out, _cmd(args))


def create_overlay(path, size, backing_file, backing_fmt, layout,
                   timeout=None):
    """Create a qcow2 overlay of ``backing_file`` with ``layout`` (a
    DiskPlan: preallocation, cluster_size, extended_l2).
    """
    preallocation = layout.preallocation
    opts = ['backing_file=%s' % backing_file,
            'backing_fmt=%s' % backing_fmt,
            'cluster_size=%d' % layout.cluster_size,
            'extended_l2=%s' % ('on' if layout.extended_l2 else 'off'),
            'preallocation=%s' % preallocation.value]
    for value in (backing_file, backing_fmt):
        if ',' in value:
            # qemu-img's option syntax would need ',,' escaping; nova's
            # image cache never produces such names, refuse rather than
            # guess.
            raise exception.AllocationFailed(
                path=path, reason='backing file option %r contains a comma'
                                  % value)
    execute('create', '-f', 'qcow2', '-o', ','.join(opts), path, size,
            heavy=preallocation.heavy, timeout=timeout, path=path)


def check_overlay(path, size, backing_file, layout):
    """Check that ``qemu-img create`` made the overlay it was asked for:
    a qcow2 image of ``size`` bytes backed by ``backing_file``, with the
    layout's extended_l2. Raises QemuImgOutputError otherwise; returns its
    ImageInfo (the new disk's reading: nothing reads it again).
    """
    made = info(path, 'qcow2')
    found = (made.format, made.virtual_size, made.backing_file,
             made.extended_l2)
    # qemu-img rounds sizes up to whole 512-byte sectors.
    wanted = ('qcow2', -(-size // 512) * 512, backing_file,
              layout.extended_l2)
    if found != wanted:
        raise exception.QemuImgOutputError(
            cmd='qemu-img create',
            reason='it made (format, size, backing file, extended_l2) %r, '
                   'not %r' % (found, wanted), output=path)
    return made


def resize(path, fmt, size, preallocation, timeout=None):
    """Grow ``path`` to ``size`` bytes, preallocating the new area as
    ``preallocation`` (a qcow2_layout.Qcow2Preallocation) says.
    """
    args = ['resize', '-f', fmt]
    if preallocation is not qcow2_layout.Qcow2Preallocation.OFF:
        args.append('--preallocation=%s' % preallocation.value)
    args += [path, size]
    execute(*args, heavy=preallocation.heavy, timeout=timeout, path=path)


def repair_leaks(path, timeout=None):
    """``qemu-img check -f qcow2 -r leaks`` of ``path``: the clusters its
    refcounts count and no table references are freed (never one that is
    referenced). Returns qemu-img's JSON after the repair, checked (an
    int ``image-end-offset``: the end of the last cluster counted or
    referenced). Raises QemuImgError where it finds more than leaks or
    cannot finish (exit 1 or 2: corruption it does not repair, a running
    QEMU's image lock), and QemuImgOutputError where errors remain.
    """
    args = ['check', '-f', 'qcow2', '-r', 'leaks', '--output=json', path]
    out = execute(*args, timeout=timeout, path=path)
    data = _json(_cmd(args), out, {'image-end-offset': int})
    for key in ('corruptions', 'leaks', 'check-errors'):
        if data.get(key):
            raise exception.QemuImgOutputError(
                cmd=' '.join([QEMU_IMG] + args),
                reason='%s: %r after the repair' % (key, data[key]),
                output=out[:200])
    return data


# Destination cache modes of ``qemu-img convert`` that honour flushes:
# qemu-img's own default for convert, 'unsafe', ignores them (the image's
# tables may never reach the device before the file is published).
CONVERT_CACHE_MODES = ('none', 'writeback')


def convert(src, src_fmt, dst, layout, cache, backing_file=None,
            backing_fmt=None, timeout=None, path=None):
    """``qemu-img convert`` of ``src`` (format ``src_fmt``) into a new qcow2
    file ``dst`` with ``layout`` (a DiskPlan: cluster_size, extended_l2,
    preallocation): a standalone disk, or with ``backing_file`` (format
    ``backing_fmt``) an overlay holding only what ``src`` does not read
    from it (``-B``). ``cache`` is the destination's cache mode (``-t``),
    required: ``none`` (written past the host's page cache) or
    ``writeback``, both of which honour flushes; the caller still fsyncs
    ``dst`` before publishing it (fileops.publish). ``path`` names the disk
    a timeout fails (default ``dst``).
    """
    if cache not in CONVERT_CACHE_MODES:
        raise exception.QemuImgError(
            cmd='qemu-img convert %s' % dst, exit_code=None,
            stderr='refused: cache mode %r is not one of %s'
                   % (cache, ', '.join(CONVERT_CACHE_MODES)))
    args = ['convert', '-t', cache]
    args += ['-f', src_fmt, '-O', 'qcow2']
    if backing_file is not None:
        args += ['-B', backing_file, '-F', backing_fmt]
    args += ['-o', 'cluster_size=%d,extended_l2=%s,preallocation=%s' % (
        layout.cluster_size, 'on' if layout.extended_l2 else 'off',
        layout.preallocation.value), src, dst]
    execute(*args, heavy=True, timeout=timeout, path=path or dst)


def zeroed_without_cluster(path, timeout=60):
    """Bytes of the qcow2 file at ``path`` that read as zeros from a
    cluster of its own with no host cluster behind it (``qemu-img map``:
    depth 0, zero, no offset): ranges a block copy wrote as zeros with
    unmap (QEMU 7.2's mirror), where the file's own blocks are no longer
    the cluster's. Read with --force-share: a running guest's disk.
    """
    args = ('map', '--output=json', '--force-share', '-f', 'qcow2', path)
    out = execute(*args, timeout=timeout)
    try:
        ranges = json.loads(out)
        return sum(int(r['length']) for r in ranges
                   if r.get('depth') == 0 and r.get('zero') and
                   'offset' not in r)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise exception.QemuImgOutputError(
            cmd=' '.join((QEMU_IMG,) + args),
            reason='not a JSON list of ranges (%s)' % exc,
            output=out[:200])


def compare(first, second, path=None):
    """``qemu-img compare`` of two qcow2 files: QemuImgError unless a guest
    reads the same from both (exit 1: they differ).
    """
    execute('compare', '-f', 'qcow2', '-F', 'qcow2', first, second,
            heavy=True, path=path or second)
