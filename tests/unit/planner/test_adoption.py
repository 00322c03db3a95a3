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

"""Which existing overlays adopt rewrites, and into what."""

from oslo_utils import units

from prealloc_backend.planner import adoption
from prealloc_backend.planner import diskplan
from prealloc_backend.planner.modes import Mode
from prealloc_backend.planner.qcow2_layout import Qcow2Preallocation as P
from tests import base

ROOMY = diskplan.FsFacts(fallocate_ok=True, fstype='xfs', free_bytes=units.Pi)
# nova's own overlay: 64 KiB clusters, no extended_l2, thin.
NOVA = diskplan.ExistingDisk(virtual_size=units.Gi, cluster_size=64 * units.Ki,
                             extended_l2=False, allocated_bytes=units.Mi)


def overlay(virtual_size, cluster_size, extended_l2, allocated_bytes):
    return diskplan.ExistingDisk(
        allocated_bytes=allocated_bytes, virtual_size=virtual_size,
        cluster_size=cluster_size, extended_l2=extended_l2)


class TestVerdict(base.TestCase):

    def verdict(self, mode, facts=NOVA, fs=ROOMY, specs=None):
        return adoption.verdict(base.CONF.prealloc_backend, specs, mode,
                                facts, fs, path='/i/disk')

    def plugin_made(self, mode, allocated):
        plan = diskplan.make_plan(base.CONF.prealloc_backend, None, mode,
                                  diskplan.DiskFormat.QCOW2, units.Gi, ROOMY)
        return overlay(units.Gi, plan.cluster_size,
                                     plan.extended_l2, allocated)

    def test_mode_none_is_always_at_policy(self):
        v = self.verdict(Mode.NONE)
        self.assertTrue(v.at_policy)
        self.assertIsNone(v.plan)

    def test_nova_overlay_adopted_in_space(self):
        v = self.verdict(Mode.SPACE)
        self.assertTrue(v.adopt)
        self.assertEqual(P.FALLOC, v.plan.preallocation)
        self.assertTrue(v.plan.extended_l2)
        self.assertIn('extended_l2 off, not on', v.reason)
        self.assertIn('not its virtual size', v.reason)

    def test_plugin_made_disk_is_at_policy(self):
        for mode, allocated in ((Mode.SPACE, units.Gi + units.Mi),
                                (Mode.FULL, units.Gi + units.Mi),
                                (Mode.METADATA, 3 * units.Mi)):
            v = self.verdict(mode, facts=self.plugin_made(mode, allocated))
            self.assertTrue(v.at_policy, (mode, v))

    def test_layout_right_but_reservation_missing(self):
        # A plugin-made space disk whose blocks were freed (a guest's TRIM
        # under guest_discard = reclaim): adopted again.
        v = self.verdict(Mode.SPACE,
                         facts=self.plugin_made(Mode.SPACE, 500 * units.Mi))
        self.assertTrue(v.adopt)
        self.assertNotIn('cluster_size', v.reason)

    def test_no_room_is_refused_with_the_figures(self):
        small = diskplan.FsFacts(True, 'xfs', free_bytes=100 * units.Mi)
        v = self.verdict(Mode.SPACE, fs=small)
        self.assertFalse(v.adopt)
        self.assertTrue(v.refused)
        self.assertFalse(v.at_policy)
        self.assertIn('104857600 are', v.reason)

    def test_flavor_cluster_size_is_the_policy(self):
        specs = {'prealloc:cluster_size': '64K'}
        v = self.verdict(Mode.SPACE, specs=specs)
        self.assertEqual(64 * units.Ki, v.plan.cluster_size)
        self.assertNotIn('cluster_size', v.reason)

    def test_room_for_the_copied_data_where_nothing_is_reserved(self):
        data = overlay(units.Gi, 64 * units.Ki, False,
                                     allocated_bytes=300 * units.Mi)
        small = diskplan.FsFacts(True, 'xfs', free_bytes=200 * units.Mi)
        v = self.verdict(Mode.METADATA, facts=data, fs=small)
        self.assertTrue(v.refused, v)
        roomy = diskplan.FsFacts(True, 'xfs', free_bytes=400 * units.Mi)
        self.assertTrue(self.verdict(Mode.METADATA, facts=data,
                                     fs=roomy).adopt)

    def test_needed_is_the_room_the_replacement_takes(self):
        # What the command subtracts from the free space for an instance's
        # next disk: the plan's bytes, plus the copied data where the mode
        # reserves none.
        v = self.verdict(Mode.SPACE)
        self.assertEqual(v.plan.to_allocate, v.needed)
        self.assertGreaterEqual(v.needed, units.Gi)
        data = overlay(units.Gi, 64 * units.Ki, False,
                                     allocated_bytes=300 * units.Mi)
        v = self.verdict(Mode.METADATA, facts=data)
        self.assertEqual(v.plan.to_allocate + 300 * units.Mi, v.needed)
        # Two such disks in 500 MiB: the second is judged against what the
        # first leaves.
        fs = diskplan.FsFacts(True, 'xfs', free_bytes=500 * units.Mi)
        first = self.verdict(Mode.METADATA, facts=data, fs=fs)
        self.assertTrue(first.adopt)
        left = diskplan.FsFacts(True, 'xfs',
                                free_bytes=fs.free_bytes - first.needed)
        self.assertTrue(self.verdict(Mode.METADATA, facts=data,
                                     fs=left).refused)

    def test_cluster_size_alone_is_reason_enough(self):
        # Extended_l2 and the reservation right, the clusters nova's: the
        # table layout is what the plugin makes, so it is adopted.
        right = self.plugin_made(Mode.SPACE, units.Gi + units.Mi)
        facts = overlay(units.Gi, 64 * units.Ki,
                                      right.extended_l2, units.Gi + units.Mi)
        v = self.verdict(Mode.SPACE, facts=facts)
        self.assertTrue(v.adopt, v)
        self.assertEqual('mode space: cluster_size 65536, not %d'
                         % right.cluster_size, v.reason)

    def test_room_is_enough_when_it_is_exactly_what_is_needed(self):
        needed = self.verdict(Mode.SPACE).plan.to_allocate
        exact = diskplan.FsFacts(True, 'xfs', free_bytes=needed)
        self.assertTrue(self.verdict(Mode.SPACE, fs=exact).adopt)
        short = diskplan.FsFacts(True, 'xfs', free_bytes=needed - 1)
        self.assertTrue(self.verdict(Mode.SPACE, fs=short).refused)

    def test_no_fallocate_says_the_new_disk_does_not_reserve_either(self):
        self.flags(fallocate_unsupported='warn', group='prealloc_backend')
        fs = diskplan.FsFacts(False, 'nfs', free_bytes=units.Pi)
        v = self.verdict(Mode.SPACE, fs=fs)
        self.assertTrue(v.adopt)
        self.assertEqual(P.METADATA, v.plan.preallocation)
        self.assertIn('fallocate_unsupported=warn', v.reason)


class TestNovaDiskNames(base.TestCase):

    def test_only_the_disks_nova_makes_from_its_image_cache(self):
        for name in ('disk', 'disk.local', 'disk.swap', 'disk.eph0',
                     'disk.eph12'):
            self.assertTrue(adoption.is_nova_disk(name), name)
        # The config drive, the rescue disk, nova's disk.info, a copy.
        for name in ('disk.config', 'disk.rescue', 'disk.info',
                     'disk.swap.bak', 'disk.local~', 'disks', 'console.log',
                     'Disk', 'eph0'):
            self.assertFalse(adoption.is_nova_disk(name), name)
