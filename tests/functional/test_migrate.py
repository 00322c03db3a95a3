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

"""Cold migration and resize between two plugin hosts.

Each test states its storage case: NON-SHARED (each host has its own
instance directory; nova copies the disks with the transport named) or
SHARED (one instance directory; nova's cp -r).
"""

import os

from oslo_utils import units

from tests import fixtures as pb_fixtures
from tests.functional import base
from tests.functional import multihost

# Where the "guest" writes before the move (inside the 1 GiB disk).
GUEST_WRITE = (512 * units.Mi, units.Mi, 0x5a)


class _MigrateMixin:

    def _boot(self, source, fmt='qcow2'):
        image_id, image_path = self.upload_image('raw')
        self.small = self.create_flavor(disk=1)
        self.large = self.create_flavor(disk=2)
        server = self._create_server(image_uuid=image_id,
                                     flavor_id=self.small, networks='none',
                                     host=source)
        disk = self.host_disk(source, server)
        self.guest_write(disk, fmt, *GUEST_WRITE)
        self.image_id, self.image_path = image_id, image_path
        return server

    def assertDisk(self, host, server, fmt, mode, size):
        """The server's root disk on ``host`` follows ``mode`` and shows the
        guest the image plus its write.
        """
        disk = self.host_disk(host, server)
        if fmt == 'qcow2':
            figures = self.assertQcow2Overlay(
                disk, mode, size, self.host_base(host, self.image_id))
        else:
            figures = self.assertRaw(disk, mode, size)
        self.assertContentEqual(disk, self.reference(
            self.image_path, size, [GUEST_WRITE]))
        self.assertEqual([], base.journal_files(self.host_dir(host, server)))
        return figures

    def _move(self, server, dest, resize):
        if resize:
            self.api.post_server_action(
                server['id'], {'resize': {'flavorRef': self.large}})
            return self._wait_for_state_change(server, 'VERIFY_RESIZE')
        return self._migrate_server(server, host=dest)


class TestColdMigrate(_MigrateMixin, multihost.MultiHostTestBase):
    """NON-SHARED instance directories, rsync --sparse."""

    def _test(self, mode, resize=False, revert=False, fmt='qcow2'):
        self.add_host('src', fmt, mode)
        self.add_host('dst', fmt, mode)
        server = self._boot('src', fmt)
        before = self.assertDisk('src', server, fmt, mode, units.Gi)
        size = 2 * units.Gi if resize else units.Gi
        server = self._move(server, 'dst', resize)
        self.assertEqual('dst', self.server_host(server))
        self.assertDisk('dst', server, fmt, mode, size)
        if revert:
            server = self._revert_resize(server)
            self.assertEqual('src', self.server_host(server))
            after = self.assertDisk('src', server, fmt, mode, units.Gi)
            self.assertEqual(before['allocated'], after['allocated'])
            self.assertNothingLeft(server, 'dst')
        else:
            server = self._confirm_resize(server)
            self.assertDisk('dst', server, fmt, mode, size)
            self.assertNothingLeft(server, 'src')

    def test_space(self):
        self._test('space')
