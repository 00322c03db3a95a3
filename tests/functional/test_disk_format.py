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

"""A raw disk whose guest wrote a qcow2 header (nova's CVE-2026-24708
and CVE-2024-32498 class; doc/source/admin/security.rst).

The guest is simulated by writing a real qcow2 header (``qemu-img create
-f qcow2``) naming a host file as its backing file, or as its data-file,
into the first bytes of the server's raw disk while the server exists;
the header claims a 4 GiB disk, larger than any flavor here. nova's
disk.info record of the disk is left as nova wrote it ('present'),
removed ('absent'), or stripped of the disk's entry ('silent'). Then the
server is resized on its host, or moved from a raw host to a qcow2 host
and back, or cold migrated between raw hosts. Every time: the disk is
handled in its recorded format (the guest XML, the file), the guest sees
exactly what it wrote (its header included) grown to the flavor, the host
file's content never appears in the disk and the host file is unchanged.
"""

import json
import os
import subprocess

from oslo_utils import units
import testscenarios

from tests import fixtures as pb_fixtures
from tests.functional import base
from tests.functional import multihost

load_tests = testscenarios.load_tests_apply_scenarios

# What the host file holds: must never reach a guest's disk.
SECRET = b'HOST-FILE-NOT-FOR-GUESTS-' * 4096
# The size the guest's header claims: more than any flavor here, so that
# code believing the header would not grow the disk.
HEADER_SIZE = 4 * units.Gi
GUEST_WRITE = (512 * units.Mi, units.Mi, 0x5a)

DISK_INFO = [('present', {'disk_info': 'present'}),
             ('absent', {'disk_info': 'absent'}),
             ('silent', {'disk_info': 'silent'})]
HEADERS = [('backing', {'header': 'backing'}),
           ('data_file', {'header': 'data_file'})]


class _GuestHeaderMixin:
    """Write the guest's header, set disk.info, check the outcome."""

    disk_info = 'present'
    header = 'backing'

    def plant_header(self, disk):
        """The guest's header in ``disk``, naming a host file; then the
        host file's content. Returns a raw copy of what the guest sees.
        """
        self.host_file = os.path.join(self.work_dir, 'host-file')
        if self.header == 'backing':
            with open(self.host_file, 'wb') as f:
                f.write(SECRET)
            pb_fixtures.write_guest_qcow2_header(
                disk, self.work_dir, HEADER_SIZE, backing=self.host_file)
        else:
            pb_fixtures.write_guest_qcow2_header(
                disk, self.work_dir, HEADER_SIZE, data_file=self.host_file)
            with open(self.host_file, 'wb') as f:
                f.write(SECRET)
        self.guest_write(disk, 'raw', *GUEST_WRITE)
        # What the guest sees now: its raw disk, byte for byte.
        seen = os.path.join(self.work_dir, 'guest-view.raw')
        subprocess.run(['cp', '--sparse=always', disk, seen], check=True)
        return seen

    def set_disk_info(self, disk):
        path = os.path.join(os.path.dirname(disk), 'disk.info')
        with open(path) as f:
            record = json.load(f)
        self.assertEqual('raw', record.get(disk))
        if self.disk_info == 'absent':
            os.unlink(path)
        elif self.disk_info == 'silent':
            del record[disk]
            record[disk + '.other'] = 'raw'
            with open(path, 'w') as f:
                json.dump(record, f)

    def recorded(self, disk):
        with open(os.path.join(os.path.dirname(disk), 'disk.info')) as f:
            return json.load(f).get(disk)

    def assertGuestSees(self, disk, fmt, seen, size):
        """The guest's view of ``disk`` (in ``fmt``, the recorded format)
        is what it saw before, zeros up to ``size``; the host file stayed
        out of it and unchanged.
        """
        info = json.loads(subprocess.run(
            ['qemu-img', 'info', '--output=json', '-f', fmt, disk],
            check=True, capture_output=True, text=True).stdout)
        self.assertEqual(size, info['virtual-size'], info)
        self.assertNotIn('backing-filename', info)
        self.assertNotIn('data-file',
                         info.get('format-specific', {}).get('data', {}))
        proc = subprocess.run(['qemu-img', 'compare', '-f', fmt, '-F', 'raw',
                               disk, seen], capture_output=True, text=True)
        self.assertEqual(0, proc.returncode, proc.stdout + proc.stderr)
        view = os.path.join(self.work_dir, 'view-after.raw')
        subprocess.run(['qemu-img', 'convert', '-f', fmt, '-O', 'raw', disk,
                        view], check=True, capture_output=True)
        self.assertFalse(pb_fixtures.contains(view, SECRET[:100]))
        os.unlink(view)
        self.assertFalse(pb_fixtures.contains(disk, SECRET[:100]))
        with open(self.host_file, 'rb') as f:
            self.assertEqual(SECRET, f.read())

    def assertXMLFormat(self, server, disk, fmt):
        xml = self.guest_xml(server)
        self.assertGuestDisk(xml, disk, fmt)


class TestResizeOnItsHost(_GuestHeaderMixin, base.ServersTestBase):
    """A raw host; resize to a larger flavor on the same host, confirm."""

    scenarios = testscenarios.multiply_scenarios(DISK_INFO, HEADERS)

    def setUp(self):
        super().setUp()
        self.flags(allow_resize_to_same_host=True)

    def test_resize(self):
        self.start_host('raw', preallocate_images='none', mode='metadata')
        image_id, _image_path = self.upload_image('raw')
        small = self.create_flavor(disk=1)
        large = self.create_flavor(disk=2)
        server = self.boot(image_id, small)
        disk = self.disk(server)
        seen = self.plant_header(disk)
        self.set_disk_info(disk)
        server = self._resize_server(server, large)
        self.assertXMLFormat(server, disk, 'raw')
        self.assertEqual('raw', self.recorded(disk))
        self.assertGuestSees(disk, 'raw', seen, 2 * units.Gi)
        server = self._confirm_resize(server)
        self.assertEqual('ACTIVE', server['status'])
        self.assertGuestSees(disk, 'raw', seen, 2 * units.Gi)


class TestMoves(_GuestHeaderMixin, multihost.MultiHostTestBase):
    """NON-SHARED instance directories, rsync --sparse."""

    scenarios = testscenarios.multiply_scenarios(DISK_INFO, HEADERS)

    def _boot(self, host):
        image_id, _image_path = self.upload_image('raw')
        self.small = self.create_flavor(disk=1)
        self.large = self.create_flavor(disk=2)
        server = self._create_server(image_uuid=image_id,
                                     flavor_id=self.small, networks='none',
                                     host=host)
        disk = self.host_disk(host, server)
        seen = self.plant_header(disk)
        self.set_disk_info(disk)
        return server, seen

    def test_raw_host_to_qcow2_host_and_back(self):
        self.add_host('raw', 'raw', 'metadata')
        self.add_host('qcow2', 'qcow2', 'metadata')
        server, seen = self._boot('raw')
        # Resized on the way (the only other host): grown from 1 to 2 GiB
        # while still raw, then converted to qcow2 by finish_migration.
        self.api.post_server_action(
            server['id'], {'resize': {'flavorRef': self.large}})
        server = self._wait_for_state_change(server, 'VERIFY_RESIZE')
        self.assertEqual('qcow2', self.server_host(server))
        disk = self.host_disk('qcow2', server)
        self.assertXMLFormat(server, disk, 'qcow2')
        self.assertEqual('qcow2', self.recorded(disk))
        self.assertGuestSees(disk, 'qcow2', seen, 2 * units.Gi)
        server = self._confirm_resize(server)
        self.assertNothingLeft(server, 'raw')
        # And back: the converted disk stays qcow2 on the raw host.
        server = self._migrate_server(server, host='raw')
        disk = self.host_disk('raw', server)
        self.assertXMLFormat(server, disk, 'qcow2')
        self.assertEqual('qcow2', self.recorded(disk))
        self.assertGuestSees(disk, 'qcow2', seen, 2 * units.Gi)
        server = self._confirm_resize(server)
        self.assertEqual('ACTIVE', server['status'])

    def test_cold_migrate_between_raw_hosts(self):
        self.add_host('src', 'raw', 'metadata')
        self.add_host('dst', 'raw', 'space')
        server, seen = self._boot('src')
        server = self._migrate_server(server, host='dst')
        disk = self.host_disk('dst', server)
        self.assertXMLFormat(server, disk, 'raw')
        self.assertEqual('raw', self.recorded(disk))
        self.assertGuestSees(disk, 'raw', seen, units.Gi)
        server = self._confirm_resize(server)
        self.assertEqual('ACTIVE', server['status'])
        self.assertNothingLeft(server, 'src')
