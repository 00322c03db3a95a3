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

"""Live migration between two plugin hosts.

Each test states its storage case: NON-SHARED (each host has its own
instance directory: nova block-migrates, its pre_live_migration makes the
destination's disks) or SHARED (one instance directory: nothing is made).

nova's fake libvirt copies no disk data: multihost.block_copy does what
QEMU's block copy writes (the source's guest-visible data, into the disk
the destination made, keeping that file), so that the guest's content can
be compared after the move. Allocation is measured on the destination's
own file, as pre_live_migration and the plugin made it.
"""

import os
import re
import time
from unittest import mock

from oslo_utils import units

from tests.functional import base
from tests.functional import multihost
from tests.functional import test_migrate

GUEST_WRITE = test_migrate.GUEST_WRITE
# The plugin's reason, in the details of the destination's events.
NO_ROOM = re.compile(r"Not enough space on host dst to preallocate the "
                     r"instance's disks \(mode space\): (?P<needed>\d+) "
                     r"bytes needed, (?P<free>\d+) bytes free in \S+")


class _LiveMigrateBase(test_migrate._MigrateMixin,
                       multihost.MultiHostTestBase):

    def _hosts(self, fmt, mode, dest_mode=None, dest_fmt=None,
               stock_source=False, stock_dest=False, **kwargs):
        self.add_host('src', fmt, mode, stock=stock_source, **kwargs)
        self.add_host('dst', dest_fmt or fmt, dest_mode or mode,
                      stock=stock_dest, **kwargs)

    def _source_state(self, server):
        st = os.stat(self.host_disk('src', server))
        return (st.st_ino, st.st_size, st.st_blocks, st.st_mtime_ns)

    def assertStayedOnSource(self, server, before):
        """ACTIVE on the source, its disk as before: same file, size,
        allocation and modification time, the guest's content.
        """
        server = self.api.get_server(server['id'])
        self.assertEqual('ACTIVE', server['status'])
        self.assertEqual('src', server['OS-EXT-SRV-ATTR:host'])
        self.assertIsNone(server['OS-EXT-STS:task_state'])
        self.assertEqual(before, self._source_state(server))
        self.assertContentEqual(self.host_disk('src', server),
                                self.reference(self.image_path, units.Gi,
                                               [GUEST_WRITE]))


class TestBlockLiveMigrate(_LiveMigrateBase):
    """NON-SHARED instance directories: block live migration."""

    def setUp(self):
        super().setUp()
        self.stub_live_migration()

    def _test(self, fmt, mode, dest_mode=None, dest_host_fmt=None,
              stock_source=False, stock_dest=False):
        """``fmt``: the disk's format (and the source host's); the
        destination host's own format is ``dest_host_fmt`` (default the
        same): a block live migration keeps the source's disk format.
        """
        dest_mode = dest_mode or mode
        self._hosts(fmt, mode, dest_mode, dest_fmt=dest_host_fmt,
                    stock_source=stock_source, stock_dest=stock_dest)
        server = self._boot('src', fmt)
        self.assertDisk('src', server, fmt, mode, units.Gi)
        server = self.live_migrate(server, 'dst')
        self.assertEqual('dst', self.server_host(server))
        # The destination's file, as its plan made it, holding the data
        # the block copy wrote: the destination's allocation, the source's
        # content (assertDisk compares it with the image plus the write).
        figures = self.assertDisk('dst', server, fmt, dest_mode, units.Gi)
        self.assertNothingLeft(server, 'src')
        events = self.action_events(server, 'live-migration')
        if stock_dest:
            # Only a plugin host records the preallocation event.
            self.assertNotIn('compute_prealloc_disks', events)
            return figures
        self.assertEqual('Success',
                         events['compute_prealloc_disks']['result'])
        self.assertEqual('dst', events['compute_prealloc_disks']['host'])
        return figures

    def test_raw_space(self):
        # nova alone makes this disk sparse (create_image); the plugin
        # allocates it as the destination's mode says.
        self._test('raw', 'space')

    def test_raw_none(self):
        self._test('raw', 'none')

    def test_raw_none_to_space_host(self):
        self._test('raw', 'none', dest_mode='space')

    def test_raw_space_to_none_host(self):
        self._test('raw', 'space', dest_mode='none')

    def test_raw_full(self):
        self._test('raw', 'full')

    def test_raw_host_to_qcow2_host(self):
        # The disk stays raw (the domain XML is the source's): made as a
        # raw file by the destination's mode.
        self._test('raw', 'none', dest_mode='space', dest_host_fmt='qcow2')

    def test_stock_source(self):
        # A host without the plugin (a rolling upgrade) to a plugin host.
        self._test('raw', 'none', dest_mode='space', stock_source=True)

    def test_qcow2_space(self):
        self._test('qcow2', 'space')

    def test_qcow2_host_to_raw_host(self):
        # The disk stays a qcow2 overlay (its XML says so), made by the
        # plugin's qcow2 code in the raw host's mode: nova alone makes a
        # raw copy of the base there, which the guest cannot open.
        self._test('qcow2', 'space', dest_host_fmt='raw')

    def test_qcow2_host_to_raw_metadata_host(self):
        self._test('qcow2', 'none', dest_mode='metadata',
                   dest_host_fmt='raw')

    def test_plugin_to_stock_raw(self):
        # A plugin host to one without it (a rolling upgrade, or a
        # rollback): nova's own pre_live_migration makes the destination's
        # disk, thin, as stock nova does; the guest's data arrives whole.
        self._test('raw', 'space', dest_mode='none', stock_dest=True)

    def test_plugin_to_stock_qcow2(self):
        self._test('qcow2', 'space', dest_mode='none', stock_dest=True)

    def test_qcow2_none(self):
        self._test('qcow2', 'none')

    def test_qcow2_metadata(self):
        self._test('qcow2', 'metadata')

    def test_qcow2_none_to_metadata_host(self):
        self._test('qcow2', 'none', dest_mode='metadata')


class TestSharedLiveMigrate(_LiveMigrateBase):
    """SHARED instance directory: the destination uses the source's files;
    nothing is made, checked or allocated, the disk is not touched.
    """

    def setUp(self):
        super().setUp()
        self.stub_live_migration()

    def _test(self, fmt, mode):
        self._hosts(fmt, mode, shared=True)
        server = self._boot('src', fmt)
        self.assertDisk('src', server, fmt, mode, units.Gi)
        before = self._source_state(server)
        server = self.live_migrate(server, 'dst')
        self.assertEqual('dst', self.server_host(server))
        self.assertEqual(before, self._source_state(server))
        self.assertDisk('dst', server, fmt, mode, units.Gi)
        self.assertNothingLeft(server, 'src')
        self.assertNotIn('compute_prealloc_disks',
                         self.action_events(server, 'live-migration'))

    def test_raw_space(self):
        self._test('raw', 'space')

    def test_qcow2_space(self):
        self._test('qcow2', 'space')


class TestFailedLiveMigrate(_LiveMigrateBase):
    """NON-SHARED: libvirt's migration job fails after pre_live_migration
    made the destination's disks: nova rolls back; nothing is left on the
    destination.
    """

    def setUp(self):
        super().setUp()
        self.stub_live_migration(fail=True)

    def _test(self, fmt):
        self._hosts(fmt, 'space')
        server = self._boot('src', fmt)
        before = self._source_state(server)
        # A spy (the real method runs): what the destination had made
        # before libvirt failed.
        made = []
        dest_driver = self.computes['dst'].driver
        real = dest_driver._create_images_and_backing

        def spy(context, instance, instance_dir, *args, **kwargs):
            result = real(context, instance, instance_dir, *args, **kwargs)
            made.extend(os.listdir(instance_dir))
            return result

        with mock.patch.object(dest_driver, '_create_images_and_backing',
                               side_effect=spy):
            self.live_migrate(server, 'dst', migration_state='failed')
        # The destination had made the disk before libvirt failed.
        self.assertIn('disk', made)
        self.assertStayedOnSource(server, before)
        self.assertNothingLeft(server, 'dst')

    def test_raw(self):
        self._test('raw')

    def test_qcow2(self):
        self._test('qcow2')


class TestLiveMigrateNoRoom(_LiveMigrateBase):
    """NON-SHARED; the destination keeps its instances on a real small
    loop-mounted ext4: a 1 GiB disk in mode space cannot fit. The live
    migration is refused before anything moves: the server stays ACTIVE on
    its source with its disk as it was, the reason is in the destination's
    event, nothing is left there.
    """

    # NOTE(nova): RPC casts stay casts, as in a real cloud: nova's test default
    # turns them into calls, and the conductor's refusal (NoValidHost for
    # a host the user named) would then reach the API as a 500 instead of
    # a migration in status 'error' with the API's 202.
    CAST_AS_CALL = False

    def setUp(self):
        super().setUp()
        self.stub_live_migration()

    def _test(self, fmt):
        self.add_host('src', fmt, 'space')
        # nova's inventory (placement would refuse a host without room
        # before this check: test_placement_capacity): the destination's
        # own check is what a thin host's placement view leaves.
        self.add_loop_host('dst', 64, fmt=fmt, mode='space',
                           disk_inventory='nova')
        server = self._boot('src', fmt)
        before = self._source_state(server)
        self.live_migrate(server, 'dst', migration_state='error')
        self.assertStayedOnSource(server, before)
        self.assertNothingLeft(server, 'dst')
        events = self.action_events(server, 'live-migration')
        check = events['compute_check_can_live_migrate_destination']
        self.assertEqual('Error', check['result'])
        self.assertEqual('dst', check['host'])
        match = NO_ROOM.search(check['details'])
        self.assertIsNotNone(match, check)
        needed, free = int(match.group('needed')), int(match.group('free'))
        self.assertGreaterEqual(needed, units.Gi)
        self.assertLess(free, 64 * units.Mi)
        base.record_figures(self, 'dst', 'space', {
            'needed': needed, 'free': free, 'details': check['details']})
        # Nothing was started on the destination.
        self.assertNotIn('compute_pre_live_migration', events)

    def test_raw(self):
        self._test('raw')

    def test_qcow2(self):
        self._test('qcow2')

    def test_room_taken_after_the_check(self):
        """The destination had room when checked; another disk took it
        before pre_live_migration: the exact check there (the source's
        disk list) refuses before any disk is made; nova rolls back.
        """
        self.add_host('src', 'raw', 'space')
        self.add_loop_host('dst', 1536, fmt='raw', mode='space')
        server = self._boot('src', 'raw')
        before = self._source_state(server)
        dest_driver = self.computes['dst'].driver
        real = dest_driver.pre_live_migration
        filler = os.path.join(self.scope.hosts['dst'].instances_path,
                              'another-disk')

        # The real pre_live_migration runs, after a real file took
        # the room (another host's disk landing between the two checks).
        def room_taken(*args, **kwargs):
            free = os.statvfs(filler.rsplit('/', 1)[0])
            with open(filler, 'wb') as f:
                os.posix_fallocate(f.fileno(), 0,
                                   free.f_bavail * free.f_frsize -
                                   64 * units.Mi)
            return real(*args, **kwargs)

        with mock.patch.object(dest_driver, 'pre_live_migration',
                               side_effect=room_taken):
            self.live_migrate(server, 'dst', migration_state='failed')
        self.assertStayedOnSource(server, before)
        # nova's pre_live_migration made the instance directory there;
        # the rollback that removes it is a cast to the destination, sent
        # before the migration is marked failed.
        deadline = time.monotonic() + 60
        while self.left_on(server, 'dst') and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertNothingLeft(server, 'dst')
        events = self.action_events(server, 'live-migration')
        self.assertEqual('Success', events[
            'compute_check_can_live_migrate_destination']['result'])
        self.assertEqual('Error',
                         events['compute_pre_live_migration']['result'])
        disks = events['compute_prealloc_disks']
        self.assertEqual('Error', disks['result'])
        self.assertRegex(disks['details'], NO_ROOM)
