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

"""The capacity placement is told, from given figures (no disk touched)."""

from oslo_utils import units

from prealloc_backend.planner import capacity
from prealloc_backend.planner import diskplan
from prealloc_backend.planner.modes import Mode
from prealloc_backend.planner import qcow2_layout
from tests import base

GiB = units.Gi
MiB = units.Mi
A = '11111111-1111-1111-1111-111111111111'
B = '22222222-2222-2222-2222-222222222222'


def nova_inv(total=100, reserved=0, ratio=1.0):
    return {'total': total, 'min_unit': 1, 'max_unit': total,
            'step_size': 1, 'allocation_ratio': ratio, 'reserved': reserved}


class TestGroups(base.TestCase):

    def test_disk_group(self):
        self.assertIs(capacity.Group.ROOT, capacity.disk_group('disk'))
        self.assertIs(capacity.Group.EPHEMERAL,
                      capacity.disk_group('disk.local'))
        self.assertIs(capacity.Group.EPHEMERAL,
                      capacity.disk_group('disk.eph12'))
        self.assertIs(capacity.Group.SWAP, capacity.disk_group('disk.swap'))
        for other in ('disk.config', 'disk.rescue', 'disk.info',
                      'console.log', 'disk.ephx', 'disk.prealloc-journal'):
            self.assertIsNone(capacity.disk_group(other), other)

    def test_flavor_disks_as_placement_counts_them(self):
        f = capacity.FlavorDisks.of_flavor(20, 5, 512)
        # swap: 512 MiB counted as a whole GiB (resources_from_flavor).
        self.assertEqual((20 * GiB, 5 * GiB, GiB), (f.root, f.ephemeral,
                                                    f.swap))
        self.assertEqual(26 * GiB, f.total)
        self.assertEqual(0, capacity.FlavorDisks.of_flavor(
            20, 0, 0, volume_backed=True).root)
        self.assertEqual(capacity.FlavorDisks(),
                         capacity.FlavorDisks.of_flavor(None, None, None))


class TestEventual(base.TestCase):

    def test_raw_is_its_size(self):
        self.assertEqual(GiB + 1, capacity.eventual_bytes('raw', GiB + 1))

    def test_qcow2_is_data_and_all_metadata(self):
        cluster = 128 * units.Ki
        got = capacity.eventual_bytes('qcow2', GiB, cluster, True)
        meta = qcow2_layout.qcow2_metadata_bytes(GiB, cluster, True)
        self.assertEqual(GiB + meta, got)
        # What a space overlay of that size needs (diskplan's figure).
        self.assertEqual(qcow2_layout.qcow2_needed_bytes(
            GiB, qcow2_layout.Qcow2Preallocation.FALLOC, cluster, True), got)
        # A cluster size unknown: qemu-img's default.
        self.assertEqual(
            capacity.eventual_bytes('qcow2', GiB, 64 * units.Ki),
            capacity.eventual_bytes('qcow2', GiB))


class TestPromised(base.TestCase):

    def test_thin_disk_promises_the_rest_of_its_flavor(self):
        # A 10 GiB root disk holding 1 GiB, eventually 10 GiB + 2 MiB of
        # metadata; placement counts 10 GiB for it: the metadata to come
        # is promised beyond placement's count.
        disks = [capacity.DiskUse(A, 'disk', GiB, 10 * GiB + 2 * MiB)]
        counted = {A: capacity.FlavorDisks(root=10 * GiB)}
        self.assertEqual(2 * MiB, capacity.promised_bytes(disks, counted))

    def test_preallocated_disk_beyond_its_flavor(self):
        disks = [capacity.DiskUse(A, 'disk', 10 * GiB + 3 * MiB,
                                  10 * GiB + 2 * MiB)]
        counted = {A: capacity.FlavorDisks(root=10 * GiB)}
        self.assertEqual(3 * MiB, capacity.promised_bytes(disks, counted))

    def test_never_gives_back_what_placement_overcounts(self):
        # 512 MiB swap counted as 1 GiB: nothing returned.
        disks = [capacity.DiskUse(A, 'disk.swap', 512 * MiB, 512 * MiB)]
        counted = {A: capacity.FlavorDisks(swap=GiB)}
        self.assertEqual(0, capacity.promised_bytes(disks, counted))

    def test_ephemerals_share_ephemeral_gb(self):
        disks = [capacity.DiskUse(A, 'disk.eph0', GiB, 2 * GiB),
                 capacity.DiskUse(A, 'disk.eph1', GiB, 3 * GiB)]
        counted = {A: capacity.FlavorDisks(ephemeral=4 * GiB)}
        self.assertEqual(GiB, capacity.promised_bytes(disks, counted))

    def test_uncounted_server_counts_whole(self):
        # A disk placement holds nothing for here (a migration arriving, a
        # root_gb=0 flavor's root disk counts 0): all of it.
        disks = [capacity.DiskUse(B, 'disk', GiB, 5 * GiB),
                 capacity.DiskUse(A, 'disk', GiB, 5 * GiB)]
        counted = {A: capacity.FlavorDisks(root=0)}
        self.assertEqual(10 * GiB, capacity.promised_bytes(disks, counted))


class TestRoom(base.TestCase):

    def test_room_sums_what_is_not_for_new_disks(self):
        fs = capacity.FsFigures(size=100 * GiB, available=60 * GiB)
        # 40 GiB used: a 10 GiB space disk (held), 30 GiB of other files.
        disks = [capacity.DiskUse(A, 'disk', 10 * GiB + MiB,
                                  10 * GiB + MiB),
                 # a thin 20 GiB disk holding 1 GiB
                 capacity.DiskUse(B, 'disk', 0, 20 * GiB)]
        counted = {A: capacity.FlavorDisks(root=10 * GiB),
                   B: capacity.FlavorDisks(root=20 * GiB)}
        r = capacity.room(fs, disks, counted, 2 * GiB,
                          overhead=lambda size: size // 1000)
        self.assertEqual(30 * GiB - MiB, r.other)
        self.assertEqual(MiB, r.promised)
        self.assertEqual(2 * GiB, r.host_reserved)
        # Largest new disk: 100 - 32 = 68 GiB -> its overhead.
        self.assertEqual(68 * GiB // 1000, r.new_disk_overhead)
        self.assertEqual(32 * GiB + 68 * GiB // 1000, r.reserved)
        # Left once placement's 30 GiB of usage is taken.
        self.assertEqual(100 * GiB - r.reserved - 30 * GiB, r.reservable)

    def test_no_overhead_on_a_full_filesystem(self):
        fs = capacity.FsFigures(size=10 * GiB, available=0)
        r = capacity.room(fs, [], {}, 0,
                          overhead=lambda size: self.fail('called'))
        self.assertEqual(0, r.new_disk_overhead)
        self.assertEqual(0, r.reservable)

    def test_held_beyond_used_never_negative(self):
        # statvfs and the stats are read at different times.
        fs = capacity.FsFigures(size=10 * GiB, available=9 * GiB)
        disks = [capacity.DiskUse(A, 'disk', 2 * GiB, 2 * GiB)]
        r = capacity.room(fs, disks, {A: capacity.FlavorDisks(root=2 * GiB)},
                          -5)
        self.assertEqual(0, r.other)
        self.assertEqual(0, r.host_reserved)

    def test_new_disk_overhead_is_the_plans(self):
        opts = base.CONF.prealloc_backend
        qcow2 = capacity.new_disk_overhead(opts, Mode.SPACE,
                                           diskplan.DiskFormat.QCOW2)
        meta = qcow2_layout.qcow2_metadata_bytes(
            10 * GiB, qcow2_layout.DEFAULT_CLUSTER, True)
        self.assertEqual(meta, qcow2(10 * GiB))
        raw = capacity.new_disk_overhead(opts, Mode.FULL,
                                         diskplan.DiskFormat.RAW)
        self.assertEqual(0, raw(10 * GiB))


class TestInventory(base.TestCase):

    FS = capacity.FsFigures(size=100 * GiB + 300 * MiB,
                            available=60 * GiB)

    def room(self, reserved):
        return capacity.Room(other=reserved, promised=0, host_reserved=0,
                             new_disk_overhead=0, reserved=reserved)

    def test_not_reserving_keeps_nova(self):
        inv = nova_inv(ratio=4.0, reserved=3)
        d = capacity.inventory(inv, False, self.FS, self.room(GiB))
        self.assertEqual(inv, d.inventory)
        self.assertFalse(d.changed)
        self.assertIsNone(d.ratio_overridden)
        self.assertIsNot(inv, d.inventory)

    def test_no_nova_inventory(self):
        d = capacity.inventory(None, True, self.FS, self.room(GiB))
        self.assertIsNone(d.inventory)
        self.assertFalse(d.changed)

    def test_no_figures_keeps_nova(self):
        d = capacity.inventory(nova_inv(), True)
        self.assertEqual(nova_inv(), d.inventory)
        self.assertFalse(d.changed)

    def test_reserved_leaves_the_room_rounded_down(self):
        # 100 GiB + 300 MiB filesystem, 40.5 GiB not for new disks: 59.79
        # GiB of room, offered as 59.
        d = capacity.inventory(nova_inv(total=100), True, self.FS,
                               self.room(40 * GiB + 512 * MiB))
        self.assertEqual(41, d.inventory['reserved'])
        self.assertEqual(100, d.inventory['total'])
        self.assertEqual(100, d.inventory['max_unit'])
        self.assertEqual(1.0, d.inventory['allocation_ratio'])
        self.assertTrue(d.changed)
        offered = capacity.offered_bytes(d.inventory, 0)
        self.assertLessEqual(offered, self.FS.size - 40 * GiB - 512 * MiB)
        self.assertGreater(offered + GiB,
                           self.FS.size - 40 * GiB - 512 * MiB)

    def test_nova_total_larger_than_the_filesystem(self):
        # nova's total is kept whatever it is (a test harness's figure):
        # reserved absorbs the difference.
        d = capacity.inventory(nova_inv(total=128), True, self.FS,
                               self.room(40 * GiB))
        self.assertEqual(128 - 60, d.inventory['reserved'])

    def test_never_below_novas_reserved(self):
        d = capacity.inventory(nova_inv(reserved=50), True, self.FS,
                               self.room(GiB))
        self.assertEqual(50, d.inventory['reserved'])

    def test_never_above_total(self):
        d = capacity.inventory(nova_inv(total=100), True, self.FS,
                               self.room(200 * GiB))
        self.assertEqual(100, d.inventory['reserved'])
        self.assertEqual(0, capacity.offered_bytes(d.inventory, 0))

    def test_ratio_above_one_lowered_below_one_kept(self):
        d = capacity.inventory(nova_inv(ratio=4.0), True, self.FS,
                               self.room(GiB))
        self.assertEqual(1.0, d.inventory['allocation_ratio'])
        self.assertEqual(4.0, d.ratio_overridden)
        d = capacity.inventory(nova_inv(ratio=0.9), True, self.FS,
                               self.room(GiB))
        self.assertEqual(0.9, d.inventory['allocation_ratio'])
        self.assertIsNone(d.ratio_overridden)

    def test_unchanged_when_nova_already_says_so(self):
        inv = nova_inv(total=100, reserved=41)
        d = capacity.inventory(inv, True, self.FS,
                               self.room(40 * GiB + 512 * MiB))
        self.assertFalse(d.changed)

    def test_offered_bytes(self):
        self.assertEqual(0, capacity.offered_bytes(None, 0))
        inv = nova_inv(total=10, reserved=2, ratio=4.0)
        self.assertEqual(32 * GiB - 5 * GiB,
                         capacity.offered_bytes(inv, 5 * GiB))


class TestPolicy(base.TestCase):

    def test_reserves(self):
        self.assertEqual([False, False, True, True],
                         [capacity.reserves(m) for m in Mode])

    def test_raw_at_policy(self):
        self.assertTrue(capacity.raw_at_policy(Mode.METADATA, 0, GiB))
        self.assertTrue(capacity.raw_at_policy(Mode.NONE, 0, GiB))
        self.assertFalse(capacity.raw_at_policy(Mode.SPACE, GiB - 4096, GiB))
        self.assertTrue(capacity.raw_at_policy(Mode.FULL, GiB, GiB))
