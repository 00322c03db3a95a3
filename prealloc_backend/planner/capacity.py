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

"""What the instances filesystem can still reserve, and what placement is
told: pure arithmetic on figures measured elsewhere.

Placement counts each server's flavor (root, ephemeral and swap GiB)
against ``total - reserved`` of the host's DISK_GB inventory, times its
allocation ratio. nova reports the filesystem's size as ``total`` and
``reserved_host_disk_mb`` as ``reserved``: it sees neither the files that
are not instance disks (base images, logs, anything else on the
filesystem), nor the room a thin disk will still take, nor qcow2 metadata.
On a host whose mode reserves (space, full), ``inventory`` moves all of that
into ``reserved``, so that what placement still offers is what a new disk
could really reserve here, to placement's 1 GiB step, and never more::

    used       = size - available (f_blocks - f_bavail: every block an
                 unprivileged process cannot have, root's reserve included)
    held       = what the instance disks of this host hold (st_blocks)
    promised   = for each server placement counts here, per flavor disk
                 (root, ephemeral, swap): what its files will hold once
                 fully written (virtual size, plus a qcow2 disk's whole
                 metadata), or hold now if more, less what placement counts
                 for that disk (never below 0); for a disk of a server
                 placement does not count here, all of it
    reserved   = (used - held) + promised + reserved_host_disk_mb
                 + the qcow2 metadata one new disk needs beyond its size

``reserved`` is then expressed in whole GiB so that ``(total - reserved) -
usage`` is the room left rounded down: ``reserved_gb = total_gb -
floor((size - reserved_bytes) / GiB)``, one rounding in all. It never goes
below nova's own ``reserved`` nor above ``total`` (placement accepts
``reserved == total`` from microversion 1.26, which nova uses). The ratio
is at most 1.0: a ratio above it would promise what the mode then refuses.

Nothing here touches a disk or talks to a service.
"""

import dataclasses
import enum

from oslo_utils import units

from prealloc_backend.planner import diskplan
from prealloc_backend.planner.modes import Mode
from prealloc_backend.planner import qcow2_layout

GiB = units.Gi

# The trait of a compute node whose mode reserves its disks' space (space,
# full): flavors that ask for space or full require it
# (trait:CUSTOM_PREALLOC_RESERVING=required), so that placement's
# capacity, which the plugin keeps real on such hosts, is what they are
# scheduled on.
RESERVING_TRAIT = 'CUSTOM_PREALLOC_RESERVING'

# nova's DISK_GB resource class.
DISK_GB = 'DISK_GB'


class Group(enum.Enum):
    """The flavor disk a file of an instance directory is, as placement
    counts it: root_gb, ephemeral_gb (every ephemeral disk together),
    swap (MiB, counted in whole GiB).
    """
    ROOT = 'root'
    EPHEMERAL = 'ephemeral'
    SWAP = 'swap'


def disk_group(name):
    """The Group of the file ``name`` of an instance directory, or None
    for anything that is not a flavor disk (disk.config, disk.rescue,
    console.log, disk.info, a journal...).
    """
    if name == 'disk':
        return Group.ROOT
    if name == 'disk.local' or (name.startswith('disk.eph') and
                                name[len('disk.eph'):].isdigit()):
        return Group.EPHEMERAL
    if name == 'disk.swap':
        return Group.SWAP
    return None


@dataclasses.dataclass(frozen=True)
class FlavorDisks:
    """What placement counts for one server on this host, in bytes per
    Group (nova's resources_from_flavor: root_gb unless booted from a
    volume, ephemeral_gb, swap rounded up to whole GiB).
    """
    root: int = 0
    ephemeral: int = 0
    swap: int = 0

    @classmethod
    def of_flavor(cls, root_gb, ephemeral_gb, swap_mb, volume_backed=False):
        return cls(root=0 if volume_backed else int(root_gb or 0) * GiB,
                   ephemeral=int(ephemeral_gb or 0) * GiB,
                   swap=-(-int(swap_mb or 0) // 1024) * GiB)

    def counted(self, group):
        return {Group.ROOT: self.root, Group.EPHEMERAL: self.ephemeral,
                Group.SWAP: self.swap}[group]

    @property
    def total(self):
        return self.root + self.ephemeral + self.swap


@dataclasses.dataclass(frozen=True)
class DiskUse:
    """One flavor disk file of an instance directory."""
    instance: str           # the directory's name: the instance's UUID
    name: str               # disk, disk.local, disk.eph0, disk.swap
    allocated: int          # st_blocks * 512 now
    eventual: int           # what it holds once fully written

    @property
    def group(self):
        return disk_group(self.name)


def eventual_bytes(fmt, virtual_size, cluster_size=None, extended_l2=False):
    """What a disk holds once every byte of it is written: a raw file its
    size; a qcow2 image its clusters plus all of its metadata (header, L1,
    L2 and refcount tables), as qemu-img measure counts them.
    """
    if diskplan.DiskFormat(fmt) is diskplan.DiskFormat.RAW:
        return virtual_size
    cluster = cluster_size or qcow2_layout.QEMU_DEFAULT_CLUSTER
    data = -(-virtual_size // cluster) * cluster
    return data + qcow2_layout.qcow2_metadata_bytes(virtual_size, cluster,
                                                    extended_l2)


def promised_bytes(disks, counted):
    """Bytes the instance disks of this host will still take beyond what
    placement counts for them.

    ``disks``: DiskUse of every flavor disk file found; ``counted``:
    {instance UUID: FlavorDisks} of the servers placement counts on this
    host. Per server and Group, the files' max(allocated, eventual) less
    placement's count for that Group, never below 0 (placement's own
    rounding, such as swap counted in whole GiB, is never given back). A
    disk of a server not in ``counted`` counts whole: placement holds
    nothing for it here.
    """
    by_group = {}
    loose = 0
    for disk in disks:
        size = max(disk.allocated, disk.eventual)
        if disk.instance in counted and disk.group is not None:
            key = (disk.instance, disk.group)
            by_group[key] = by_group.get(key, 0) + size
        else:
            loose += size
    over = sum(max(0, size - counted[uuid].counted(group))
               for (uuid, group), size in by_group.items())
    return over + loose


@dataclasses.dataclass(frozen=True)
class FsFigures:
    """The instances filesystem (statvfs)."""
    size: int           # f_blocks * f_frsize
    available: int      # f_bavail * f_frsize: what nova's user may take

    @property
    def used(self):
        return self.size - self.available


@dataclasses.dataclass(frozen=True)
class Room:
    """How ``reserved`` was reached, in bytes (for logs, check and the
    report).
    """
    other: int              # used - held: files that are not flavor disks
    promised: int           # promised_bytes
    host_reserved: int      # reserved_host_disk_mb
    new_disk_overhead: int  # qcow2 metadata of a new disk of the offer
    reserved: int           # the sum: bytes placement must not offer
    # What is left for new disks once placement's own usage is taken
    # (None when the usage is not known to the caller).
    reservable: int = None


def room(fs, disks, counted, host_reserved_bytes, overhead=None):
    """The Room of a host: ``fs`` its FsFigures, ``disks`` and ``counted``
    as promised_bytes takes them, ``host_reserved_bytes`` nova's
    reserved_host_disk_mb in bytes, ``overhead(size)`` the bytes a new disk
    of ``size`` needs beyond its size (new_disk_overhead), or None.
    """
    held = sum(d.allocated for d in disks)
    other = max(0, fs.used - held)
    promised = promised_bytes(disks, counted)
    before = other + promised + max(0, host_reserved_bytes)
    largest = max(0, (fs.size - before) // GiB * GiB)
    extra = overhead(largest) if overhead and largest else 0
    reserved = before + extra
    usage = sum(f.total for f in counted.values())
    return Room(other=other, promised=promised,
                host_reserved=max(0, host_reserved_bytes),
                new_disk_overhead=extra, reserved=reserved,
                reservable=max(0, fs.size - reserved - usage))


def new_disk_overhead(opts, mode, fmt):
    """``overhead(size)``: the bytes a new disk of ``size`` in ``mode`` and
    ``fmt`` needs beyond ``size`` (diskplan's needed bytes: a qcow2
    overlay's metadata; nothing for raw). The plan is made as on a
    filesystem with fallocate(2): without it a space disk is left thin and
    takes the same bytes later, as it fills.
    """
    fs = diskplan.FsFacts(fallocate_ok=True, fstype='any',
                          free_bytes=units.Ei)

    def overhead(size):
        plan = diskplan.make_plan(opts, None, mode, fmt, size, fs)
        return max(0, plan.needed_bytes - size)

    return overhead


def reserves(mode):
    """Whether a host of Mode ``mode`` keeps placement's capacity real."""
    return Mode(mode) in (Mode.SPACE, Mode.FULL)


@dataclasses.dataclass(frozen=True)
class Decision:
    """The DISK_GB inventory to report and why."""
    inventory: dict              # placement's fields
    changed: bool                # differs from nova's own
    room: Room = None            # None where nova's inventory stands
    ratio_overridden: float = None   # nova's ratio when above 1.0
    reason: str = ''


def inventory(nova_inventory, reserving, fs=None, room_=None):
    """The DISK_GB inventory for placement.

    ``nova_inventory``: the dict nova's driver made (total, reserved,
    min_unit, max_unit, step_size, allocation_ratio), or None when it
    reports none (no local disk figures); ``reserving``: the host's mode
    reserves and its disks are files the plugin makes; ``fs``: the
    FsFigures of instances_path; ``room_``: its Room.

    A host that does not reserve keeps nova's inventory (thin hosts may
    overcommit, by the operator's ratio). A reserving host keeps nova's
    total, max_unit and step, with ``reserved`` from the Room and a ratio
    of at most 1.0.
    """
    if nova_inventory is None:
        return Decision(None, False, reason='nova reports no DISK_GB here')
    if not reserving:
        return Decision(dict(nova_inventory), False,
                        reason="the host's mode does not reserve: nova's "
                               'inventory stands')
    if fs is None or room_ is None:
        return Decision(dict(nova_inventory), False,
                        reason='no filesystem figures: nova\'s inventory '
                               'stands')
    total = int(nova_inventory['total'])
    offered = max(0, (fs.size - room_.reserved) // GiB)
    return _reserving(nova_inventory, total - offered, room_,
                      'reserved = %(reserved)d GiB of %(total)d: %(left)d '
                      'GiB left for new disks before usage')


def unread(nova_inventory, last_reserved=None):
    """The DISK_GB inventory of a reserving host whose instances directory
    could not be read: ``last_reserved`` (GiB, the last decided here)
    where there is one, else all of it (placement offers nothing new
    there until a reading succeeds); never looser than nova's reserved,
    never a ratio above 1.0.
    """
    if nova_inventory is None:
        return Decision(None, False, reason='nova reports no DISK_GB here')
    return _reserving(
        nova_inventory,
        int(nova_inventory['total']) if last_reserved is None
        else int(last_reserved), None,
        'the instances directory could not be read: reserved %s'
        % ('as last decided' if last_reserved is not None else 'whole'))


def _reserving(nova_inventory, reserved, room_, reason):
    """A reserving host's Decision: nova's inventory with ``reserved``
    (GiB) kept between nova's own reserved and the total, and a ratio of
    at most 1.0. ``reason`` may name reserved, total and left.
    """
    total = int(nova_inventory['total'])
    reserved = max(reserved, int(nova_inventory.get('reserved') or 0))
    reserved = min(max(reserved, 0), total)
    ratio = float(nova_inventory.get('allocation_ratio') or 1.0)
    result = dict(nova_inventory, reserved=reserved,
                  allocation_ratio=min(ratio, 1.0))
    return Decision(result, result != nova_inventory, room=room_,
                    ratio_overridden=ratio if ratio > 1.0 else None,
                    reason=reason % {'reserved': reserved, 'total': total,
                                     'left': total - reserved})


def offered_bytes(inv, usage_bytes):
    """What placement still hands out for ``inv`` (a DISK_GB inventory)
    once ``usage_bytes`` (whole GiB) are allocated: ``(total - reserved) *
    allocation_ratio - usage``, in bytes.
    """
    if not inv:
        return 0
    capacity = int((inv['total'] - inv['reserved']) *
                   inv['allocation_ratio'])
    return capacity * GiB - usage_bytes


def raw_at_policy(mode, allocated, size):
    """Whether a raw disk has what its Mode asks: every byte's block in
    space and full (fallocate or zeros); anything in none and metadata.
    """
    if not reserves(mode):
        return True
    return allocated >= size
