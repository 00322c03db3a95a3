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

"""Placement sees what a reserving host can really reserve: the scheduler
chooses hosts with room, and refuses moves to hosts without, before
anything moves.

nova's in-process API, conductor, scheduler, placement and computes, the
plugin's driver reporting DISK_GB through nova's resource tracker. The
hosts without room keep their instances on a real small ext4 filesystem,
loop-mounted (root; skipped otherwise, as the other loop-mounted tests).

NOTE: nova's functional harness reports every host's DISK_GB ``total`` as
128 GiB (its mock of LibvirtDriver._get_local_gb_info, tests/functional/
base.py): nova's stock inventory then offers 128 GiB on a 768 MiB
filesystem, which is what a host looks like to placement when other files
fill its filesystem. The plugin keeps that total and reserves what is not
room, measured on the real filesystem.

Each test was seen failing with ``[prealloc_backend] disk_inventory =
nova`` (nova's inventory): see doc/source/contributor/testing.rst.
"""

import hashlib
import os
import subprocess

from nova import context as nova_context
from nova.tests.fixtures import libvirt as fakelibvirt
from oslo_utils import units

from prealloc_backend.planner import capacity
from tests.functional import multihost

GiB = units.Gi
# The filesystem without room for a 1 GiB disk in mode space.
SMALL_MB = 768


def _host_info(mem_gb):
    return fakelibvirt.HostInfo(cpu_nodes=2, cpu_sockets=1, cpu_cores=2,
                                cpu_threads=2, kB_mem=mem_gb * 1024 * 1024)


def qemu_img_measure(size, **options):
    """``qemu-img measure``'s fully allocated size of a new qcow2 image of
    ``size`` bytes with ``options`` (-o): what it needs, measured by QEMU.
    """
    opts = ','.join('%s=%s' % item for item in sorted(options.items()))
    out = subprocess.run(['qemu-img', 'measure', '-O', 'qcow2', '-o', opts,
                          '--size', str(size)], check=True,
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith('fully allocated size:'):
            return int(line.split(':')[1])
    raise AssertionError('qemu-img measure: %s' % out)


def sha256(path):
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(4 * units.Mi), b''):
            digest.update(chunk)
    return digest.hexdigest()


class PlacementCapacityBase(multihost.MultiHostTestBase):

    # A disk made in mode space: the plugin's default overlay layout.
    OVERLAY = {'cluster_size': 131072, 'extended_l2': 'on',
               'preallocation': 'falloc'}

    def refresh(self):
        """Each compute's periodic update of placement, now."""
        ctx = nova_context.get_admin_context()
        for compute in self.computes.values():
            compute.manager.update_available_resource(ctx)

    def rp(self, host):
        return self._get_provider_uuid_by_host(host)

    def disk_gb(self, host):
        return self._get_provider_inventory(self.rp(host))['DISK_GB']

    def disk_usage(self, host):
        return self._get_provider_usages(self.rp(host)).get('DISK_GB', 0)

    def offered_gb(self, host):
        inv = self.disk_gb(host)
        return (int((inv['total'] - inv['reserved']) *
                    inv['allocation_ratio']) - self.disk_usage(host))


class TestInventory(PlacementCapacityBase):

    def test_inventory_is_what_the_filesystem_can_reserve(self):
        """On a real 4 GiB filesystem holding a 1 GiB space disk and 700
        MiB of other files, placement offers the room a new disk really
        has, rounded down to whole GiB, computed here from the filesystem
        (statvfs, st_blocks) and from QEMU's own measure of qcow2
        metadata; a ratio of 4.0 is reported as 1.0, and the host has the
        trait. A flavor one GiB larger than offered is refused by the
        scheduler (NoValidHost), with no disk made anywhere.
        """
        self.flags(disk_allocation_ratio=4.0, reserved_host_disk_mb=100)
        path = self.add_loop_host('h1', 4096).instances_path
        image_id, _path = self.upload_image('raw')
        server = self.boot(image_id, self.create_flavor(disk=1))
        disk = self.host_disk('h1', server)
        other = os.path.join(path, 'not-nova')
        subprocess.run(['fallocate', '-l', str(700 * units.Mi), other],
                       check=True)
        self.refresh()
        inv = self.disk_gb('h1')

        vfs = os.statvfs(path)
        size = vfs.f_blocks * vfs.f_frsize
        used = size - vfs.f_bavail * vfs.f_frsize
        held = os.stat(disk).st_blocks * 512
        # The 1 GiB disk once fully written (it is: mode space), as QEMU
        # measures it, beyond the 1 GiB placement counts for it.
        promised = max(0, max(held, qemu_img_measure(GiB, **self.OVERLAY))
                       - GiB)
        before = (used - held) + promised + 100 * units.Mi
        largest = (size - before) // GiB * GiB
        new_meta = qemu_img_measure(largest, **self.OVERLAY) - largest
        room = size - before - new_meta
        self.assertEqual(room // GiB, inv['total'] - inv['reserved'],
                         (inv, size, used, held, promised, new_meta))
        self.assertEqual(1.0, inv['allocation_ratio'])
        self.assertEqual(1, self.disk_usage('h1'))
        self.assertIn(capacity.RESERVING_TRAIT,
                      self._get_provider_traits(self.rp('h1')))
        offered = self.offered_gb('h1')
        self.assertGreaterEqual(offered, 1, inv)

        too_big = self.create_flavor(disk=offered + 1)
        refused = self._create_server(image_uuid=image_id,
                                      flavor_id=too_big, networks='none',
                                      expected_state='ERROR')
        self.assertIn('No valid host', self.fault_message(refused))
        self.assertNotIn('compute_prealloc_disks', self.action_events(
            refused, 'create'))
        self.assertNothingLeft(refused, 'h1')

    def test_thin_host_keeps_novas_inventory(self):
        """A host in mode metadata reports nova's inventory (its ratio
        too) and no trait: thin hosts may overcommit, by the operator's
        choice.
        """
        self.flags(disk_allocation_ratio=4.0)
        self.add_host('thin', mode='metadata')
        inv = self.disk_gb('thin')
        # nova's harness figures: 128 GiB total, nothing reserved.
        self.assertEqual((128, 0, 4.0), (inv['total'], inv['reserved'],
                                         inv['allocation_ratio']))
        self.assertNotIn(capacity.RESERVING_TRAIT,
                         self._get_provider_traits(self.rp('thin')))


class TestScheduling(PlacementCapacityBase):

    def test_lands_on_host_with_room_at_first_attempt(self):
        """'full' (768 MiB) is the RAM weigher's first choice and looks
        like 128 GiB in nova's inventory; placement offers it nothing for
        a 1 GiB disk, so the build goes to 'roomy' at once: one
        compute_prealloc_disks event, no reschedule.
        """
        self.add_loop_host('full', SMALL_MB, host_info=_host_info(32))
        self.add_host('roomy', host_info=_host_info(16))
        self.assertLess(self.offered_gb('full'), 1)
        image_id, _path = self.upload_image('raw')
        server = self.boot(image_id, self.create_flavor(disk=1))
        self.assertEqual('roomy', self.server_host(server))
        events = self.action_events(server, 'create')
        disk_events = sorted(name for name in events
                             if name.startswith('compute_prealloc_disks'))
        self.assertEqual(['compute_prealloc_disks'], disk_events, events)
        self.assertEqual('roomy', events['compute_prealloc_disks']['host'])
        self.assertEqual('Success',
                         events['compute_prealloc_disks']['result'])
        self.assertNothingLeft(server, 'full')

    def test_flavor_requiring_the_trait_skips_thin_hosts(self):
        """A space flavor that requires CUSTOM_PREALLOC_RESERVING lands on
        the reserving host, though the thin one is the weigher's choice.
        """
        self.add_host('thin', mode='metadata', host_info=_host_info(32))
        self.add_host('thick', mode='space', host_info=_host_info(16))
        image_id, _path = self.upload_image('raw')
        flavor = self.create_flavor(disk=1, extra_specs={
            'prealloc:mode': 'space',
            'trait:%s' % capacity.RESERVING_TRAIT: 'required'})
        server = self.boot(image_id, flavor)
        self.assertEqual('thick', self.server_host(server))


class TestMovesRefused(PlacementCapacityBase):
    """A cold migration and a resize to a host without room are refused
    by the scheduler before anything moves: the API answers 202, the
    server stays ACTIVE on its source, its disk untouched, nothing on the
    destination; the conductor's event says "No valid host".
    """

    # NOTE(nova): RPC casts stay casts, as in a real cloud (nova's test
    # default turns them into calls: the conductor's NoValidHost would
    # reach the API as a 500 instead of its 202).
    CAST_AS_CALL = False

    def setUp(self):
        super().setUp()
        self.add_host('src')
        image_id, _path = self.upload_image('raw')
        self.server = self.boot(image_id, self.create_flavor(disk=1))
        self.assertEqual('src', self.server_host(self.server))
        self.add_loop_host('dst', SMALL_MB)
        self.refresh()
        self.assertLess(self.offered_gb('dst'), 1)
        disk = self.host_disk('src', self.server)
        self.before = (os.stat(disk), sha256(disk))

    def request(self, body):
        response = self.api.api_post(
            '/servers/%s/action' % self.server['id'], body)
        self.assertEqual(202, response.status)

    def assertRefused(self, action):
        self._wait_for_migration_status(self.server, ['error'])
        server = self._wait_for_server_parameter(
            self.server, {'status': 'ACTIVE', 'OS-EXT-STS:task_state': None})
        self.assertEqual('src', server['OS-EXT-SRV-ATTR:host'])
        # The conductor saves the migration's error and the server's task,
        # then the fault, and only then the event's result.
        self._wait_for_instance_action_event(
            server, action, 'conductor_migrate_server', 'Error')
        event = self.action_events(server, action)['conductor_migrate_server']
        self.assertEqual('Error', event['result'])
        self.assertIn('No valid host', event['details'])
        disk = self.host_disk('src', self.server)
        st, digest = self.before
        now = os.stat(disk)
        self.assertEqual((st.st_ino, st.st_size, st.st_blocks,
                          st.st_mtime_ns),
                         (now.st_ino, now.st_size, now.st_blocks,
                          now.st_mtime_ns))
        self.assertEqual(digest, sha256(disk))
        self.assertNothingLeft(self.server, 'dst')
        self.assertEqual(1, self.disk_usage('src'))
        self.assertEqual(0, self.disk_usage('dst'))

    def test_cold_migration_refused(self):
        self.request({'migrate': None})
        self.assertRefused('migrate')

    def test_resize_refused(self):
        bigger = self.create_flavor(disk=2)
        self.request({'resize': {'flavorRef': bigger}})
        self.assertRefused('resize')
