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

"""The disk plan: one pure decision of what to do for one disk.

``make_plan`` takes the options, the flavor's ``prealloc:`` extra specs,
the host's mode, the disk's format and virtual size and the facts of its
filesystem, and returns one frozen ``DiskPlan``: the mode, what to do with a
raw file or the layout of a qcow2 disk (qcow2_layout.py), the bytes the
disk needs, the ``<metadata_cache>`` and any warning. Every consumer (the
disk operation, ``prealloc-backend check``, the benchmark) takes needed
bytes and layout from it; nothing else computes them. Nothing here touches
a disk or runs a process.

Mode ``none`` makes exactly what stock nova makes: see ``_none_plan``.
"""

import dataclasses
import enum

from prealloc_backend import exception
from prealloc_backend.planner.modes import Mode
from prealloc_backend.planner import qcow2_layout
from prealloc_backend.planner.qcow2_layout import Qcow2Preallocation


class RawAction(enum.Enum):
    """What is done to the blocks of a raw file."""
    NOTHING = 'nothing'
    FALLOCATE = 'fallocate'
    ZERO_FILL = 'zero-fill'


class DiskFormat(enum.Enum):
    RAW = 'raw'
    QCOW2 = 'qcow2'


# qemu-img's preallocation= for each mode.
QCOW2_PREALLOCATION = {
    Mode.NONE: Qcow2Preallocation.OFF,
    Mode.METADATA: Qcow2Preallocation.METADATA,
    Mode.SPACE: Qcow2Preallocation.FALLOC,
    Mode.FULL: Qcow2Preallocation.FULL,
}


@dataclasses.dataclass(frozen=True)
class FsFacts:
    """What the filesystem holding a disk offers (see fsprobe.facts)."""
    fallocate_ok: bool
    fstype: str
    free_bytes: int          # f_bavail * f_frsize (never root-reserved blocks)


@dataclasses.dataclass(frozen=True)
class ExistingDisk:
    """A disk that is already there (hard reboot, evacuate, resize, cold
    migration): its layout is fixed, only its allocation is decided. Also
    what adoption and ``prealloc-backend check`` judge an existing overlay
    by (planner/adoption.py). A qcow2 disk's is read from its ImageInfo
    (``disk.qemu``: qemu-img info, or its header), which always gives the
    cluster size; None is a raw disk's.
    """
    allocated_bytes: int     # st_blocks * 512 of the file now
    virtual_size: int        # its virtual size before any growth
    cluster_size: int | None = None   # qcow2
    extended_l2: bool = False         # qcow2


@dataclasses.dataclass(frozen=True)
class DiskPlan:
    """What to do for one disk, decided once."""
    mode: Mode
    fmt: DiskFormat
    virtual_size: int
    raw_action: RawAction | None                 # raw only
    preallocation: Qcow2Preallocation | None     # qcow2 only
    cluster_size: int | None                     # qcow2 only; None = nova's
    extended_l2: bool | None                     # qcow2 only
    needed_bytes: int        # bytes the disk occupies once made
    metadata_cache_bytes: int | None             # <metadata_cache>, or None
    warning: str | None
    # Bytes the filesystem must still provide: needed_bytes minus what an
    # existing disk already holds (at least the growth of its metadata).
    to_allocate: int = 0
    # to_allocate fits in the free space (always True in mode none, which
    # checks nothing, as nova does, and for existing disks, which are left
    # thin rather than failed).
    fits: bool = True
    existing: bool = False
    # <blockio physical_block_size> of the guest XML, or None (nova's).
    physical_block_size: int | None = None

    @property
    def stock(self):
        """nova makes this disk its own way (mode none)."""
        return self.mode is Mode.NONE


def host_disk_format(images_type, use_cow_images):
    """DiskFormat of the instance disks nova makes on a host with these
    ``[libvirt] images_type`` and ``[DEFAULT] use_cow_images``: qcow2
    overlays, raw files, or None where they are not files the plugin
    handles (rbd, lvm, ploop).
    """
    if images_type == 'qcow2' or (images_type == 'default' and
                                  use_cow_images):
        return DiskFormat.QCOW2
    if images_type in ('raw', 'flat', 'default'):
        return DiskFormat.RAW
    return None


@dataclasses.dataclass(frozen=True)
class GuestDiscard:
    """What a disk's ``<driver>`` says about a guest's discards.

    ``discard``: the ``discard`` attribute (None: unset); ``no_unref``:
    ``discard_no_unref='on'`` too (qcow2's discard-no-unref: the discarded
    clusters read zeros and keep their place in the image);
    ``reserve_again``: a guest's discard frees blocks the disk's mode
    reserves, which the caller reserves again whenever it defines the
    guest.
    """

    discard: str = None
    no_unref: bool = False
    reserve_again: bool = False


def may_use_no_unref(mode, fmt, nova_discard, choice):
    """Whether guest_discard (below, which owns the same conditions)
    could give this disk discard-no-unref: the only disks for which the
    host's answer (disk.hostcaps) is worth asking.
    """
    return (nova_discard == 'unmap' and choice != 'reclaim' and
            fmt is DiskFormat.QCOW2 and mode.preallocates)


def guest_discard(mode, fmt, nova_discard, choice, no_unref=False):
    """The GuestDiscard of a disk of ``mode`` and ``fmt``.

    ``nova_discard``: nova's ``[libvirt] hw_disk_discard`` (None when
    unset); ``choice``: the option ``guest_discard``; ``no_unref``: this
    host's QEMU and libvirt have qcow2's discard-no-unref
    (disk.hostcaps).

    Without ``unmap`` from nova, or with ``reclaim``, nova's value stands.
    Otherwise what a discard would take from what ``mode`` reserved is
    kept:

    - qcow2, mode metadata: the clusters' place in the image. Where the
      host has discard-no-unref, ``unmap`` with it keeps that place and
      drops the data (the mode reserves no data blocks); elsewhere
      ``ignore``.
    - qcow2, modes space and full: the clusters' place and the file's
      blocks. ``keep``: ``ignore``. ``zero``, where the host has
      discard-no-unref: ``unmap`` with it, which drops the data and keeps
      the place, but lets QEMU punch the file under the range (libvirt
      sets the same ``discard`` on the file node and cannot say
      ``pass-discard-request=off``): the caller reserves those blocks
      again (``reserve_again``). Elsewhere as ``keep``.
    - raw, modes space and full: the file's blocks: ``ignore``. A raw disk
      of mode metadata is thin and has nothing to lose.
    """
    if nova_discard != 'unmap' or choice == 'reclaim':
        return GuestDiscard(nova_discard)
    if fmt is DiskFormat.QCOW2:
        if not mode.preallocates:
            return GuestDiscard(nova_discard)
        if no_unref and (mode is Mode.METADATA or choice == 'zero'):
            return GuestDiscard('unmap', no_unref=True,
                                reserve_again=mode is not Mode.METADATA)
        return GuestDiscard('ignore')
    if mode in (Mode.SPACE, Mode.FULL):
        return GuestDiscard('ignore')
    return GuestDiscard(nova_discard)


def _none_plan(fmt, virtual_size, existing):
    """Mode none: exactly what stock nova makes.

    A plain overlay (nova's cluster choice, which is the base's cluster or
    QEMU's 64K), no extended_l2, no ``<metadata_cache>``, no free-space
    check, no fallocate probe and no extra qemu-img run. An extended_l2
    overlay was measured at 0.35x nova's on dense sequential 4 KiB writes
    at queue depth 16 (each write into a fresh 2K subcluster pays a
    sub-cluster allocation QEMU cannot merge): users who keep the default
    mode must not pay for a layout they did not ask for.
    """
    if fmt is DiskFormat.RAW:
        return DiskPlan(mode=Mode.NONE, fmt=fmt, virtual_size=virtual_size,
                        raw_action=RawAction.NOTHING, preallocation=None,
                        cluster_size=None, extended_l2=None, needed_bytes=0,
                        metadata_cache_bytes=None, warning=None,
                        existing=existing is not None)
    return DiskPlan(
        mode=Mode.NONE, fmt=fmt, virtual_size=virtual_size, raw_action=None,
        preallocation=Qcow2Preallocation.OFF, cluster_size=None,
        extended_l2=False,
        needed_bytes=qcow2_layout.qcow2_thin_bytes(
            virtual_size, qcow2_layout.QEMU_DEFAULT_CLUSTER,
                                      False),
        metadata_cache_bytes=None, warning=None,
        existing=existing is not None)


def _no_fallocate(opts, fs, path, what_thin):
    """(fallback, warning) for mode space on a filesystem without
    fallocate(2), per ``fallocate_unsupported``; 'fail' raises.
    """
    policy = opts.fallocate_unsupported
    if policy == 'fail':
        raise exception.FallocateUnsupported(path=path, fstype=fs.fstype)
    if policy == 'zero-fill':
        return 'zero-fill', None
    return 'warn', ('filesystem without fallocate(2) (%s): %s '
                    '([prealloc_backend] fallocate_unsupported=warn)'
                    % (fs.fstype, what_thin))


def _raw_action(mode, opts, fs, path):
    if mode in (Mode.NONE, Mode.METADATA):
        # raw has no metadata: metadata mode has nothing to do.
        return RawAction.NOTHING, None
    if mode is Mode.FULL:
        return RawAction.ZERO_FILL, None
    if fs.fallocate_ok:
        return RawAction.FALLOCATE, None
    fallback, warning = _no_fallocate(opts, fs, path, 'disk left thin')
    if fallback == 'zero-fill':
        return RawAction.ZERO_FILL, None
    return RawAction.NOTHING, warning


def _qcow2_preallocation(mode, opts, fs, path, backing, extended_l2):
    preallocation = QCOW2_PREALLOCATION[mode]
    warning = None
    if mode is Mode.SPACE and not fs.fallocate_ok:
        # QEMU would emulate falloc by writing zeros (slow); metadata
        # preallocation keeps most of the first-write speed for free.
        fallback, warning = _no_fallocate(
            opts, fs, path,
            'created with preallocation=metadata instead of falloc')
        preallocation = (Qcow2Preallocation.FULL if fallback == 'zero-fill'
                         else Qcow2Preallocation.METADATA)
    if (backing and preallocation is not Qcow2Preallocation.OFF and
            not extended_l2):
        warning = ('no extended_l2: QEMU cannot preallocate an overlay with '
                   'a backing file without it, so it stays thin (mode %s '
                   'not applied)' % mode.value)
        preallocation = Qcow2Preallocation.OFF
    return preallocation, warning


def make_plan(opts, extra_specs, mode, fmt, virtual_size, fs,
              backing=True, existing=None, path='the disk'):
    """The plan for one disk.

    ``opts`` is ``CONF.prealloc_backend``, ``extra_specs`` the flavor's dict
    (or None; its ``prealloc:cluster_size`` is read here), ``mode`` the
    disk's Mode as the caller decided it once (modes.disk_mode: the
    flavor's ``prealloc:mode`` or the host's), ``fmt`` a DiskFormat, ``fs`` the
    FsFacts of the disk's filesystem (may be None when the disk's mode is
    none: nothing is probed then), ``backing`` whether a qcow2 disk has a
    backing file, ``existing`` an ExistingDisk for a disk already there,
    ``path`` the disk's path (for messages only).

    Raises InvalidFlavorPolicy for a bad extra spec, FallocateUnsupported
    for a new disk in mode space on a filesystem without fallocate(2) when
    ``fallocate_unsupported = fail``. Never raises for space: ``fits``
    says whether ``to_allocate`` fits, and an existing disk that does not
    fit is planned thin, with a warning (it is never failed for space).
    """
    fmt = DiskFormat(fmt)
    mode = Mode(mode)
    if mode is Mode.NONE:
        return _none_plan(fmt, virtual_size, existing)
    if fs is None:
        raise ValueError('make_plan needs the filesystem facts in mode %s'
                         % mode.value)
    if existing is not None and opts.fallocate_unsupported == 'fail':
        # An existing instance (hard reboot, evacuation) is never failed
        # for what a new disk would be refused for: warn and keep it thin.
        opts = _Override(opts, fallocate_unsupported='warn')
    raw_action = preallocation = cluster = extended_l2 = None
    if fmt is DiskFormat.RAW:
        raw_action, warning = _raw_action(mode, opts, fs, path)
        needed = virtual_size if raw_action is not RawAction.NOTHING else 0
        cache = None
    else:
        if existing is not None:
            cluster = (existing.cluster_size or
                       qcow2_layout.QEMU_DEFAULT_CLUSTER)
            extended_l2 = bool(existing.extended_l2)
        else:
            extended_l2 = bool(opts.qcow2_extended_l2)
            cluster = qcow2_layout.chosen_cluster_size(opts, extra_specs)
        preallocation, warning = _qcow2_preallocation(
            mode, opts, fs, path, backing, extended_l2)
        needed = qcow2_layout.qcow2_needed_bytes(virtual_size, preallocation,
                                                 cluster, extended_l2)
        cache = qcow2_layout.metadata_cache_for(opts, virtual_size, cluster,
                                                extended_l2)
    to_allocate = _to_allocate(needed, fmt, virtual_size, preallocation,
                               cluster, extended_l2, existing)
    plan = DiskPlan(mode=mode, fmt=fmt, virtual_size=virtual_size,
                    raw_action=raw_action, preallocation=preallocation,
                    cluster_size=cluster, extended_l2=extended_l2,
                    needed_bytes=needed, metadata_cache_bytes=cache,
                    warning=warning, to_allocate=to_allocate,
                    fits=to_allocate <= fs.free_bytes,
                    existing=existing is not None)
    if plan.fits or existing is None:
        return plan
    return _left_thin(plan, fs, existing)


def layout_shown(opts, mode, fmt):
    """Whether the guest XML of a disk of this Mode and DiskFormat depends
    on its layout as it is (disk_as_is's ``existing``): a qcow2 disk of a
    preallocating mode, where ``<metadata_cache>`` or ``<blockio>`` is on.
    Elsewhere the layout need not be read.
    """
    return (DiskFormat(fmt) is DiskFormat.QCOW2 and mode.preallocates and
            (opts.qcow2_l2_cache == 'full-coverage' or
             opts.advertise_physical_block_size))


def disk_as_is(opts, mode, fmt, existing=None):
    """The plan of a disk as it is, for its guest XML: nothing to allocate
    or change. ``mode`` is the disk's Mode (modes.disk_mode), ``fmt`` its
    DiskFormat, ``existing`` the ExistingDisk of a qcow2 disk whose layout
    was read (else None): its ``<metadata_cache>``
    (qcow2_layout.metadata_cache_for) unless the mode is none, and its
    ``<blockio>`` (qcow2_layout.physical_block_size).
    """
    fmt = DiskFormat(fmt)
    if fmt is not DiskFormat.QCOW2:
        existing = None   # only a qcow2 disk's layout is ever read
    cache = None
    if existing is not None and mode.preallocates:
        cache = qcow2_layout.metadata_cache_for(opts, existing.virtual_size,
                                   existing.cluster_size,
                                   existing.extended_l2)
    return DiskPlan(
        mode=mode, fmt=fmt,
        virtual_size=existing.virtual_size if existing else 0,
        raw_action=None, preallocation=None,
        cluster_size=existing.cluster_size if existing else None,
        extended_l2=existing.extended_l2 if existing else None,
        needed_bytes=0, metadata_cache_bytes=cache, warning=None,
        existing=existing is not None,
        physical_block_size=qcow2_layout.physical_block_size(opts, mode,
                                                     existing))


def _to_allocate(needed, fmt, virtual_size, preallocation, cluster,
                 extended_l2, existing):
    if existing is None:
        return needed
    missing = needed - existing.allocated_bytes
    if fmt is DiskFormat.QCOW2 and virtual_size > existing.virtual_size:
        # Growing: at least what the larger layout adds, even when guest
        # data already fills the file beyond the old layout's needs.
        missing = max(missing, needed - qcow2_layout.qcow2_needed_bytes(
            existing.virtual_size, preallocation, cluster, extended_l2))
    return max(0, missing)


def _left_thin(plan, fs, existing):
    """An existing disk without room to preallocate: left thin, warned."""
    warning = ('not enough free space to preallocate this existing disk '
               '(%d bytes needed, %d free): left thin' %
               (plan.to_allocate, fs.free_bytes))
    if plan.fmt is DiskFormat.RAW:
        return dataclasses.replace(plan, raw_action=RawAction.NOTHING,
                                   needed_bytes=0, to_allocate=0, fits=True,
                                   warning=warning)
    thin = Qcow2Preallocation.OFF
    needed = qcow2_layout.qcow2_needed_bytes(plan.virtual_size, thin,
                                             plan.cluster_size,
                                             plan.extended_l2)
    to_allocate = _to_allocate(needed, plan.fmt, plan.virtual_size, thin,
                               plan.cluster_size, plan.extended_l2, existing)
    return dataclasses.replace(plan, preallocation=thin, needed_bytes=needed,
                               to_allocate=to_allocate, fits=True,
                               warning=warning)


class _Override:
    """``opts`` with some values replaced (oslo.config groups are
    read-only).
    """

    def __init__(self, opts, **values):
        self._opts = opts
        self._values = values

    def __getattr__(self, name):
        if name in self._values:
            return self._values[name]
        return getattr(self._opts, name)
