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

"""prealloc_backend.adapter.migrationops: the room checks of a live
migration and an evacuation, the disks a block live migration makes, a raw disk
converted on arrival; real files and the real qemu-img, nova's fake
libvirt module standing in for libvirt-python (no hypervisor in this tier).
"""

import os

from nova.compute import task_states
from nova import exception as nova_exception
from nova import objects
from nova.tests.fixtures import libvirt as fakelibvirt
from nova.virt import fake as fake_virt
from oslo_utils import units

from prealloc_backend.adapter import driver
from prealloc_backend.adapter import migrationops
from prealloc_backend import exception
from prealloc_backend.planner import diskplan
from tests import base
from tests import fixtures as pb_fixtures


class TestRefusalEdges(base.TestCase):
    """Review findings of 2026-11-23: a refusal never turns into an error
    or a removal it should not be.
    """

    def test_missing_only_when_not_found(self):
        self.assertTrue(migrationops.missing(
            os.path.join(self.instances_path, 'absent')))
        self.assertFalse(migrationops.missing(self.instances_path))
        # A path that cannot be stat'ed for another reason (ENOTDIR here;
        # ESTALE or EIO on shared storage) is not 'new': never removed.
        afile = os.path.join(self.instances_path, 'file')
        open(afile, 'w').close()
        self.assertFalse(migrationops.missing(os.path.join(afile, 'below')))

    def test_room_check_that_cannot_stat_refuses(self):
        # nova's fake libvirt module stands in for libvirt-python.
        self.useFixture(fakelibvirt.LibvirtFixture())
        drv = driver.LibvirtDriver(fake_virt.FakeVirtAPI())
        self.flags(preallocate_images='space')
        gone = os.path.join(self.instances_path, 'gone')
        disk = os.path.join(gone, 'disk')
        exc = self.assertRaises(
            nova_exception.MigrationPreCheckError, migrationops.check_room,
            drv.image_backend, self.make_instance(),
            [(disk, diskplan.DiskFormat.RAW, units.Mi, False)], gone)
        self.assertIn(gone, exc.format_message())

    def test_standalone_qcow2_needs_no_room(self):
        disk_info = [
            {'path': '/src/i/disk', 'type': 'qcow2', 'backing_file': '',
             'virt_disk_size': units.Gi},
            {'path': '/src/i/disk.local', 'type': 'raw', 'backing_file': '',
             'virt_disk_size': units.Mi}]
        disks = migrationops.missing_disks(self.instances_path, disk_info)
        self.assertEqual(
            [(os.path.join(self.instances_path, 'disk.local'),
              diskplan.DiskFormat.RAW, units.Mi, False)], disks)

    def test_an_overlay_stays_qcow2_on_a_raw_host(self):
        # A qcow2 overlay block-migrated to a raw host is made (and its
        # room counted) as an overlay: the guest's XML says qcow2.
        self.flags(use_cow_images=False)
        disk_info = [
            {'path': '/src/i/disk', 'type': 'qcow2',
             'backing_file': '/src/_base/abc', 'virt_disk_size': units.Gi},
            {'path': '/src/i/disk.local', 'type': 'raw',
             'backing_file': '/src/_base/ephemeral_1_0706d66',
             'virt_disk_size': units.Mi}]
        disks = migrationops.missing_disks(self.instances_path, disk_info)
        self.assertEqual(
            [(os.path.join(self.instances_path, 'disk'),
              diskplan.DiskFormat.QCOW2, units.Gi, True),
             (os.path.join(self.instances_path, 'disk.local'),
              diskplan.DiskFormat.RAW, units.Mi, True)], disks)


class TestRoom(base.TestCase):

    def setUp(self):
        super().setUp()
        # nova's fake libvirt module stands in for libvirt-python.
        self.useFixture(fakelibvirt.LibvirtFixture())
        self.drv = driver.LibvirtDriver(fake_virt.FakeVirtAPI())
        self.flags(preallocate_images='space')
        self.disk = os.path.join(self.instances_path, 'i', 'disk')

    def _check(self, size):
        migrationops.check_room(
            self.drv.image_backend, self.make_instance(),
            [(self.disk, diskplan.DiskFormat.RAW, size, False)],
            self.instances_path)

    def test_refused_with_the_figures(self):
        # More than any test filesystem holds.
        exc = self.assertRaises(nova_exception.MigrationPreCheckError,
                                self._check, 1 << 60)
        self.assertIn('Not enough space on host', exc.format_message())
        self.assertIn('%d bytes needed' % (1 << 60), exc.format_message())
        self.assertIn(self.instances_path, exc.format_message())

    def test_fits(self):
        self._check(units.Mi)

    def test_mode_none_checks_nothing(self):
        self.flags(preallocate_images='none')
        self._check(1 << 60)

    def test_flavor_disks_in_this_host_s_format(self):
        self.flags(use_cow_images=False)
        instance = self.make_instance(root_gb=0, ephemeral_gb=2, swap=64)
        disks = migrationops.flavor_disks(None, instance, '/i')
        self.assertEqual(
            [('/i/disk.local', diskplan.DiskFormat.RAW, 2 * units.Gi, True),
             ('/i/disk.swap', diskplan.DiskFormat.RAW, 64 * units.Mi, True)],
            disks)


class TestSharedDisks(base.TestCase):

    def test_shared_path_or_block_storage(self):
        data = objects.LibvirtLiveMigrateData()
        self.assertFalse(migrationops.shares_instance_disks(data))
        data.is_shared_instance_path = True
        self.assertTrue(migrationops.shares_instance_disks(data))
        data = objects.LibvirtLiveMigrateData(is_shared_instance_path=False,
                                              is_shared_block_storage=True)
        self.assertTrue(migrationops.shares_instance_disks(data))


class TestEvacuation(base.TestCase):

    def setUp(self):
        super().setUp()
        self.instance = self.make_instance()
        self.instance.task_state = task_states.REBUILD_SPAWNING
        self.instance.host = 'the-failed-host'
        self.instance_dir = os.path.join(self.instances_path,
                                         self.instance.uuid)
        self.error = exception.InsufficientDiskSpace(
            path='/i/disk', needed=10, free=1, directory='/i')

    def _fail(self, error):
        with migrationops.evacuation(self.instance):
            os.makedirs(self.instance_dir, exist_ok=True)
            raise error

    def test_refused_and_the_new_directory_removed(self):
        exc = self.assertRaises(nova_exception.ComputeResourcesUnavailable,
                                self._fail, self.error)
        self.assertIn('10 bytes needed', exc.format_message())
        self.assertFalse(os.path.exists(self.instance_dir))

    def test_a_directory_that_was_there_stays(self):
        os.makedirs(self.instance_dir)
        self.assertRaises(nova_exception.ComputeResourcesUnavailable,
                          self._fail, self.error)
        self.assertTrue(os.path.isdir(self.instance_dir))

    def test_cancelled_goes_through(self):
        error = exception.AllocationCancelled(path='/i/disk',
                                              reason='deleted')
        self.assertRaises(exception.AllocationCancelled, self._fail, error)

    def test_not_an_evacuation_is_left_alone(self):
        self.instance.host = base.CONF.host
        self.assertRaises(exception.InsufficientDiskSpace, self._fail,
                          self.error)
        self.assertTrue(os.path.isdir(self.instance_dir))


class TestConvertRawDisk(base.TestCase):

    def setUp(self):
        super().setUp()
        self.disk = os.path.join(self.instances_path, 'disk')
        pb_fixtures.write_pattern(self.disk, 8 * units.Mi, seed=2)
        self.sha = pb_fixtures.guest_sha(self.disk)

    def test_mode_none_is_nova_s(self):
        self.flags(preallocate_images='none')
        self.assertFalse(migrationops.convert_raw_disk(None, self.disk))
        self.assertEqual('raw', pb_fixtures.qemu_img_info(self.disk)['format'])

    def test_converted_by_this_host_s_plan(self):
        self.flags(group='prealloc_backend', mode='space')
        instance = self.make_instance({'prealloc:cluster_size': '256K'})
        self.assertTrue(migrationops.convert_raw_disk(instance, self.disk))
        info = pb_fixtures.qemu_img_info(self.disk)
        self.assertEqual('qcow2', info['format'])
        self.assertEqual(256 * units.Ki, info['cluster-size'])
        self.assertGreaterEqual(pb_fixtures.allocated(self.disk),
                                8 * units.Mi)
        self.assertEqual(self.sha, pb_fixtures.guest_sha(self.disk))
