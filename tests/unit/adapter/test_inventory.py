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

"""The DISK_GB inventory and trait the driver reports, on a real
instances_path holding disks the backend made, in nova's own ProviderTree.

Mocked, because the unit tier has no nova database or conductor: the one
query of the servers on this host (inventory.counted_flavors), answered
with FlavorDisks the test gives; tests/functional/test_placement_capacity.py
runs it for real.
"""

import os
from unittest import mock

import fixtures
from nova.compute import provider_tree
from oslo_utils import units
from oslo_utils import uuidutils

from prealloc_backend.adapter import inventory
from prealloc_backend.planner import capacity
from tests import base

GiB = units.Gi
NODE = 'node1'


def nova_disk_gb(total, reserved=0, ratio=1.0):
    return {'total': total, 'min_unit': 1, 'max_unit': total,
            'step_size': 1, 'allocation_ratio': ratio, 'reserved': reserved}


class TestUpdateProviderTree(base.BackendTestCase):

    def setUp(self):
        super().setUp()
        self.counted = {}
        self.lookup = self.useFixture(fixtures.MockPatch(
            'prealloc_backend.adapter.inventory.counted_flavors',
            side_effect=lambda context, host: dict(self.counted))).mock
        self.flags(images_type='qcow2', group='libvirt')
        self.flags(preallocate_images='space')
        inventory._last_counted.clear()
        inventory._warned_ratios.clear()
        inventory._last_decided.clear()
        inventory._logged_problems.clear()

    def tree(self, disk_gb):
        tree = provider_tree.ProviderTree()
        tree.new_root(NODE, uuidutils.generate_uuid())
        inv = {'MEMORY_MB': {'total': 1024, 'reserved': 0, 'min_unit': 1,
                             'max_unit': 1024, 'step_size': 1,
                             'allocation_ratio': 1.0}}
        if disk_gb is not None:
            inv['DISK_GB'] = disk_gb
        tree.update_inventory(NODE, inv)
        return tree

    def thin_disk(self):
        """A thin 1/4 GiB disk (a flavor's mode metadata) on this host,
        whose own mode (space) reserves.
        """
        img = self.image('qcow2', 'metadata')
        self.cache(img, size=GiB // 4)
        self.flags(mode=None, group='prealloc_backend')

    def fs(self):
        vfs = os.statvfs(self.instances_path)
        return vfs.f_blocks * vfs.f_frsize, vfs.f_bavail * vfs.f_frsize

    def test_reserving_host_reports_the_room_left(self):
        img = self.image('qcow2', 'space')
        self.cache(img, size=GiB // 4)
        uuid = self.instance.uuid
        # placement counts 1 GiB for it (its flavor).
        self.counted = {uuid: capacity.FlavorDisks(root=GiB)}
        size, _avail = self.fs()
        total = size // GiB
        tree = self.tree(nova_disk_gb(total, ratio=4.0))
        decision = inventory.update_provider_tree(tree, NODE)
        got = tree.data(NODE).inventory['DISK_GB']
        self.assertEqual(decision.inventory, got)
        self.assertEqual(1.0, got['allocation_ratio'])
        self.assertEqual(total, got['total'])
        room = decision.room
        disk = os.path.join(self.instances_path, uuid, 'disk')
        held = os.stat(disk).st_blocks * 512
        # The 1/4 GiB space disk already holds what it ever will, less than
        # the 1 GiB placement counts for it: nothing more is promised.
        self.assertEqual(0, room.promised)
        self.assertEqual(0, room.host_reserved)
        # Everything else the filesystem holds (statvfs read again here:
        # other writers on this machine may move it a little).
        size, avail = self.fs()
        self.assertAlmostEqual(size - avail - held, room.other,
                               delta=64 * units.Mi)
        # A new disk of the largest size offered needs its qcow2 metadata.
        largest = (size - room.other) // GiB * GiB
        self.assertAlmostEqual(
            capacity.eventual_bytes('qcow2', largest, 128 * units.Ki, True)
            - largest, room.new_disk_overhead, delta=units.Mi)
        # Offered: the room rounded down to whole GiB, placement's usage
        # (1 GiB for the server) taken.
        self.assertEqual((size - room.reserved) // GiB,
                         got['total'] - got['reserved'])
        offered = capacity.offered_bytes(got, GiB)
        self.assertLessEqual(offered, size - room.reserved - GiB)
        self.assertGreater(offered + GiB, size - room.reserved - GiB)
        self.assertIn(capacity.RESERVING_TRAIT, tree.data(NODE).traits)
        self.lookup.assert_called_once_with(mock.ANY, base.CONF.host)

    def test_thin_disk_promise_is_reserved(self):
        self.thin_disk()
        uuid = self.instance.uuid
        # nova's record says 1/4 GiB; placement counts 0 for it (a root_gb
        # 0 flavor): its whole eventual size is held back.
        self.counted = {uuid: capacity.FlavorDisks(root=0)}
        size, _avail = self.fs()
        tree = self.tree(nova_disk_gb(size // GiB))
        with_promise = inventory.update_provider_tree(tree, NODE)
        self.counted = {uuid: capacity.FlavorDisks(root=GiB)}
        without = inventory.update_provider_tree(self.tree(nova_disk_gb(
            size // GiB)), NODE)
        self.assertGreaterEqual(with_promise.room.promised, GiB // 4)
        self.assertLess(without.room.promised, units.Mi)
        self.assertGreaterEqual(with_promise.room.reserved,
                                without.room.reserved + GiB // 4 - units.Mi)

    def test_thin_host_keeps_novas_inventory_and_no_trait(self):
        self.flags(mode='metadata', group='prealloc_backend')
        disk_gb = nova_disk_gb(100, reserved=2, ratio=4.0)
        tree = self.tree(disk_gb)
        tree.add_traits(NODE, capacity.RESERVING_TRAIT)
        decision = inventory.update_provider_tree(tree, NODE)
        self.assertFalse(decision.changed)
        self.assertEqual(disk_gb, tree.data(NODE).inventory['DISK_GB'])
        self.assertNotIn(capacity.RESERVING_TRAIT, tree.data(NODE).traits)
        self.lookup.assert_not_called()

    def test_reporting_off_keeps_novas_inventory_with_the_trait(self):
        self.flags(disk_inventory='nova', group='prealloc_backend')
        disk_gb = nova_disk_gb(100, ratio=4.0)
        tree = self.tree(disk_gb)
        inventory.update_provider_tree(tree, NODE)
        self.assertEqual(disk_gb, tree.data(NODE).inventory['DISK_GB'])
        self.assertIn(capacity.RESERVING_TRAIT, tree.data(NODE).traits)

    def test_not_files_keeps_novas(self):
        self.flags(images_type='rbd', group='libvirt')
        disk_gb = nova_disk_gb(100)
        tree = self.tree(disk_gb)
        inventory.update_provider_tree(tree, NODE)
        self.assertEqual(disk_gb, tree.data(NODE).inventory['DISK_GB'])
        self.assertNotIn(capacity.RESERVING_TRAIT, tree.data(NODE).traits)

    def test_no_disk_gb_from_nova(self):
        tree = self.tree(None)
        decision = inventory.update_provider_tree(tree, NODE)
        self.assertNotIn('DISK_GB', tree.data(NODE).inventory)
        self.assertFalse(decision.changed)

    def test_ratio_warned_once(self):
        self.flags(disk_allocation_ratio=4.0)
        size, _avail = self.fs()
        log = self.useFixture(fixtures.FakeLogger())
        for _ in range(2):
            inventory.update_provider_tree(
                self.tree(nova_disk_gb(size // GiB, ratio=4.0)), NODE)
        self.assertEqual(1, log.output.count(
            '[DEFAULT] disk_allocation_ratio = 4.0 would let placement '
            'promise 4.0x'))

    def test_database_unreachable_uses_the_last_servers_known(self):
        self.thin_disk()
        uuid = self.instance.uuid
        size, _avail = self.fs()
        self.lookup.side_effect = RuntimeError('conductor timed out')
        strict = inventory.update_provider_tree(
            self.tree(nova_disk_gb(size // GiB)), NODE)
        # Nothing known yet: the disk counts whole.
        self.assertGreaterEqual(strict.room.promised, GiB // 4)
        self.lookup.side_effect = lambda context, host: {
            uuid: capacity.FlavorDisks(root=GiB)}
        known = inventory.update_provider_tree(
            self.tree(nova_disk_gb(size // GiB)), NODE)
        self.lookup.side_effect = RuntimeError('conductor timed out')
        again = inventory.update_provider_tree(
            self.tree(nova_disk_gb(size // GiB)), NODE)
        self.assertEqual(known.room.promised, again.room.promised)
        self.assertLess(again.room.promised, units.Mi)

    def test_unreadable_instances_path_offers_nothing_new(self):
        # Never read: everything reserved (nova's would promise the whole
        # filesystem, 4 times over), the ratio at most 1.0.
        self.flags(instances_path=os.path.join(self.instances_path, 'gone'))
        tree = self.tree(nova_disk_gb(100, ratio=4.0))
        decision = inventory.update_provider_tree(tree, NODE)
        self.assertEqual(nova_disk_gb(100, reserved=100, ratio=1.0),
                         tree.data(NODE).inventory['DISK_GB'])
        self.assertIsNone(decision.room)

    def test_failed_reading_keeps_the_last_decision(self):
        # Any error of the scan (here not an OSError: a disk.info the
        # parser chokes on would be one) neither escapes into nova's
        # update nor loosens what was decided from the last reading.
        size, _avail = self.fs()
        img = self.image('qcow2', 'space')
        self.cache(img, size=GiB // 4)
        read = inventory.update_provider_tree(
            self.tree(nova_disk_gb(size // GiB)), NODE)
        self.assertGreater(read.inventory['reserved'], 0)
        tree = self.tree(nova_disk_gb(size // GiB, ratio=2.0))
        with mock.patch.object(inventory.usage, 'scan_path',
                               side_effect=RuntimeError('boom')):
            failed = inventory.update_provider_tree(tree, NODE)
        self.assertEqual(read.inventory['reserved'],
                         tree.data(NODE).inventory['DISK_GB']['reserved'])
        self.assertEqual(1.0, failed.inventory['allocation_ratio'])

    def test_problems_warned_once_while_they_last(self):
        log = self.useFixture(fixtures.FakeLogger())
        size, _avail = self.fs()
        found = inventory.usage.scan_path(self.instances_path, 'qcow2')

        def scan(problems):
            return mock.patch.object(
                inventory.usage, 'scan_path',
                return_value=found.__class__(
                    fs=found.fs, disks=found.disks,
                    base_bytes=found.base_bytes,
                    base_files=found.base_files, problems=problems))

        for problems in (['a: EACCES'], ['a: EACCES'], [], ['a: EACCES']):
            with scan(problems):
                inventory.update_provider_tree(
                    self.tree(nova_disk_gb(size // GiB)), NODE)
        # Warned when seen, not while it stays, again once it came back.
        self.assertEqual(2, log.output.count('not read whole (a: EACCES)'))
        self.assertEqual({NODE: set(['a: EACCES'])},
                         inventory._logged_problems)


class TestCountedFlavors(base.TestCase):

    def test_flavor_disks_of_each_instance(self):
        inst = self.make_instance(root_gb=10, ephemeral_gb=2, swap=512)
        with mock.patch('nova.objects.InstanceList.get_by_host',
                        return_value=[inst]) as get:
            got = inventory.counted_flavors('ctx', 'host1')
        get.assert_called_once_with('ctx', 'host1',
                                    expected_attrs=['flavor'])
        self.assertEqual({inst.uuid: capacity.FlavorDisks(
            10 * GiB, 2 * GiB, GiB)}, got)
