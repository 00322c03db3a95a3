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

"""The Capacity check and the figures of ``prealloc-backend report``, on
real disks made with qemu-img and fallocate(2) in a temporary
instances_path, read by a real child process (as another uid when the
tests run as root).

Replaced, because the unit tier runs no libvirtd: the read-only libvirt
connection (base.FakeReadOnlyConnection, whose domains answer nova's own
metadata XML, made by nova's config classes). The real tier's libvirtd
and the cloud's run the real connection.
"""

import json
import os
import subprocess
import time

import fixtures
from oslo_utils import units

from prealloc_backend.checks import capacity
from prealloc_backend.checks import owner
from prealloc_backend.checks import result
from prealloc_backend.planner import capacity as planning
from tests import base
from tests import fixtures as pb_fixtures

Code = result.Code
GiB = units.Gi
MiB = units.Mi


def filefrag_unwritten(path):
    size = os.stat(path).st_size
    return sum(max(0, min((start + length) * 4096, size) - start * 4096)
               for start, length, unwritten in pb_fixtures.extents(path)
               if unwritten)


class CapacityCase(base.CapacityHostCase):

    def conf(self, **prealloc):
        sections = self.nova_conf(images_type='qcow2', **prealloc)
        return self.check_host(sections).conf

    def guests(self, domains):
        self.connection = base.FakeReadOnlyConnection(domains)
        real = capacity.read_guests
        self.useFixture(fixtures.MockPatchObject(
            capacity, 'read_guests',
            side_effect=lambda uri, connect=None: real(uri,
                                                       self.connection)))


class TestFigures(CapacityCase):

    def test_figures_match_the_files(self):
        space, space_path = self.disk(mode='space')
        meta, meta_path = self.disk(mode='metadata')
        raw, raw_path = self.disk(mode='full', fmt='raw', size=16 * MiB)
        # nova's own overlay (64K clusters, no extended L2) on this space
        # host: not at its policy.
        stock, stock_path = self.disk(mode='none')
        os.unlink(stock_path)
        subprocess.run(['qemu-img', 'create', '-f', 'qcow2', '-b', self.base,
                        '-F', 'raw', stock_path, str(64 * MiB)], check=True,
                       capture_output=True)
        conn = base.FakeReadOnlyConnection([
            base.FakeDomain(space, state=capacity.VIR_DOMAIN_PAUSED,
                            reason=capacity.VIR_DOMAIN_PAUSED_IOERROR,
                            flavor=(1, 0, 0, {})),
            base.FakeDomain(meta, flavor=(1, 0, 0,
                                          {'prealloc:mode': 'metadata'})),
            # paused, but by the user (VIR_DOMAIN_PAUSED_USER)
            base.FakeDomain(stock, state=capacity.VIR_DOMAIN_PAUSED,
                            reason=1, flavor=(1, 0, 0, {})),
        ])
        conf = self.conf()
        found = capacity.measure(conf, connect=conn)
        self.assertEqual(['qemu:///system'], conn.uris)
        self.assertTrue(conn.closed)
        self.assertIsNone(found.libvirt_error)
        self.assertEqual([], found.scan.problems)

        disks = {(d.facts.instance, d.facts.name): d for d in found.disks}
        paths = {(space, 'disk'): space_path, (meta, 'disk'): meta_path,
                 (raw, 'disk'): raw_path, (stock, 'disk'): stock_path}
        self.assertEqual(sorted(paths), sorted(disks))
        for key, path in paths.items():
            disk = disks[key]
            info = pb_fixtures.qemu_img_info(path)
            self.assertEqual(info['virtual-size'], disk.facts.virtual_size)
            self.assertEqual(os.stat(path).st_blocks * 512,
                             disk.facts.allocated, path)
            self.assertEqual(info['format'], disk.facts.fmt)
            self.assertEqual(filefrag_unwritten(path), disk.facts.unwritten,
                             path)
        self.assertEqual('space', disks[(space, 'disk')].mode.value)
        self.assertEqual('metadata', disks[(meta, 'disk')].mode.value)
        self.assertEqual('space', disks[(raw, 'disk')].mode.value)
        self.assertEqual([True, True, True, False],
                         [disks[(u, 'disk')].at_policy
                          for u in (space, meta, raw, stock)])
        self.assertEqual([True, False, False, False],
                         [disks[(u, 'disk')].paused_io_error
                          for u in (space, meta, raw, stock)])
        self.assertEqual([space], found.paused_guests)
        # Host figures.
        vfs = os.statvfs(self.instances)
        self.assertEqual(vfs.f_blocks * vfs.f_frsize, found.scan.fs.size)
        self.assertEqual(pb_fixtures.allocated(self.base),
                         found.scan.base_bytes)
        self.assertEqual(sum(filefrag_unwritten(p) for p in paths.values()),
                         found.unwritten)
        # What placement is told: this host reserves (space), ratio 1.0;
        # the three guests' flavors count 1 GiB each; the raw disk has no
        # guest: it counts whole.
        self.assertTrue(found.reserving)
        self.assertEqual(1.0, found.decision.inventory['allocation_ratio'])
        inv = found.decision.inventory
        self.assertEqual(
            (inv['total'] - inv['reserved']) * GiB - 3 * GiB, found.offered)
        self.assertEqual((found.scan.fs.size - found.room.reserved) // GiB,
                         inv['total'] - inv['reserved'])
        self.assertGreaterEqual(found.room.promised, 16 * MiB)

    def test_scan_runs_as_the_owner_of_instances_path(self):
        if os.geteuid() != 0:
            self.skipTest('another uid: root only')
        uuid, path = self.disk(mode='space')
        # root's own file, unreadable to others: the scan (as the nova
        # uid) cannot open it; as root it could.
        os.chmod(path, 0o600)
        found = capacity.measure(self.conf(),
                                 connect=base.FakeReadOnlyConnection([]))
        self.assertEqual(['%s/disk: Permission denied' % uuid],
                         found.scan.problems)
        # Counted by its stat alone (the header unread): its blocks still
        # count.
        disk, = found.scan.disks
        st = os.stat(path)
        self.assertEqual((st.st_blocks * 512, st.st_size, 'raw', None),
                         (disk.allocated, disk.virtual_size, disk.fmt,
                          disk.unwritten))

    def test_libvirt_unreachable_is_recorded(self):
        def refuse(uri):
            raise RuntimeError('Failed to connect socket')

        self.disk()
        found = capacity.measure(self.conf(), connect=refuse)
        self.assertIn('Failed to connect socket', found.libvirt_error)
        self.assertEqual({}, found.guests)
        # Without the guests' flavors placement's offer is not known.
        self.assertIsNone(found.offered)
        self.assertEqual(1, len(found.disks))

    def test_deadline_kills_the_scan(self):
        self.disk()

        def hang(fd, *args):
            time.sleep(60)

        self.useFixture(fixtures.MockPatchObject(capacity, '_scan_step',
                                                 hang))
        self.assertRaises(owner.StepTimedOut, capacity.measure, self.conf(),
                          deadline=1, connect=base.FakeReadOnlyConnection(
                              []))


class TestMetadata(base.TestCase):

    def test_nova_metadata(self):
        # As libvirt answers (no namespace: seen with libvirt 9.0 in the
        # cloud tier) and as nova writes it (nova:).
        for namespaced in (False, True):
            xml = base.FakeDomain('u', flavor=(20, 5, 512, {
                'prealloc:mode': 'full', 'hw:cpu_policy': 'shared'}),
                namespaced=namespaced).metadata(
                    capacity.VIR_DOMAIN_METADATA_ELEMENT, capacity.NOVA_NS, 0)
            self.assertEqual(namespaced, 'nova:flavor' in xml, xml)
            flavor, specs = capacity.nova_metadata(xml)
            self.assertEqual(planning.FlavorDisks.of_flavor(20, 5, 512),
                             flavor)
            self.assertEqual({'prealloc:mode': 'full',
                              'hw:cpu_policy': 'shared'}, specs)
        # Another namespace's <flavor> is not nova's.
        self.assertEqual((None, None), capacity.nova_metadata(
            '<instance xmlns:x="urn:x"><x:flavor><x:disk>1</x:disk>'
            '</x:flavor></instance>'))
        self.assertEqual((None, None), capacity.nova_metadata('<x/>'))
        self.assertEqual((None, None), capacity.nova_metadata('not xml'))

    def test_domain_gone_during_the_read(self):
        # A server deleted between the list and the domain's state: the
        # other guests are still read.
        class Gone(base.FakeDomain):
            def state(self):
                raise RuntimeError('Domain not found: no domain with '
                                   'matching uuid')

        found = capacity.read_guests(
            'qemu:///system', base.FakeReadOnlyConnection(
                [Gone('gone'), base.FakeDomain('here', state=3, reason=5)]))
        self.assertEqual(['here'], sorted(found))
        self.assertEqual((3, 5), (found['here'].state, found['here'].reason))

    def test_libvirt_uri_as_nova(self):
        self.flags(virt_type='kvm', group='libvirt')
        self.assertEqual('qemu:///system', capacity.libvirt_uri(base.CONF))
        self.flags(connection_uri='qemu+tcp://h/system', group='libvirt')
        self.assertEqual('qemu+tcp://h/system',
                         capacity.libvirt_uri(base.CONF))


class TestCheckRow(CapacityCase):

    def row(self, **prealloc):
        return capacity.check_capacity(self.check_host(
            self.nova_conf(images_type='qcow2', **prealloc)))

    def test_reserving_host(self):
        uuid, _path = self.disk()
        self.guests([base.FakeDomain(uuid, flavor=(1, 0, 0, {}))])
        res = self.row()
        self.assertEqual(Code.SUCCESS, res.code, res.details)
        self.assertIn('the host has the trait CUSTOM_PREALLOC_RESERVING',
                      res.details)
        facts = json.loads(json.dumps(res.facts))
        self.assertIsNone(facts['libvirt_error'])
        self.assertEqual(1, facts['disk_count'])
        self.assertEqual('space', facts['disks'][0]['mode'])
        self.assertEqual(uuid, facts['disks'][0]['instance_uuid'])
        self.assertTrue(facts['disks'][0]['at_policy'])
        self.assertEqual(1.0, facts['placement']['allocation_ratio'])
        self.assertEqual('CUSTOM_PREALLOC_RESERVING',
                         facts['placement']['trait'])
        for key in ('fs_size_bytes', 'fs_free_bytes',
                    'reserved_unwritten_bytes', 'base_images_bytes'):
            self.assertIsInstance(facts[key], int, key)

    def test_ratio_above_one_is_a_warning(self):
        self.guests([])
        sections = self.nova_conf(images_type='qcow2')
        sections['DEFAULT']['disk_allocation_ratio'] = '4.0'
        res = capacity.check_capacity(self.check_host(sections))
        self.assertEqual(Code.WARNING, res.code)
        self.assertIn('a DISK_GB allocation ratio of 4.0 would promise '
                      'space mode space refuses: it is reported as 1.0',
                      res.details)
        self.assertIn('disk_allocation_ratio = 1.0', res.fix)
        self.assertEqual(4.0, res.facts['placement']['ratio_overridden'])

    def test_reporting_off_on_a_reserving_host_is_a_warning(self):
        self.guests([])
        res = self.row(disk_inventory='nova')
        self.assertEqual(Code.WARNING, res.code)
        self.assertIn('disk_inventory = nova', res.details)

    def test_thin_host(self):
        self.guests([])
        res = self.row(mode='metadata')
        self.assertEqual(Code.SUCCESS, res.code)
        self.assertIn('trait:CUSTOM_PREALLOC_RESERVING=required',
                      res.details)
        self.assertIsNone(res.facts['placement']['trait'])

    def test_paused_guest_is_a_warning(self):
        uuid, _path = self.disk()
        self.guests([base.FakeDomain(
            uuid, state=capacity.VIR_DOMAIN_PAUSED,
            reason=capacity.VIR_DOMAIN_PAUSED_IOERROR,
            flavor=(1, 0, 0, {}))])
        res = self.row()
        self.assertEqual(Code.WARNING, res.code)
        self.assertIn('1 guest(s) paused on an I/O error (%s)' % uuid,
                      res.details)
        self.assertIn('virsh resume', res.fix)

    def test_missing_or_refused_instances_path(self):
        self.guests([])
        sections = self.nova_conf(images_type='qcow2')
        sections['DEFAULT']['instances_path'] = os.path.join(self.tmp, 'no')
        res = capacity.check_capacity(self.check_host(sections))
        self.assertEqual(Code.SUCCESS, res.code)
        self.assertIn('does not exist yet', res.details)
        link = os.path.join(self.tmp, 'link')
        os.symlink(self.instances, link)
        sections['DEFAULT']['instances_path'] = link
        res = capacity.check_capacity(self.check_host(sections))
        self.assertEqual(Code.FAILURE, res.code)
        self.assertIn('symlink', res.details)
