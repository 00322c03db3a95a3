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

"""Servers whose disks the plugin made, checked on the compute host.

Each test goes through the cloud's API (flavors with ``prealloc:`` extra
specs, servers booted, resized) and then reads the compute host's real
files (``[prealloc] host_access``): the overlay's layout from ``qemu-img
info``, its allocation from ``st_blocks`` and ``filefrag`` (extents
fallocate(2) reserved are "unwritten"), the guest's ``<metadata_cache>``
from ``virsh dumpxml``, and ``prealloc-backend check`` on the host.

The expectations are the modes of doc/source/admin/modes.rst, for a qcow2
overlay (nova's ``use_cow_images``, the default) on a filesystem with
fallocate(2):

========= ============ ========== ====================== ================
mode      extended_l2  cluster    file size (st_size)    allocated
========= ============ ========== ====================== ================
none      no           64K (qemu) header only            header only
metadata  yes          128K       whole virtual size     metadata only
space     yes          128K       whole virtual size     all, unwritten
full      yes          128K       whole virtual size     all, written
========= ============ ========== ====================== ================
"""

import json
import shlex
import subprocess
import time

from oslo_log import log as logging
from prometheus_client import parser as prom_parser
from tempest.api.compute import base
from tempest.common import compute
from tempest.common import waiters
from tempest import config
from tempest.lib import decorators
from tempest.lib import exceptions as lib_exc

from prealloc_backend_tempest_plugin import host as compute_host

CONF = config.CONF
LOG = logging.getLogger(__name__)

GiB = 1024 ** 3
MiB = 1024 ** 2
# qemu-img's default cluster (what stock nova's overlay gets from a raw
# base) and the plugin's default qcow2_cluster_size.
QEMU_CLUSTER = 64 * 1024
PLUGIN_CLUSTER = 128 * 1024
# An L2 entry with extended_l2: 16 bytes per cluster.
L2_ENTRY = 16
# QEMU's default L2 cache (32 MiB): a disk it covers gets no
# <metadata_cache>.
QEMU_DEFAULT_L2_CACHE = 32 * MiB
# The instance-action event of the plugin's disk work on a host
# (prealloc_backend's DISK_EVENT; a rescheduled build's later hosts add
# _2, _3...).
DISK_EVENT = 'compute_prealloc_disks'


def report_metrics(text):
    """{metric name: [samples]} of ``prealloc-backend report``'s
    Prometheus text.
    """
    metrics = {}
    for family in prom_parser.text_string_to_metric_families(text):
        for sample in family.samples:
            metrics.setdefault(sample.name, []).append(sample)
    return metrics


def record_reservation(row):
    """Append ``row`` as a JSON line to ``[prealloc]
    reservation_record`` (when set): tools/cloud-tempest prints the lines
    as the reservation table of doc/source/admin/migrations.rst.
    """
    path = CONF.prealloc.reservation_record
    if not path:
        return
    with open(path, 'a') as f:
        f.write(json.dumps(row, sort_keys=True) + '\n')


class PreallocHostTest(base.BaseV2ComputeAdminTest):
    """Boot servers from flavors with prealloc: extra specs."""

    @classmethod
    def skip_checks(cls):
        super().skip_checks()
        if not CONF.prealloc.instances_path:
            raise cls.skipException(
                '[prealloc] instances_path is not set: no compute host '
                'files to check')

    def flavor(self, disk=1, **specs):
        flavor = self.create_flavor(ram=128, vcpus=1, disk=disk)
        if specs:
            self.admin_flavors_client.set_flavor_extra_spec(
                flavor['id'], **specs)
        return flavor

    def boot(self, flavor):
        server = self.create_test_server(flavor=flavor['id'],
                                         wait_until='ACTIVE')
        return self.admin_view(server['id'])

    def admin_view(self, server_id):
        return self.admin_servers_client.show_server(server_id)['server']

    def host_of(self, server):
        return compute_host.ComputeHost(server['OS-EXT-SRV-ATTR:host'])

    def assert_disk(self, server, mode, virtual_size, cluster=None):
        """The root disk of ``server`` has the layout and allocation of
        ``mode`` (the table in this module's docstring).
        """
        host = self.host_of(server)
        path = host.disk_path(server['id'])
        info = host.qemu_img_info(path)
        size, allocated = host.stat(path)
        specific = info.get('format-specific', {}).get('data', {})
        what = ('%s, mode %s: qemu-img info %s; st_size %d, allocated %d'
                % (path, mode, info, size, allocated))
        self.assertEqual('qcow2', info['format'], what)
        self.assertEqual(virtual_size, info['virtual-size'], what)
        if mode == 'none':
            self.assertFalse(specific.get('extended-l2', False), what)
            self.assertEqual(QEMU_CLUSTER, info['cluster-size'], what)
            self.assertLess(size, 16 * MiB, what)
            self.assertLess(allocated, 16 * MiB, what)
            return
        self.assertTrue(specific.get('extended-l2', False), what)
        self.assertEqual(cluster or PLUGIN_CLUSTER, info['cluster-size'],
                         what)
        # Every cluster laid out in the file (sparse or not).
        self.assertGreaterEqual(size, virtual_size, what)
        if mode == 'metadata':
            self.assertLess(allocated, virtual_size // 8, what)
            return
        self.assertGreaterEqual(allocated, virtual_size, what)
        unwritten = host.unwritten_bytes(path)
        if mode == 'space':
            # fallocate(2): reserved, never written.
            self.assertGreater(unwritten, virtual_size // 2,
                               '%s; unwritten %d' % (what, unwritten))
        else:
            # full: zeros written.
            self.assertEqual(0, unwritten,
                             '%s; unwritten %d' % (what, unwritten))

    def action_events(self, server, action):
        """The events of ``server``'s one instance action ``action``
        (create, live-migration...).
        """
        actions = self.admin_servers_client.list_instance_actions(
            server['id'])['instanceActions']
        found = [a for a in actions if a['action'] == action]
        self.assertEqual(1, len(found), actions)
        return self.admin_servers_client.show_instance_action(
            server['id'], found[0]['request_id'])['instanceAction']['events']

    def metadata_cache(self, server):
        """``<metadata_cache><max_size>`` of the root disk in bytes, or
        None when the guest XML has none.
        """
        host = self.host_of(server)
        driver = host.domain_disk_driver(
            server['OS-EXT-SRV-ATTR:instance_name'],
            host.disk_path(server['id']))
        self.assertIsNotNone(driver)
        max_size = driver.find('./metadata_cache/max_size')
        if max_size is None:
            return None
        units = {'bytes': 1, 'b': 1, 'KiB': 1024, 'MiB': MiB}
        return int(max_size.text) * units[max_size.get('unit', 'bytes')]


class PreallocModesTest(PreallocHostTest):
    """A server per mode (flavor extra spec prealloc:mode): its root disk
    has the layout and allocation of the mode.
    """

    def _test_mode(self, mode):
        server = self.boot(self.flavor(**{'prealloc:mode': mode}))
        self.assert_disk(server, mode, GiB)
        # A 1 GiB disk is covered by QEMU's default L2 cache.
        self.assertIsNone(self.metadata_cache(server))

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a01')
    def test_mode_none(self):
        self._test_mode('none')

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a02')
    def test_mode_metadata(self):
        self._test_mode('metadata')

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a03')
    def test_mode_space(self):
        self._test_mode('space')

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a04')
    def test_mode_full(self):
        self._test_mode('full')

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a05')
    def test_metadata_cache_covers_large_disk(self):
        """A disk QEMU's default L2 cache does not cover (160 GiB at 64K
        clusters: 40 MiB of L2 tables) gets a <metadata_cache> that covers
        all of it; prealloc:cluster_size sets the overlay's clusters.
        """
        size = 160 * GiB
        server = self.boot(self.flavor(
            disk=160, **{'prealloc:mode': 'metadata',
                         'prealloc:cluster_size': '64K'}))
        self.assert_disk(server, 'metadata', size, cluster=QEMU_CLUSTER)
        l2_tables = size // QEMU_CLUSTER * L2_ENTRY
        self.assertGreater(l2_tables, QEMU_DEFAULT_L2_CACHE)
        cache = self.metadata_cache(server)
        self.assertIsNotNone(cache, 'no <metadata_cache> for a 160 GiB disk')
        self.assertGreaterEqual(cache, l2_tables)
        # the plugin's ceiling, qcow2_metadata_cache_max_mb (256)
        self.assertLessEqual(cache, 256 * MiB)


class PreallocResizeTest(PreallocHostTest):
    """A resize grows the disk with its mode's preallocation."""

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a10')
    def test_resize_keeps_space(self):
        server = self.boot(self.flavor(disk=1, **{'prealloc:mode': 'space'}))
        self.assert_disk(server, 'space', GiB)
        bigger = self.flavor(disk=2, **{'prealloc:mode': 'space'})
        self.resize_server(server['id'], bigger['id'])
        self.assert_disk(self.admin_view(server['id']), 'space', 2 * GiB)

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a11')
    def test_resize_revert_keeps_full(self):
        server = self.boot(self.flavor(disk=1, **{'prealloc:mode': 'full'}))
        bigger = self.flavor(disk=2, **{'prealloc:mode': 'full'})
        body = self.servers_client.resize_server(server['id'], bigger['id'])
        waiters.wait_for_server_status(
            self.servers_client, server['id'], 'VERIFY_RESIZE',
            request_id=body.response['x-openstack-request-id'])
        self.assert_disk(self.admin_view(server['id']), 'full', 2 * GiB)
        self.servers_client.revert_resize_server(server['id'])
        waiters.wait_for_server_status(self.servers_client, server['id'],
                                       'ACTIVE')
        self.assert_disk(self.admin_view(server['id']), 'full', GiB)


class PreallocRemakeTest(PreallocHostTest):
    """Operations that make the root disk again (shelve offload and
    unshelve, rebuild) make it in the flavor's mode, not in the host's
    default (the cloud's preallocate_images = space).
    """

    @classmethod
    def skip_checks(cls):
        super().skip_checks()
        if not CONF.compute_feature_enabled.shelve:
            raise cls.skipException('shelve is not enabled')

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a12')
    def test_unshelve_remakes_metadata(self):
        server = self.boot(self.flavor(**{'prealloc:mode': 'metadata'}))
        self.assert_disk(server, 'metadata', GiB)
        host = self.host_of(server)
        path = host.disk_path(server['id'])
        compute.shelve_server(self.servers_client, server['id'],
                              force_shelve_offload=True)
        # Offloaded: the disk went into the shelve snapshot, off the host.
        self.assertFalse(host.exists(path), '%s still exists' % path)
        self.servers_client.unshelve_server(server['id'])
        waiters.wait_for_server_status(self.servers_client, server['id'],
                                       'ACTIVE')
        self.assert_disk(self.admin_view(server['id']), 'metadata', GiB)

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a13')
    def test_rebuild_remakes_full(self):
        server = self.boot(self.flavor(**{'prealloc:mode': 'full'}))
        host = self.host_of(server)
        path = host.disk_path(server['id'])
        # The inode number and the birth time (nanoseconds): the rebuild
        # frees the old disk's inode, which the new file may be given.
        identity = ['stat', '-c', '%i %w', path]
        before = host.run(identity).stdout.strip()
        self.servers_client.rebuild_server(server['id'],
                                           CONF.compute.image_ref_alt)
        waiters.wait_for_server_status(self.servers_client, server['id'],
                                       'ACTIVE')
        # A new file (from the other image), fully allocated again.
        self.assertNotEqual(before, host.run(identity).stdout.strip(),
                            'the rebuild kept %s' % path)
        self.assert_disk(self.admin_view(server['id']), 'full', GiB)


@decorators.serial
class PreallocNoRoomTest(PreallocHostTest):
    """A disk in mode space that no host has room for, from a flavor that
    does not require CUSTOM_PREALLOC_RESERVING: where the guarantee cannot
    be given at scheduling time (doc/source/admin/capacity.rst).

    The flavor's disk lies between the free space of the host whose mode
    reserves nothing (nova's inventory, the cloud's ratio 4.0: placement
    offers it there) and what placement offers elsewhere. Hosts whose mode
    reserves report what they can really reserve, so placement never sends
    it there; the host in mode metadata takes the build, its plugin's
    check of the free space refuses the disk (the flavor's mode) before
    any fallocate(2) and asks nova to try another host; none is left and
    the server goes to ERROR. One disk event, on that host, says why.

    A serial test: its flavor is sized from the thin host's free space
    read at its start, with a margin of 1 to 2 GiB, which another test's
    server leaving that host (or the holes dug in a disk copied there)
    would free meanwhile.
    """

    # Event details (2.84) and hosts (2.62).
    min_microversion = '2.84'
    max_microversion = 'latest'

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a14')
    def test_no_room_reason_in_events(self):
        modes = CONF.prealloc.host_modes
        thin = sorted(h for h, m in modes.items() if m in ('none',
                                                            'metadata'))
        if not thin:
            raise self.skipException('needs a host in mode none or '
                                     'metadata ([prealloc] host_modes: %s)'
                                     % modes)
        services = self.os_admin.services_client.list_services(
            binary='nova-compute')['services']
        hosts = sorted(s['host'] for s in services if s['state'] == 'up')
        host = thin[0]
        self.assertIn(host, hosts)
        free, total = compute_host.ComputeHost(host).free_and_total(
            CONF.prealloc.instances_path)
        disk = free // GiB + 2
        if disk > 2 * total // GiB:
            raise self.skipException(
                'no size between the free space and what placement offers '
                'on %s (free, total: %d, %d)' % (host, free, total))
        flavor = self.flavor(disk=disk, **{'prealloc:mode': 'space'})
        body = self.create_test_server(flavor=flavor['id'],
                                       wait_until=None)
        waiters.wait_for_server_status(self.servers_client, body['id'],
                                       'ERROR', raise_on_error=False)
        # nova saves vm_state ERROR, then the fault
        # (nova/scheduler/utils.py set_vm_state_and_notify).
        server = self.admin_view(body['id'])
        deadline = time.time() + CONF.compute.build_timeout
        while 'fault' not in server and time.time() < deadline:
            time.sleep(CONF.compute.build_interval)
            server = self.admin_view(body['id'])
        # The plugin asked nova to try another host (a property of this
        # host, not of the request): none had room.
        self.assertIn('Exceeded maximum number of retries',
                      server.get('fault', {}).get('message', ''), server)
        path = compute_host.ComputeHost(hosts[0]).disk_path(server['id'])
        # Nothing left on any host: no disk file holds space.
        for name in hosts:
            self.assertFalse(compute_host.ComputeHost(name).exists(path),
                             '%s left on %s' % (path, name))
        events = self.action_events(server, 'create')
        disk_events = [e for e in events
                       if e['event'].startswith(DISK_EVENT)]
        what = '%s (flavor disk %d GiB; %s free %d of %d)' % (
            events, disk, host, free, total)
        # Only the thin host tried: placement kept the others out.
        self.assertEqual([host], [e['host'] for e in disk_events], what)
        for event in disk_events:
            self.assertEqual('Error', event['result'], what)
            self.assertIn('Not enough space to preallocate disk',
                          event['details'], what)
            self.assertIn(path, event['details'], what)


class PreallocTwoHostsTest(PreallocHostTest):
    """A disk that moves to another host (cold migration, block live
    migration) is checked on both hosts: gone from the source, and on the
    destination laid out and allocated as the destination's policy says
    (``[prealloc] host_modes``) or as the flavor's ``prealloc:mode`` says.

    A block live migration has QEMU on the source mirror the disk into the
    file the destination's nova-compute made (the plugin preallocated it):
    what the mirror writes there must not undo the preallocation.
    """

    # migrate_server(host=...) from 2.56; live_migrate_server without
    # disk_over_commit from 2.25; the hosts (2.62) and details (2.84) of
    # instance-action events. Servers of the tests that choose their host
    # are the admin's (nova:HOST): the admin's client follows them all.
    min_microversion = '2.84'
    max_microversion = 'latest'

    @classmethod
    def skip_checks(cls):
        super().skip_checks()
        if CONF.compute.min_compute_nodes < 2:
            raise cls.skipException('needs two compute hosts '
                                    '([compute] min_compute_nodes)')

    def other_host(self, server):
        dest = self.get_host_other_than(server['id'])
        if dest is None:
            raise self.skipException('no other compute host is up')
        return dest

    def thick_and_thin(self):
        """A host whose mode allocates the disk (space or full) and one
        whose mode does not (none or metadata), from ``[prealloc]
        host_modes``; skips the test without both.
        """
        modes = CONF.prealloc.host_modes
        thin = sorted(h for h, m in modes.items() if m in ('none',
                                                            'metadata'))
        thick = sorted(h for h, m in modes.items() if m in ('space', 'full'))
        if not thin or not thick:
            raise self.skipException(
                'needs a host in mode none or metadata and one in space or '
                'full ([prealloc] host_modes: %s)' % modes)
        return thick[0], thin[0]

    def boot_on(self, flavor, host, wait_until='ACTIVE'):
        """A server of ``flavor`` on ``host`` (``nova:HOST``: an admin's
        request).
        """
        body = self.create_test_server(
            clients=self.os_admin, flavor=flavor['id'],
            wait_until=wait_until, availability_zone='nova:%s' % host)
        server = self.admin_view(body['id'])
        self.assertEqual(host, server['OS-EXT-SRV-ATTR:host'])
        return server

    def host_mode(self, name):
        modes = CONF.prealloc.host_modes
        if name not in modes:
            raise self.skipException(
                '[prealloc] host_modes does not say the mode of %s (%s)'
                % (name, modes))
        return modes[name]

    def assert_moved(self, server, source, dest, mode, virtual_size=GiB):
        """``server`` runs on ``dest`` with a disk of ``mode``; ``source``
        keeps no disk of it. Returns the destination disk's ``qemu-img
        map`` (ComputeHost.qemu_img_map).
        """
        server = self.admin_view(server['id'])
        self.assertEqual(dest, server['OS-EXT-SRV-ATTR:host'])
        self.assert_disk(server, mode, virtual_size)
        gone = compute_host.ComputeHost(source)
        path = gone.disk_path(server['id'])
        self.assertFalse(gone.exists(path),
                         '%s still exists on %s' % (path, source))
        return self.host_of(server).qemu_img_map(path)

    def cold_migrate(self, server, dest):
        self.admin_servers_client.migrate_server(server['id'], host=dest)
        waiters.wait_for_server_status(self.admin_servers_client, server['id'],
                                       'VERIFY_RESIZE')
        self.admin_servers_client.confirm_resize_server(server['id'])
        waiters.wait_for_server_status(self.admin_servers_client, server['id'],
                                       'ACTIVE')

    def wait_for_migration(self, server):
        """The server's migrations once one is over (its own record says
        when, and how: a live migration ends ``completed``, an evacuation
        ``done``, either may fail).
        """
        deadline = time.time() + CONF.compute.build_timeout
        while True:
            migrations = self.os_admin.migrations_client.list_migrations(
                instance_uuid=server['id'])['migrations']
            done = [m for m in migrations
                    if m['status'] in ('completed', 'done', 'failed',
                                       'error')]
            if done or time.time() > deadline:
                return migrations
            time.sleep(2)

    def live_migrate(self, server, dest):
        self.admin_servers_client.live_migrate_server(
            server['id'], host=dest, block_migration=True)
        migrations = self.wait_for_migration(server)
        self.assertEqual(['completed'],
                         [m['status'] for m in migrations], migrations)
        waiters.wait_for_server_status(self.admin_servers_client, server['id'],
                                       'ACTIVE')

    def older_and_newer(self):
        """The hosts of the older and the newer QEMU (``[prealloc]
        host_qemu_versions``), or None where the hosts run one generation.
        """
        versions = {}
        for host, version in CONF.prealloc.host_qemu_versions.items():
            versions[host] = tuple(int(p) for p in version.split('.')
                                   if p.isdigit())
        if len(versions) < 2 or len(set(versions.values())) < 2:
            return None
        ordered = sorted(versions, key=versions.get)
        return ordered[0], ordered[-1]

    def nth_host(self, index):
        """The ``index``-th host of ``[prealloc] host_modes`` by name;
        skips the test where there are not that many.
        """
        hosts = sorted(CONF.prealloc.host_modes)
        if len(hosts) <= index:
            raise self.skipException('%d host(s) in [prealloc] host_modes'
                                     % len(hosts))
        return hosts[index]

    def restart_compute(self, host, *args):
        """``[prealloc] compute_restart_command HOST ARGS...``
        (tools/cloud-compute): nova-compute of ``host`` restarted in its
        own mode (no ARGS), in another (``--mode MODE``), stopped
        (``--stop``) or as stock nova (``--stock``).
        """
        argv = (shlex.split(CONF.prealloc.compute_restart_command) +
                [host] + list(args))
        proc = subprocess.run(argv, capture_output=True, text=True,
                              timeout=300)
        self.assertEqual(0, proc.returncode, '%s: %s%s' % (
            argv, proc.stdout, proc.stderr))

    def reservation(self, server, step, size=GiB, walk=None):
        """The root disk of ``server`` after ``step``, on the host it is
        on: its figures from the files (qemu-img info, st_blocks, the
        extents filefrag calls unwritten) and from ``prealloc-backend
        report`` there (the bytes it counts allocated, whether the disk is
        at its mode's policy), recorded (record_reservation) and returned.
        Asserts the disk's virtual size is ``size``.
        """
        server = self.admin_view(server['id'])
        name = server['OS-EXT-SRV-ATTR:host']
        host = self.host_of(server)
        path = host.disk_path(server['id'])
        info = host.qemu_img_info(path)
        _st_size, allocated = host.stat(path)
        row = {'test': '%s.%s' % (self.__class__.__name__,
                                  self._testMethodName),
               'walk': walk, 'step': step, 'host': name,
               'qemu': CONF.prealloc.host_qemu_versions.get(name, ''),
               'host_mode': CONF.prealloc.host_modes.get(name, ''),
               'virtual': info['virtual-size'], 'allocated': allocated,
               'unwritten': host.unwritten_bytes(path),
               'report_mode': None, 'report_allocated': None,
               'report_at_policy': None}
        metrics = report_metrics(host.prealloc_report())
        for metric, key in (('prealloc_disk_allocated_bytes',
                             'report_allocated'),
                            ('prealloc_disk_at_policy', 'report_at_policy')):
            for sample in metrics.get(metric, []):
                if (sample.labels.get('instance_uuid') == server['id'] and
                        sample.labels.get('disk') == 'disk'):
                    row[key] = sample.value
                    row['report_mode'] = sample.labels.get('mode')
        record_reservation(row)
        LOG.info('reservation: %s', row)
        self.assertEqual(size, row['virtual'], row)
        return row

    def assert_reserved(self, row):
        """The disk of ``row`` (reservation()) has all its blocks: the
        files say so and so does the report on its host.
        """
        self.assertGreaterEqual(row['allocated'], row['virtual'], row)
        self.assertEqual(1.0, row['report_at_policy'], row)
        self.assertEqual('space', row['report_mode'], row)


class PreallocMigrationTest(PreallocTwoHostsTest):
    """A disk that moves to another host (cold migration, block live
    migration): see PreallocTwoHostsTest.
    """

    # The cold migrations go from a host that allocates the disk to one
    # that does not: nova's copy (scp) writes every byte, zeros included,
    # so only on such a destination does a disk left as copied differ from
    # one made by the destination's mode. (The other way, a copied disk
    # arrives all written: fully allocated, more than mode space needs.)

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a40')
    def test_cold_migration_takes_destination_policy(self):
        """A flavor without prealloc:mode: after a cold migration the disk
        has the destination host's mode (metadata: holes where the copy
        wrote zeros), not the source's (space).
        """
        source, dest = self.thick_and_thin()
        server = self.boot_on(self.flavor(), source)
        self.assert_disk(server, self.host_mode(source), GiB)
        path = self.host_of(server).disk_path(server['id'])
        data = self.host_of(server).guest_md5(path)
        self.cold_migrate(server, dest)
        self.assert_moved(server, source, dest, self.host_mode(dest))
        # The same bytes to the guest after the copy and the holes.
        self.assertEqual(data, compute_host.ComputeHost(dest).guest_md5(
            path))

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a41')
    def test_cold_migration_keeps_flavor_mode(self):
        """A flavor in mode space going to a host in mode metadata: the
        disk stays allocated (the flavor's mode), where the host's own
        mode would leave it thin.
        """
        source, dest = self.thick_and_thin()
        server = self.boot_on(self.flavor(**{'prealloc:mode': 'space'}),
                              source)
        self.cold_migrate(server, dest)
        server = self.admin_view(server['id'])
        self.assertEqual(dest, server['OS-EXT-SRV-ATTR:host'])
        host = self.host_of(server)
        path = host.disk_path(server['id'])
        size, allocated = host.stat(path)
        # Every byte allocated; as the copy's written zeros, not unwritten
        # extents (nothing rewrites a disk that already holds its space).
        self.assertGreaterEqual(allocated, GiB, '%s: %d allocated' % (
            path, allocated))
        self.assertFalse(compute_host.ComputeHost(source).exists(path))

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a44')
    def test_cold_migration_revert_keeps_source_disk(self):
        """A cold migration reverted: the server is back on its source
        with its disk in the source's mode (the destination's, made in
        the other mode, removed).
        """
        source, dest = self.thick_and_thin()
        server = self.boot_on(self.flavor(), source)
        self.admin_servers_client.migrate_server(server['id'], host=dest)
        waiters.wait_for_server_status(self.admin_servers_client, server['id'],
                                       'VERIFY_RESIZE')
        self.assert_disk(self.admin_view(server['id']),
                         self.host_mode(dest), GiB)
        self.admin_servers_client.revert_resize_server(server['id'])
        waiters.wait_for_server_status(self.admin_servers_client, server['id'],
                                       'ACTIVE')
        self.assert_moved(server, dest, source, self.host_mode(source))

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a42')
    def test_live_block_migration_keeps_space(self):
        """Mode space: after QEMU's mirror the destination's disk is still
        all allocated, as unwritten extents (the mirror wrote no zeros and
        punched no holes).
        """
        self._test_live_block_migration('space')

    def _test_live_block_migration(self, mode):
        generations = self.older_and_newer()
        if generations:
            # From the older generation to the newer: the only way nova
            # live migrates (PreallocGenerationsTest has the other).
            server = self.boot_on(self.flavor(**{'prealloc:mode': mode}),
                                  generations[0])
        else:
            server = self.boot(self.flavor(**{'prealloc:mode': mode}))
        source = server['OS-EXT-SRV-ATTR:host']
        dest = self.other_host(server)
        host = self.host_of(server)
        path = host.disk_path(server['id'])
        before = host.qemu_img_map(path)
        data = host.guest_md5(path)
        self.live_migrate(server, dest)
        after = self.assert_moved(server, source, dest, mode)
        # The guest sees the same disk, range by range, allocated the
        # same way, and the same bytes (the guest writes nothing).
        self.assertEqual(before, after)
        self.assertEqual(data, compute_host.ComputeHost(dest).guest_md5(
            path))

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a43')
    def test_live_block_migration_keeps_full(self):
        """Mode full: the destination's disk is still all written zeros
        after the mirror (no extent left unwritten or unmapped).
        """
        self._test_live_block_migration('full')


@decorators.serial
class PreallocMigrationNoRoomTest(PreallocTwoHostsTest):
    """A block live migration to a host that cannot reserve the disk: see
    PreallocTwoHostsTest. A serial test: its flavor is sized from the
    reserving host's free space read at its start, with a margin under
    1 GiB, which another test's server leaving that host would free
    meanwhile (placement would then offer it).
    """

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a45')
    def test_live_migration_refused_without_room(self):
        """A server whose disk is thin on its host (mode metadata) and
        larger than what a host in mode space can reserve: a block live
        migration there is refused before anything moves, by placement
        (that host reports what it can reserve): the server runs on where
        it was, nothing is left on the destination, whose compute host was
        never asked (no compute_check_can_live_migrate_destination event).
        """
        dest, source = self.thick_and_thin()
        free, total = compute_host.ComputeHost(dest).free_and_total(
            CONF.prealloc.instances_path)
        # Just more than is free there, within its filesystem's size: what
        # nova's own inventory would still offer.
        disk = free // GiB + 1
        if disk > total // GiB:
            raise self.skipException(
                'no disk size between the free space and the size of the '
                'instances filesystem of %s (%d of %d bytes free)'
                % (dest, free, total))
        server = self.boot_on(self.flavor(disk=disk), source)
        self.admin_servers_client.live_migrate_server(
            server['id'], host=dest, block_migration=True)
        migrations = self.wait_for_migration(server)
        self.assertEqual(['error'], [m['status'] for m in migrations],
                         migrations)
        waiters.wait_for_server_status(self.admin_servers_client,
                                       server['id'], 'ACTIVE')
        self.assertEqual(source, self.get_host_for_server(server['id']))
        self.assertFalse(compute_host.ComputeHost(dest).exists(
            compute_host.ComputeHost(dest).disk_path(server['id'])))
        events = self.action_events(server, 'live-migration')
        self.assertEqual(
            [], [e for e in events if e['event'] ==
                 'compute_check_can_live_migrate_destination'], events)
        conductor = [e for e in events
                     if e['event'] == 'conductor_live_migrate_instance']
        self.assertEqual(['Error'], [e['result'] for e in conductor],
                         events)


class PreallocGenerationsTest(PreallocTwoHostsTest):
    """A fleet mid-upgrade: two hosts of different QEMU and libvirt
    generations (``[prealloc] host_qemu_versions``; tools/cloud-up runs
    host 2 on the other Debian release). What the plugin adds differs
    between them: discard-no-unref in the guest XML, which only a host
    with QEMU 8.1 and libvirt 9.5 takes, read from the host's own
    connection at nova-compute's start.

    Skipped on a cloud of one generation. The cloud's nova.conf sets
    ``[libvirt] hw_disk_discard = unmap``: a disk of mode metadata then
    gets ``discard='unmap'`` with ``discard_no_unref='on'`` where its
    host has both, ``discard='ignore'`` elsewhere
    (doc/source/admin/discard.rst).
    """

    def setUp(self):
        super().setUp()
        generations = self.older_and_newer()
        if generations is None:
            raise self.skipException(
                'the compute hosts run one QEMU generation ([prealloc] '
                'host_qemu_versions: %s)' % CONF.prealloc.host_qemu_versions)
        self.older, self.newer = generations

    def disk_driver(self, server):
        server = self.admin_view(server['id'])
        host = self.host_of(server)
        return host.domain_disk_driver(
            server['OS-EXT-SRV-ATTR:instance_name'],
            host.disk_path(server['id']))

    def assert_discard(self, server, host, discard, no_unref):
        driver = self.disk_driver(server)
        what = '%s on %s: <driver %s>' % (server['id'], host,
                                          dict(driver.attrib))
        self.assertEqual(discard, driver.get('discard'), what)
        self.assertEqual(no_unref, driver.get('discard_no_unref'), what)

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a80')
    def test_cold_migration_both_ways_sets_each_hosts_discard(self):
        """A disk of mode metadata cold migrated from the newer host to
        the older and back: its guest XML has discard-no-unref on the
        newer host only (the destination's capability, never the
        source's), and its disk and data are the same all the way.
        """
        server = self.boot_on(self.flavor(**{'prealloc:mode': 'metadata'}),
                              self.newer)
        self.assert_disk(server, 'metadata', GiB)
        self.assert_discard(server, self.newer, 'unmap', 'on')
        path = self.host_of(server).disk_path(server['id'])
        data = self.host_of(server).guest_md5(path)
        self.cold_migrate(server, self.older)
        self.assert_moved(server, self.newer, self.older, 'metadata')
        self.assert_discard(server, self.older, 'ignore', None)
        self.assertEqual(data, compute_host.ComputeHost(
            self.older).guest_md5(path))
        self.cold_migrate(server, self.newer)
        self.assert_moved(server, self.older, self.newer, 'metadata')
        self.assert_discard(server, self.newer, 'unmap', 'on')
        self.assertEqual(data, compute_host.ComputeHost(
            self.newer).guest_md5(path))

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a81')
    def test_live_migration_to_the_older_host_refused(self):
        """A block live migration from the newer host to the older is
        refused by nova's conductor before anything moves
        (DestinationHypervisorTooOld): the server runs on where it was,
        its disk unchanged, nothing left on the older host.
        """
        server = self.boot_on(self.flavor(**{'prealloc:mode': 'space'}),
                              self.newer)
        host = self.host_of(server)
        path = host.disk_path(server['id'])
        before = host.qemu_img_map(path)
        data = host.guest_md5(path)
        self.admin_servers_client.live_migrate_server(
            server['id'], host=self.older, block_migration=True)
        migrations = self.wait_for_migration(server)
        self.assertEqual(['error'], [m['status'] for m in migrations],
                         migrations)
        waiters.wait_for_server_status(self.admin_servers_client,
                                       server['id'], 'ACTIVE')
        self.assertEqual(self.newer, self.get_host_for_server(server['id']))
        self.assertEqual(before, host.qemu_img_map(path))
        self.assertEqual(data, host.guest_md5(path))
        self.assert_disk(self.admin_view(server['id']), 'space', GiB)
        older = compute_host.ComputeHost(self.older)
        self.assertFalse(older.exists(older.disk_path(server['id'])))
        events = self.action_events(server, 'live-migration')
        conductor = [e for e in events
                     if e['event'] == 'conductor_live_migrate_instance']
        self.assertEqual(['Error'], [e['result'] for e in conductor],
                         events)
        # Refused before the destination was asked.
        self.assertEqual(
            [], [e for e in events if e['event'] ==
                 'compute_check_can_live_migrate_destination'], events)

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a82')
    def test_live_migration_to_the_newer_host_keeps_the_guest_xml(self):
        """A block live migration from the older host to the newer: the
        guest runs there with the XML it had (QEMU's migration keeps the
        source's disk settings: ``ignore``, no discard-no-unref), its disk
        allocated as its flavor's mode says and the same data; a hard
        reboot there then defines it with the newer host's settings.
        """
        server = self.boot_on(self.flavor(**{'prealloc:mode': 'metadata'}),
                              self.older)
        self.assert_discard(server, self.older, 'ignore', None)
        path = self.host_of(server).disk_path(server['id'])
        data = self.host_of(server).guest_md5(path)
        self.live_migrate(server, self.newer)
        self.assert_moved(server, self.older, self.newer, 'metadata')
        self.assert_discard(server, self.newer, 'ignore', None)
        self.assertEqual(data, compute_host.ComputeHost(
            self.newer).guest_md5(path))
        self.admin_servers_client.reboot_server(server['id'], type='HARD')
        waiters.wait_for_server_status(self.admin_servers_client,
                                       server['id'], 'ACTIVE')
        self.assert_discard(server, self.newer, 'unmap', 'on')
        self.assert_disk(self.admin_view(server['id']), 'metadata', GiB)


class PreallocReservationWalkTest(PreallocTwoHostsTest):
    """A disk of mode space through every step nova takes it through that
    the API can drive without taking a host down (stop and start, hard
    reboot, snapshot, rebuild, a resize to whichever host the scheduler
    picks (the cloud allows the same host), a cold migration to the other
    host, block live migration where nova allows it, shelve offload and
    unshelve), starting on each generation's host: after each, the disk's
    blocks are all reserved (st_blocks at least its virtual size) on the
    host it is on, and ``prealloc-backend report`` there says the disk is
    at its policy. Each step's figures are recorded (reservation()). The
    steps that take a host down or need another image are
    PreallocEvacuateTest and PreallocGuestTrimTest; adoption is
    PreallocAdoptTest's.
    """

    min_microversion = '2.84'

    @classmethod
    def skip_checks(cls):
        super().skip_checks()
        if not CONF.compute_feature_enabled.shelve:
            raise cls.skipException('shelve is not enabled')

    def check_reserved(self, server, step, size, start):
        self.assert_reserved(self.reservation(server, step, size,
                                              walk=start))

    def _walk(self, start):
        other = [h for h in CONF.prealloc.host_modes if h != start]
        if not other:
            raise self.skipException('needs two hosts in [prealloc] '
                                     'host_modes')
        flavor = self.flavor(**{'prealloc:mode': 'space'})
        bigger = self.flavor(disk=2, **{'prealloc:mode': 'space'})
        server = self.boot_on(flavor, start)
        self.check_reserved(server, 'create', GiB, start)
        sid = server['id']
        client = self.admin_servers_client
        client.stop_server(sid)
        waiters.wait_for_server_status(client, sid, 'SHUTOFF')
        client.start_server(sid)
        waiters.wait_for_server_status(client, sid, 'ACTIVE')
        self.check_reserved(server, 'stop/start', GiB, start)
        client.reboot_server(sid, type='HARD')
        waiters.wait_for_server_status(client, sid, 'ACTIVE')
        self.check_reserved(server, 'hard reboot', GiB, start)
        # The admin's server (nova:HOST): the admin's snapshot (2.45 and
        # later answer with its id).
        image_id = self.os_admin.compute_images_client.create_image(
            sid, name='prealloc-walk-%s' % sid)['image_id']
        self.addCleanup(self.os_admin.image_client_v2.delete_image,
                        image_id)
        waiters.wait_for_image_status(self.os_admin.image_client_v2,
                                      image_id, 'active')
        waiters.wait_for_server_status(client, sid, 'ACTIVE')
        self.check_reserved(server, 'snapshot', GiB, start)
        client.rebuild_server(sid, CONF.compute.image_ref_alt)
        waiters.wait_for_server_status(client, sid, 'ACTIVE')
        self.check_reserved(server, 'rebuild', GiB, start)
        client.resize_server(sid, bigger['id'])
        waiters.wait_for_server_status(client, sid, 'VERIFY_RESIZE')
        client.confirm_resize_server(sid)
        waiters.wait_for_server_status(client, sid, 'ACTIVE')
        self.check_reserved(server, 'resize', 2 * GiB, start)
        here = self.get_host_for_server(sid)
        self.cold_migrate(server, start if here != start else other[0])
        self.check_reserved(server, 'cold migration', 2 * GiB, start)
        generations = self.older_and_newer()
        here = self.get_host_for_server(sid)
        if generations is None or here == generations[0]:
            dest = [h for h in CONF.prealloc.host_modes if h != here][0]
            # Not live_migrate(): the server has moved before (its resize
            # and cold migration are migrations too).
            client.live_migrate_server(sid, host=dest, block_migration=True)
            waiters.wait_for_server_status(client, sid, 'ACTIVE')
            deadline = time.time() + CONF.compute.build_timeout
            while (self.get_host_for_server(sid) != dest and
                   time.time() < deadline):
                time.sleep(2)
            self.assertEqual(dest, self.get_host_for_server(sid))
            self.check_reserved(server, 'live migration', 2 * GiB, start)
        compute.shelve_server(client, sid, force_shelve_offload=True)
        client.unshelve_server(sid)
        waiters.wait_for_server_status(client, sid, 'ACTIVE')
        self.check_reserved(server, 'shelve/unshelve', 2 * GiB, start)

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a70')
    def test_reservation_kept_from_the_first_host(self):
        self._walk(self.nth_host(0))

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a71')
    def test_reservation_kept_from_the_second_host(self):
        self._walk(self.nth_host(1))


def discard_no_unref_expected(host):
    """Whether ``host`` has discard-no-unref: QEMU 8.1 or later
    (``[prealloc] host_qemu_versions``), which the Debian releases the
    test cloud runs pair with libvirt 9.5 or later (Debian 13: QEMU 10.0,
    libvirt 11.3; Debian 12: QEMU 7.2, libvirt 9.0). The plugin reads it
    from the host's own QEMU and libvirt; this is the test's own answer.
    """
    version = CONF.prealloc.host_qemu_versions.get(host)
    if not version:
        return None
    return tuple(int(p) for p in version.split('.')[:2]) >= (8, 1)


class PreallocGuestTrimTest(PreallocTwoHostsTest):
    """A guest's TRIM through nova, on each host (each generation), with
    the cloud's ``[libvirt] hw_disk_discard = unmap`` and the plugin's
    ``guest_discard = keep`` (its default): the guest of ``[prealloc]
    trim_image_ref`` writes 16 MiB of 0xaa at 128 MiB of its disk,
    discards 512 MiB from there (blkdiscard), writes 4 MiB of zeros at
    the start of the range, reports on its console and powers off.

    What ``keep`` promises (doc/source/admin/discard.rst): a disk of mode
    space keeps every block it reserved and the guest still reads its
    0xaa (``discard='ignore'``); a disk of mode metadata on a host with
    discard-no-unref reads zeros in the range and keeps every cluster
    where it was (``discard='unmap' discard_no_unref='on'``), elsewhere
    the TRIM is ignored.
    """

    @classmethod
    def skip_checks(cls):
        super().skip_checks()
        if not CONF.prealloc.trim_image_ref:
            raise cls.skipException('[prealloc] trim_image_ref is not set')

    TRIM_START = 128 * MiB
    TRIM_END = (128 + 512) * MiB

    def trim(self, host, mode):
        """A server of mode ``mode`` on ``host`` from the TRIM image, once
        its guest has reported (its console log, read_console): (server,
        the report's fields, the disk's <driver> element).
        """
        flavor = self.flavor(**{'prealloc:mode': mode})
        # The guest powers off once it has reported: nova may show the
        # server ACTIVE or already SHUTOFF (nova's API then has no console
        # for it); its console log says when it is done (flushed before
        # the report).
        body = self.create_test_server(
            clients=self.os_admin, flavor=flavor['id'],
            image_id=CONF.prealloc.trim_image_ref, wait_until=None,
            availability_zone='nova:%s' % host)
        deadline = time.time() + CONF.compute.build_timeout
        report = done = None
        console = ''
        while True:
            server = self.admin_view(body['id'])
            self.assertNotEqual('ERROR', server['status'], server)
            if server['status'] in ('ACTIVE', 'SHUTOFF'):
                console = self.host_of(server).read_console(server['id'])
                for line in console.splitlines():
                    words = line.strip().split()
                    if words[:2] == ['PREALLOC-GUEST', 'trim']:
                        report = dict(w.split('=', 1) for w in words[2:]
                                      if '=' in w)
                    elif words[:2] in (['PREALLOC-GUEST', 'done'],
                                       ['PREALLOC-GUEST', 'error']):
                        done = words[1]
            if done or time.time() > deadline:
                break
            time.sleep(3)
        what = '%s on %s, mode %s: console %s' % (body['id'], host, mode,
                                                  console[-3000:])
        self.assertEqual('done', done, what)
        self.assertIsNotNone(report, what)
        self.assertEqual(host, server['OS-EXT-SRV-ATTR:host'])
        self.assertEqual(('0', '0', '0', '0'),
                         (report.get('rc'), report.get('write_rc'),
                          report.get('fill_rc'), report.get('again')), what)
        target = self.host_of(server)
        driver = target.domain_disk_driver(
            server['OS-EXT-SRV-ATTR:instance_name'],
            target.disk_path(server['id']))
        return server, report, driver

    def own_clusters_in_range(self, server):
        """The ranges of the trimmed range ``qemu-img map`` says the
        overlay itself holds, with their host offsets, and the bytes of
        the range they cover.
        """
        target = self.host_of(server)
        out = json.loads(target.run(
            ['qemu-img', 'map', '-f', 'qcow2', '--force-share',
             '--output=json', target.disk_path(server['id'])]).stdout)
        own = [r for r in out if r['depth'] == 0 and
               r['start'] < self.TRIM_END and
               r['start'] + r['length'] > self.TRIM_START]
        covered = sum(min(self.TRIM_END, r['start'] + r['length']) -
                      max(self.TRIM_START, r['start']) for r in own)
        return own, covered

    def _trim_on(self, host):
        no_unref = discard_no_unref_expected(host)
        if no_unref is None:
            raise self.skipException('[prealloc] host_qemu_versions does '
                                     'not give the QEMU of %s' % host)
        # Mode space: the TRIM is ignored, every block stays reserved and
        # the guest reads what it wrote.
        server, report, driver = self.trim(host, 'space')
        what = '%s, space: %s, <driver %s>' % (host, report,
                                               dict(driver.attrib))
        self.assertEqual(('ignore', None), (driver.get('discard'),
                                            driver.get('discard_no_unref')),
                         what)
        self.assertEqual('no', report.get('zeroed'), what)
        self.assert_reserved(self.reservation(server, 'guest TRIM'))
        # Mode metadata: zeros and the layout kept where the host has
        # discard-no-unref, the TRIM ignored elsewhere.
        server, report, driver = self.trim(host, 'metadata')
        what = '%s, metadata: %s, <driver %s>' % (host, report,
                                                  dict(driver.attrib))
        own, covered = self.own_clusters_in_range(server)
        if no_unref:
            self.assertEqual(('unmap', 'on'),
                             (driver.get('discard'),
                              driver.get('discard_no_unref')), what)
            self.assertEqual('yes', report.get('zeroed'), what)
            # Every cluster of the range still the overlay's, at an
            # offset: none was freed to the filesystem.
            self.assertEqual(self.TRIM_END - self.TRIM_START, covered,
                             '%s: %s' % (what, own))
            self.assertEqual([], [r for r in own if 'offset' not in r],
                             what)
        else:
            self.assertEqual(('ignore', None),
                             (driver.get('discard'),
                              driver.get('discard_no_unref')), what)
            self.assertEqual('no', report.get('zeroed'), what)
        row = self.reservation(server, 'guest TRIM')
        self.assertEqual('metadata', row['report_mode'], row)
        self.assertEqual(1.0, row['report_at_policy'], row)

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a72')
    def test_guest_trim_on_the_first_host(self):
        self._trim_on(self.nth_host(0))

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a73')
    def test_guest_trim_on_the_second_host(self):
        self._trim_on(self.nth_host(1))


@decorators.serial
class PreallocEvacuateTest(PreallocTwoHostsTest):
    """Evacuation from each host to the other: a server of mode space on
    a host whose nova-compute stops (``[prealloc]
    compute_restart_command --stop``; its guest runs on), the service
    forced down in nova's API, the server evacuated to the other host
    (rebuilt there from its image: the destination's plugin makes the
    disk), then the host's nova-compute started again, which removes the
    evacuated guest's disk (nova's init_host), and the service forced up.
    The disk on the destination keeps every block of its mode (recorded:
    reservation()). A serial test: no other test may find a host down.
    """

    @classmethod
    def skip_checks(cls):
        super().skip_checks()
        if not CONF.prealloc.compute_restart_command:
            raise cls.skipException(
                '[prealloc] compute_restart_command is not set')

    def service_id(self, host):
        services = self.os_admin.services_client.list_services(
            binary='nova-compute', host=host)['services']
        self.assertEqual(1, len(services), services)
        return services[0]['id']

    def wait_for_service(self, host, state):
        deadline = time.time() + 120
        while True:
            services = self.os_admin.services_client.list_services(
                binary='nova-compute', host=host)['services']
            if [s['state'] for s in services] == [state]:
                return
            if time.time() > deadline:
                self.fail('nova-compute of %s not %s after 120 s: %s'
                          % (host, state, services))
            time.sleep(2)

    def host_back(self, host):
        """nova-compute started again, then the service forced up: nova
        refuses that until the restarted service has completed the
        host's evacuations (its init_host), so it is retried meanwhile.
        """
        if host not in self.down:
            return
        self.restart_compute(host)
        service_id = self.service_id(host)
        deadline = time.time() + 120
        while True:
            try:
                self.os_admin.services_client.update_service(
                    service_id, forced_down=False)
                break
            except lib_exc.BadRequest:
                if time.time() > deadline:
                    raise
                time.sleep(2)
        self.wait_for_service(host, 'up')
        self.down.remove(host)

    def _evacuate(self, source, dest):
        server = self.boot_on(self.flavor(**{'prealloc:mode': 'space'}),
                              source)
        self.assert_reserved(self.reservation(server, 'create'))
        old = compute_host.ComputeHost(source)
        path = old.disk_path(server['id'])
        self.down.add(source)
        self.addCleanup(self.host_back, source)
        self.restart_compute(source, '--stop')
        self.os_admin.services_client.update_service(
            self.service_id(source), forced_down=True)
        self.wait_for_service(source, 'down')
        self.admin_servers_client.evacuate_server(server['id'], host=dest)
        # The server is ACTIVE before the destination has made the guest
        # its own (nova's finish_evacuation sets the host, then marks the
        # evacuation done): its record, not its status, says when.
        migrations = self.wait_for_migration(server)
        self.assertEqual(['done'], [m['status'] for m in migrations],
                         migrations)
        waiters.wait_for_server_status(self.admin_servers_client,
                                       server['id'], 'ACTIVE')
        self.assertEqual(dest, self.get_host_for_server(server['id']))
        self.assert_reserved(self.reservation(server, 'evacuation'))
        # The source, started again, removes what it held of the guest.
        self.host_back(source)
        deadline = time.time() + 120
        while old.exists(path) and time.time() < deadline:
            time.sleep(2)
        self.assertFalse(old.exists(path),
                         '%s still on %s after its nova-compute started'
                         % (path, source))

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a74')
    def test_evacuation_both_ways_keeps_space(self):
        self.down = set()
        hosts = sorted(CONF.prealloc.host_modes)
        if len(hosts) < 2:
            raise self.skipException('one host in [prealloc] host_modes')
        self._evacuate(hosts[0], hosts[1])
        self._evacuate(hosts[1], hosts[0])


class PreallocExtraSpecsTest(base.BaseV2ComputeAdminTest):
    """nova-api refuses bad prealloc: extra specs with the plugin's
    message (its validators, loaded from the nova.api.extra_spec_validators
    entry point) from microversion 2.86.
    """

    min_microversion = '2.86'
    max_microversion = 'latest'

    def _flavor(self):
        return self.create_flavor(ram=128, vcpus=1, disk=1)

    def _specs(self, flavor):
        return self.admin_flavors_client.list_flavor_extra_specs(
            flavor['id'])['extra_specs']

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a20')
    def test_bad_mode_refused(self):
        flavor = self._flavor()
        exc = self.assertRaises(
            lib_exc.BadRequest,
            self.admin_flavors_client.set_flavor_extra_spec,
            flavor['id'], **{'prealloc:mode': 'bogus'})
        self.assertIn("'bogus' is not one of: none, metadata, space, full",
                      str(exc))
        self.assertNotIn('prealloc:mode', self._specs(flavor))

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a21')
    def test_unknown_key_refused(self):
        flavor = self._flavor()
        exc = self.assertRaises(
            lib_exc.BadRequest,
            self.admin_flavors_client.set_flavor_extra_spec,
            flavor['id'], **{'prealloc:mdoe': 'full'})
        self.assertIn("extra spec 'prealloc:mdoe' is not a known prealloc "
                      "extra spec", str(exc))

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a22')
    def test_valid_specs_accepted(self):
        flavor = self._flavor()
        self.admin_flavors_client.set_flavor_extra_spec(
            flavor['id'], **{'prealloc:mode': 'full',
                             'prealloc:cluster_size': '256K'})
        specs = self._specs(flavor)
        self.assertEqual('full', specs['prealloc:mode'])
        self.assertEqual('256K', specs['prealloc:cluster_size'])


class PreallocCheckTest(base.BaseV2ComputeAdminTest):
    """``prealloc-backend check`` passes on every running compute host."""

    @classmethod
    def skip_checks(cls):
        super().skip_checks()
        if not CONF.prealloc.instances_path:
            raise cls.skipException('[prealloc] instances_path is not set')

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a30')
    def test_check_passes_on_compute_hosts(self):
        services = self.os_admin.services_client.list_services(
            binary='nova-compute')['services']
        hosts = [s['host'] for s in services if s['state'] == 'up']
        self.assertNotEqual([], hosts, services)
        for name in hosts:
            code, report = compute_host.ComputeHost(name).prealloc_check()
            self.assertEqual(0, code, '%s: %s' % (name, report))


@decorators.serial
class PreallocAdoptTest(PreallocTwoHostsTest):
    """``prealloc-backend adopt`` on a running server, then nova's own
    operations on the adopted disk: a block live migration and a resize.

    The server boots in mode none (nova's own overlay: a disk made before
    the plugin's policy), on the host whose mode reserves nothing, its
    nova-compute restarted in mode none for the boot and in its own mode
    after ([prealloc] compute_restart_command; without it, in the host's
    own mode). Then the host's policy is switched to space for the command
    (a configuration file after nova-compute's, as an operator changing
    ``[prealloc_backend] mode`` would), which rewrites the disk live. A
    serial test: no other test runs while a nova-compute restarts.
    """

    def adopt(self, server, mode):
        host = self.host_of(server)
        override = '/tmp/prealloc-adopt-%s.conf' % server['id']
        host.run(['sh', '-c', 'printf "[prealloc_backend]\\nmode = %s\\n" '
                  '> %s' % (mode, override)])
        try:
            proc = host.run([CONF.prealloc.prealloc_backend_command, 'adopt',
                             '--config-file', CONF.prealloc.compute_config,
                             '--config-file', override,
                             '--instance', server['id']], check=False,
                            timeout=CONF.compute.build_timeout)
        finally:
            host.run(['rm', '-f', override])
        self.assertEqual(0, proc.returncode, proc.stdout + proc.stderr)
        return proc.stdout

    def adopted_on(self, name):
        """A server booted in mode none on host ``name`` (its nova-compute
        restarted in mode none for the boot, then in its own; without
        ``[prealloc] compute_restart_command`` in the host's own mode),
        then adopted live in mode space: its disk reserved, the guest's
        data the same, recorded (reservation(), step adoption).
        """
        if CONF.prealloc.compute_restart_command:
            mode = 'none'
            try:
                self.restart_compute(name, '--mode', mode)
                server = self.boot_on(self.flavor(), name)
            finally:
                self.restart_compute(name)
        else:
            mode = self.host_mode(name)
            server = self.boot_on(self.flavor(), name)
        self.assert_disk(server, mode, GiB)
        host = self.host_of(server)
        path = host.disk_path(server['id'])
        data = host.guest_md5(path)

        out = self.adopt(server, 'space')

        self.assertIn('adopted live', out)
        self.assert_disk(self.admin_view(server['id']), 'space', GiB)
        self.assertEqual(data, host.guest_md5(path))
        row = self.reservation(server, 'adoption')
        self.assertGreaterEqual(row['allocated'], row['virtual'], row)
        # Nothing of the command is left, and nova's records are free.
        self.assertIsNone(self.admin_view(server['id'])[
            'OS-EXT-STS:task_state'])
        # A second run finds the disk at policy.
        self.assertIn('at the policy of mode space', self.adopt(server,
                                                                'space'))
        return server

    def resize_to_space(self, server):
        bigger = self.flavor(disk=2, **{'prealloc:mode': 'space'})
        self.admin_servers_client.resize_server(server['id'], bigger['id'])
        waiters.wait_for_server_status(self.admin_servers_client,
                                       server['id'], 'VERIFY_RESIZE')
        self.admin_servers_client.confirm_resize_server(server['id'])
        waiters.wait_for_server_status(self.admin_servers_client,
                                       server['id'], 'ACTIVE')
        self.assert_disk(self.admin_view(server['id']), 'space', 2 * GiB)

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a50')
    def test_adopted_disk_live_migrates_and_resizes(self):
        """Adopted on the host whose mode reserves nothing (the older
        generation's in a fleet mid-upgrade), live migrated to the other.
        """
        thick, thin = self.thick_and_thin()
        server = self.adopted_on(thin)
        # nova moves the adopted disk: the destination's mode is space.
        self.live_migrate(server, thick)
        self.assert_moved(server, thin, thick, 'space')
        self.resize_to_space(server)

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a51')
    def test_adopted_on_the_reserving_host_resizes(self):
        """Adopted on the host whose mode reserves (the newer generation's
        in a fleet mid-upgrade, from which nova live migrates to no older
        host), then resized with a space flavor.
        """
        thick, _thin = self.thick_and_thin()
        server = self.adopted_on(thick)
        self.resize_to_space(server)


@decorators.serial
class PreallocLeavingTest(PreallocTwoHostsTest):
    """Leaving the plugin (doc/source/install/upgrade.rst, "Removal"):
    the host whose mode reserves nothing (in a fleet mid-upgrade the older
    generation's) restarted as stock nova (``[prealloc] compute_restart_command
    HOST --stock``: nova's own nova-compute, compute_driver =
    libvirt.LibvirtDriver, no sudo rule for the plugin's daemon), and a
    disk the plugin made there (mode space) through nova's operations:
    stop and start, hard reboot, snapshot, a block live migration from it,
    a cold migration back to it, a resize on it and a resize from it to
    the other host; the guest's data and the disk's layout stay, and a new
    server there gets stock nova's own overlay (the plugin is off). The
    plugin comes back at the end. A serial test: no other test may meet a
    host restarted as stock nova.
    """

    @classmethod
    def skip_checks(cls):
        super().skip_checks()
        if not CONF.prealloc.compute_restart_command:
            raise cls.skipException(
                '[prealloc] compute_restart_command is not set')

    def assert_plugin_layout(self, server, size):
        """The disk the plugin made (extended_l2, its cluster) is still
        one, at ``size``, every block still allocated where it was;
        returns the guest's md5.
        """
        server = self.admin_view(server['id'])
        host = self.host_of(server)
        path = host.disk_path(server['id'])
        info = host.qemu_img_info(path)
        specific = info.get('format-specific', {}).get('data', {})
        what = '%s on %s: %s' % (path, server['OS-EXT-SRV-ATTR:host'], info)
        self.assertEqual(size, info['virtual-size'], what)
        self.assertTrue(specific.get('extended-l2'), what)
        self.assertEqual(PLUGIN_CLUSTER, info['cluster-size'], what)
        return host.guest_md5(path)

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a75')
    def test_stock_nova_runs_the_plugins_disks(self):
        if self.older_and_newer() is None:
            # tools/cloud-compute --stock refuses it: both hosts read the
            # machine's sudo rules.
            raise self.skipException(
                'the compute hosts run one generation: they share the '
                "machine's sudo rules, which --stock would change for both")
        _thick, stock = self.thick_and_thin()
        other = [h for h in CONF.prealloc.host_modes if h != stock][0]
        client = self.admin_servers_client
        server = self.boot_on(self.flavor(**{'prealloc:mode': 'space'}),
                              stock)
        sid = server['id']
        self.assert_disk(server, 'space', GiB)
        data = self.assert_plugin_layout(server, GiB)

        self.addCleanup(self.restart_compute, stock)
        self.restart_compute(stock, '--stock')
        # The plugin is off: a new server there gets nova's own overlay.
        fresh = self.boot_on(self.flavor(), stock)
        target = self.host_of(fresh)
        info = target.qemu_img_info(target.disk_path(fresh['id']))
        self.assertFalse(info.get('format-specific', {}).get('data', {}).get(
            'extended-l2', False), info)
        self.assertEqual(QEMU_CLUSTER, info['cluster-size'], info)

        client.stop_server(sid)
        waiters.wait_for_server_status(client, sid, 'SHUTOFF')
        client.start_server(sid)
        waiters.wait_for_server_status(client, sid, 'ACTIVE')
        client.reboot_server(sid, type='HARD')
        waiters.wait_for_server_status(client, sid, 'ACTIVE')
        self.assertEqual(data, self.assert_plugin_layout(server, GiB))
        # Stock nova leaves the disk's blocks as they were.
        self.assert_disk(self.admin_view(sid), 'space', GiB)

        image_id = self.os_admin.compute_images_client.create_image(
            sid, name='prealloc-leaving-%s' % sid)['image_id']
        self.addCleanup(self.os_admin.image_client_v2.delete_image,
                        image_id)
        waiters.wait_for_image_status(self.os_admin.image_client_v2,
                                      image_id, 'active')
        waiters.wait_for_server_status(client, sid, 'ACTIVE')

        # Out of the stock host live, back to it cold.
        self.live_migrate(server, other)
        self.assertEqual(data, self.assert_plugin_layout(server, GiB))
        self.cold_migrate(server, stock)
        self.assertEqual(stock, self.get_host_for_server(sid))
        self.assertEqual(data, self.assert_plugin_layout(server, GiB))

        # A resize stock nova does on that host (the flavor forbids the
        # reserving hosts' trait): qemu-img resize of the plugin's disk.
        self.resize(sid, self.flavor(disk=2, **{
            'prealloc:mode': 'space',
            'trait:CUSTOM_PREALLOC_RESERVING': 'forbidden'}))
        self.assertEqual(stock, self.get_host_for_server(sid))
        data = self.assert_plugin_layout(server, 2 * GiB)
        # Out of it cold: a resize to a flavor only the other (reserving)
        # host takes.
        self.resize(sid, self.flavor(disk=2, **{
            'prealloc:mode': 'space',
            'trait:CUSTOM_PREALLOC_RESERVING': 'required'}))
        self.assertEqual(other, self.get_host_for_server(sid))
        self.assertEqual(data, self.assert_plugin_layout(server, 2 * GiB))
        # A live migration back to the stock host: nova refuses it across
        # generations (the newer to the older, PreallocGenerationsTest),
        # and the flavor now requires the other host's trait.

    def resize(self, sid, flavor):
        client = self.admin_servers_client
        client.resize_server(sid, flavor['id'])
        waiters.wait_for_server_status(client, sid, 'VERIFY_RESIZE')
        client.confirm_resize_server(sid)
        waiters.wait_for_server_status(client, sid, 'ACTIVE')


@decorators.serial
class PreallocCapacityTest(PreallocTwoHostsTest):
    """Placement sees what a host whose mode reserves can really reserve
    (doc/source/admin/capacity.rst): files nova does not know about fill
    that host's instances filesystem (``[prealloc] scratch_path``, beside
    the instances directory), so that a space flavor fits placement's
    stock view of it (its filesystem's size less the flavors on it) but not
    the host. The server lands on the other host at the first attempt; a
    cold migration and a resize to the full host are refused by the
    scheduler, the server ACTIVE on its source with its disk unchanged;
    ``prealloc-backend report`` on both hosts agrees with the files. A
    serial test: no other test's server may take or free room on the
    hosts meanwhile.
    """

    # The room left on the full host for new disks: less than the flavor.
    LEFT = GiB + GiB // 2
    # Seconds for placement to see a change: the cloud's compute hosts
    # update it every 10 s (update_resources_interval).
    PLACEMENT_WAIT = 90

    @classmethod
    def skip_checks(cls):
        super().skip_checks()
        if not CONF.prealloc.scratch_path:
            raise cls.skipException('[prealloc] scratch_path is not set')

    # -- placement -------------------------------------------------------

    def rp_uuid(self, host):
        rps = self.os_admin.resource_providers_client.list_resource_providers(
            name=host)['resource_providers']
        self.assertEqual(1, len(rps), rps)
        return rps[0]['uuid']

    def placement_get(self, url, version='1.6'):
        client = self.os_admin.resource_providers_client
        resp, body = client.get(url, headers={
            'OpenStack-API-Version': 'placement %s' % version},
            extra_headers=True)
        return json.loads(body)

    def disk_gb(self, host):
        """(DISK_GB inventory, DISK_GB usage) of ``host``."""
        uuid = self.rp_uuid(host)
        inv = self.placement_get('/resource_providers/%s/inventories'
                                 % uuid)['inventories']['DISK_GB']
        usage = self.placement_get('/resource_providers/%s/usages'
                                   % uuid)['usages'].get('DISK_GB', 0)
        return inv, usage

    def offered_gb(self, host):
        inv, usage = self.disk_gb(host)
        return (int((inv['total'] - inv['reserved']) *
                    inv['allocation_ratio']) - usage)

    def wait_for_offer(self, host, predicate, what):
        deadline = time.time() + self.PLACEMENT_WAIT
        while True:
            offered = self.offered_gb(host)
            if predicate(offered):
                return offered
            if time.time() > deadline:
                self.fail('placement still offers %d GiB on %s after %d s '
                          '(%s): %s' % (offered, host, self.PLACEMENT_WAIT,
                                        what, self.disk_gb(host)))
            time.sleep(2)

    def candidates(self, disk_gb):
        """The hosts placement offers a flavor of ``disk_gb`` GiB (and
        this test's RAM and one VCPU).
        """
        found = self.placement_get(
            '/allocation_candidates?resources=DISK_GB:%d,MEMORY_MB:128,'
            'VCPU:1' % disk_gb, version='1.10')['provider_summaries']
        names = {}
        for uuid in found:
            names[self.placement_get('/resource_providers/%s'
                                     % uuid)['name']] = uuid
        return sorted(names)

    # -- the files ---------------------------------------------------------

    def disk_state(self, server):
        host = self.host_of(server)
        path = host.disk_path(server['id'])
        ident = host.run(['stat', '-c', '%i %s %b', path]).stdout.split()
        return ident, host.qemu_img_map(path)

    def fill(self, host, left):
        """Files nova does not know about on ``host``'s instances
        filesystem, leaving ``left`` bytes to an unprivileged user;
        removed at cleanup (and placement waited for).
        """
        scratch = CONF.prealloc.scratch_path
        target = compute_host.ComputeHost(host)
        free, total = target.free_and_total(scratch)
        if free <= left + GiB:
            raise self.skipException('%s has only %d bytes free' % (host,
                                                                  free))
        filler = '%s/prealloc-capacity-test' % scratch.rstrip('/')
        self.addCleanup(self.wait_for_offer, host, lambda gb: gb >= 2,
                        'the files removed')
        self.addCleanup(target.remove, filler)
        target.fill(filler, free - left)
        return free, total

    def assert_report_matches_files(self, host):
        """``prealloc-backend report`` on ``host``: every disk it lists
        agrees with the files (st_blocks, qemu-img info), the filesystem
        with statvfs.
        """
        target = compute_host.ComputeHost(host)
        text = target.prealloc_report()
        metrics = report_metrics(text)
        self.assertEqual([1.0], [s.value for s in
                                 metrics['prealloc_report_success']], text)
        free, total = target.free_and_total(CONF.prealloc.instances_path)
        self.assertEqual([total], [s.value for s in
                                   metrics['prealloc_fs_size_bytes']])
        disks = metrics.get('prealloc_disk_allocated_bytes', [])
        virtual = {(s.labels['instance_uuid'], s.labels['disk']): s.value
                   for s in metrics.get('prealloc_disk_virtual_bytes', [])}
        for sample in disks:
            uuid, name = sample.labels['instance_uuid'], sample.labels['disk']
            path = target.disk_path(uuid, name)
            _size, allocated = target.stat(path)
            # A running guest may write between the two reads: its disk
            # only grows.
            self.assertLessEqual(sample.value, allocated, (path, text))
            if sample.labels['format'] == 'qcow2':
                info = target.qemu_img_info(path)
                self.assertEqual(info['virtual-size'],
                                 virtual[(uuid, name)], path)
        return metrics

    # -- the test ------------------------------------------------------------

    @decorators.idempotent_id('6c1f0e84-6a1e-4d38-9a55-2f0c8b1e0a60')
    def test_full_host_refused_by_the_scheduler(self):
        thick, thin = self.thick_and_thin()
        self.wait_for_offer(thick, lambda gb: gb >= 2, 'before the test')
        before = self.disk_gb(thick)
        free, total = self.fill(thick, self.LEFT)
        # The full host's offer drops below the 2 GiB flavor, though its
        # filesystem's size less the flavors on it is far above.
        offered = self.wait_for_offer(thick, lambda gb: gb < 2,
                                      'the files added')
        inv, usage = self.disk_gb(thick)
        self.assertGreaterEqual(inv['total'] - usage, 2, (before, inv))
        self.assertLessEqual(offered * GiB, self.LEFT, (before, inv))
        self.assertEqual(1.0, inv['allocation_ratio'])
        self.assertNotIn(thick, self.candidates(2))
        self.assertIn(thin, self.candidates(2))

        # The build: on the other host at the first attempt.
        flavor = self.flavor(disk=2, **{'prealloc:mode': 'space'})
        server = self.boot(flavor)
        self.assertEqual(thin, server['OS-EXT-SRV-ATTR:host'])
        events = self.action_events(server, 'create')
        disk_events = [e for e in events
                       if e['event'].startswith(DISK_EVENT)]
        self.assertEqual([(DISK_EVENT, thin, 'Success')],
                         [(e['event'], e['host'], e['result'])
                          for e in disk_events], events)
        state = self.disk_state(server)
        path = self.host_of(server).disk_path(server['id'])

        # A cold migration: the only other host is the full one.
        self.admin_servers_client.migrate_server(server['id'])
        self.assert_refused(server, 'migrate', thin, thick, state, path, 1)

        # A resize to a space flavor that only reserving hosts take.
        bigger = self.flavor(disk=3, **{
            'prealloc:mode': 'space',
            'trait:CUSTOM_PREALLOC_RESERVING': 'required'})
        self.admin_servers_client.resize_server(server['id'], bigger['id'])
        self.assert_refused(server, 'resize', thin, thick, state, path, 2)

        # The report of both hosts, against their files.
        metrics = self.assert_report_matches_files(thin)
        # The server's disk, with its flavor's mode (read from nova's
        # metadata in its domain) and at that policy; its 2 GiB counted in
        # what placement still offers there.
        labels = [s.labels for s in metrics['prealloc_disk_at_policy']
                  if s.labels['instance_uuid'] == server['id']]
        self.assertEqual([('disk', 'space', 'qcow2')],
                         [(lab['disk'], lab['mode'], lab['format'])
                          for lab in labels], metrics)
        self.assertEqual([1.0], [s.value for s in
                                 metrics['prealloc_disk_at_policy']
                                 if s.labels['instance_uuid'] ==
                                 server['id']])
        inv, usage = self.disk_gb(thin)
        self.assertEqual(
            [(int((inv['total'] - inv['reserved']) *
                  inv['allocation_ratio']) - usage) * GiB],
            [s.value for s in metrics['prealloc_placement_offered_bytes']])
        metrics = self.assert_report_matches_files(thick)
        offered_report = [s.value for s in
                          metrics['prealloc_placement_offered_bytes']]
        self.assertEqual(1, len(offered_report), metrics)
        self.assertLess(offered_report[0], 2 * GiB)

    def assert_refused(self, server, action, source, dest, state, path,
                       count):
        """The ``count``-th move of ``server`` (``action``) was refused by
        the scheduler: see the class's docstring.
        """
        deadline = time.time() + CONF.compute.build_timeout
        while True:
            migrations = self.os_admin.migrations_client.list_migrations(
                instance_uuid=server['id'])['migrations']
            done = [m for m in migrations
                    if m['status'] in ('error', 'failed', 'finished',
                                       'confirmed', 'completed')]
            if len(done) >= count or time.time() > deadline:
                break
            time.sleep(2)
        self.assertEqual(['error'] * count,
                         [m['status'] for m in migrations], migrations)
        waiters.wait_for_server_status(self.admin_servers_client,
                                       server['id'], 'ACTIVE')
        view = self.admin_view(server['id'])
        self.assertEqual(source, view['OS-EXT-SRV-ATTR:host'])
        self.assertIsNone(view['OS-EXT-STS:task_state'])
        self.assertEqual(state, self.disk_state(view))
        self.assertFalse(compute_host.ComputeHost(dest).exists(path))
        actions = [a for a in self.admin_servers_client.list_instance_actions(
            server['id'])['instanceActions'] if a['action'] == action]
        events = self.admin_servers_client.show_instance_action(
            server['id'], actions[0]['request_id'])['instanceAction'][
                'events']
        conductor = [e for e in events
                     if e['event'] == 'conductor_migrate_server']
        self.assertEqual(['Error'], [e['result'] for e in conductor],
                         events)
        self.assertIn('No valid host', conductor[0]['details'] or '',
                      events)
        self.assertFalse([e for e in events if e['host'] == dest], events)
