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

"""Whether an existing qcow2 overlay is at the host's policy, and the disk
that would replace it: one pure decision per disk, for ``prealloc-backend
adopt``.

A disk is at policy when its layout (cluster size, extended_l2) is the one
``diskplan.make_plan`` gives a new disk of its mode and flavor, and, in the
modes that reserve data blocks (space, full), its file holds at least its
virtual size. Mode none is always at policy: nova's own overlay is what
that mode makes. Nothing here touches a disk.
"""

import dataclasses

from prealloc_backend.planner import diskplan
from prealloc_backend.planner.modes import Mode
from prealloc_backend.planner.qcow2_layout import Qcow2Preallocation


# nova's names of the disks it makes from its image cache: the disks
# adoption looks at.
DISK_NAMES = ('disk', 'disk.local', 'disk.swap')
DISK_PREFIXES = ('disk.eph',)


def is_nova_disk(name):
    """Whether the file ``name`` of an instance directory is one of the
    disks nova makes from its image cache (disk, disk.local, disk.eph*,
    disk.swap).
    """
    return name in DISK_NAMES or name.startswith(DISK_PREFIXES)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """``adopt``: the disk is not at policy and ``plan`` (a DiskPlan of a
    new overlay of its mode, flavor and size) fits in the free space;
    ``reason`` says why, in words for the operator. A disk not at policy
    that cannot be adopted here (no room, a refused filesystem) has
    ``adopt`` False and ``refused`` True. The room needed is the plan's
    plus, in modes that reserve no data blocks, the data the copy writes.
    """
    adopt: bool
    reason: str
    plan: diskplan.DiskPlan | None = None
    refused: bool = False
    # The bytes the replacement takes from the free space.
    needed: int = 0

    @property
    def at_policy(self):
        return not self.adopt and not self.refused


def reserves(plan):
    """True when the plan's overlay holds its data blocks (space, full)."""
    return plan.preallocation in (Qcow2Preallocation.FALLOC,
                                  Qcow2Preallocation.FULL)


def verdict(opts, extra_specs, mode, facts, fs, path='the disk'):
    """The Verdict for the overlay at ``path`` whose diskplan.ExistingDisk
    is ``facts`` (its reading: disk.qemu.ImageInfo.existing),
    of Mode ``mode`` (modes.disk_mode: its flavor's or the host's) on a
    filesystem with FsFacts ``fs``. May raise what make_plan raises for a
    new disk (InvalidFlavorPolicy, FallocateUnsupported).
    """
    mode = Mode(mode)
    if mode is Mode.NONE:
        return Verdict(False, 'mode none: nova\'s own overlay is the policy')
    plan = diskplan.make_plan(opts, extra_specs, mode,
                              diskplan.DiskFormat.QCOW2, facts.virtual_size,
                              fs, backing=True, path=path)
    wrong = []
    if facts.cluster_size != plan.cluster_size:
        wrong.append('cluster_size %d, not %d' % (facts.cluster_size,
                                                 plan.cluster_size))
    if facts.extended_l2 != plan.extended_l2:
        wrong.append('extended_l2 %s, not %s' % (
            'on' if facts.extended_l2 else 'off',
            'on' if plan.extended_l2 else 'off'))
    if reserves(plan) and facts.allocated_bytes < facts.virtual_size:
        wrong.append('%d bytes reserved, not its virtual size %d' %
                     (facts.allocated_bytes, facts.virtual_size))
    if not wrong:
        return Verdict(False, 'at the policy of mode %s' % mode.value)
    why = 'mode %s: %s' % (mode.value, '; '.join(wrong))
    # The copy writes the guest's data into the new file: where the mode
    # reserves no data blocks, they come on top of what the plan needs
    # (its check would let the copy take the room the guest writes into).
    needed = plan.to_allocate
    if not reserves(plan):
        needed += facts.allocated_bytes
    if needed > fs.free_bytes:
        return Verdict(False, '%s; its replacement needs %d bytes free, %d '
                              'are' % (why, needed, fs.free_bytes),
                       plan=plan, refused=True, needed=needed)
    if reserves(plan) is False and mode in (Mode.SPACE, Mode.FULL):
        # fallocate_unsupported = warn on this filesystem: the new disk
        # would not reserve either; its layout alone is worth a copy.
        why += ' (%s)' % plan.warning if plan.warning else ''
    return Verdict(True, why, plan=plan, needed=needed)
