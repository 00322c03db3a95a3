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

"""Scenario 4: resize to a larger flavor on the same host, confirm or
revert; the grown disk is preallocated and the guest's data intact.
"""

import os

from oslo_utils import units

from tests import fixtures as pb_fixtures
from tests.functional import base

# Where the "guest" writes before the resize (inside the 1 GiB disk).
GUEST_WRITE = (512 * units.Mi, units.Mi, 0x5a)


class TestResize(base.ServersTestBase):

    def setUp(self):
        super().setUp()
        self.flags(allow_resize_to_same_host=True)

    def _boot_and_resize(self, fmt):
        self.start_host(fmt, preallocate_images='space')
        image_id, image_path = self.upload_image('raw')
        small = self.create_flavor(disk=1)
        large = self.create_flavor(disk=2)
        server = self.boot(image_id, small)
        disk = self.disk(server)
        self.guest_write(disk, fmt, *GUEST_WRITE)
        before = self._figures(disk, fmt, 'space', units.Gi, image_id)
        server = self._resize_server(server, large)
        self.assertTrue(os.path.isdir(self.instance_dir(server) + '_resize'))
        self._check_grown_tail(disk, fmt, units.Gi, 2 * units.Gi)
        # The whole disk, not only the tail: nova copied the disk
        # ('cp', sparse) into the new instance directory before growing it.
        after = self._figures(disk, fmt, 'space', 2 * units.Gi, image_id)
        self.assertContentEqual(disk, self.reference(
            image_path, 2 * units.Gi, [GUEST_WRITE]))
        self._check_xml(server, disk, fmt, 2 * units.Gi)
        return server, image_id, image_path, before, after

    def _check_grown_tail(self, disk, fmt, old_size, new_size):
        """The area added by the resize is preallocated."""
        allocated = pb_fixtures.allocated(disk)
        self.assertGreaterEqual(allocated, new_size - old_size)
        if fmt == 'qcow2':
            tail = [r for r in base.qemu_img_map(disk)
                    if r['start'] + r['length'] > old_size]
            self.assertTrue(tail)
            for mapped in tail:
                # Clusters of the overlay itself, with host clusters.
                self.assertEqual(0, mapped['depth'], mapped)
                self.assertIn('offset', mapped)

    def _figures(self, disk, fmt, mode, size, image_id):
        if fmt == 'qcow2':
            return self.assertQcow2Overlay(disk, mode, size,
                                           self.image_base(image_id))
        return self.assertRaw(disk, mode, size)

    def _check_xml(self, server, disk, fmt, size):
        xml = self.guest_xml(server)
        self.validate_xml(xml)
        cache = (base.expected_metadata_cache(size, 128 * units.Ki)
                 if fmt == 'qcow2' else None)
        self.assertGuestDisk(xml, disk, fmt, cache, 'native')

    def _confirm(self, fmt):
        server, image_id, image_path, _before, after = (
            self._boot_and_resize(fmt))
        server = self._confirm_resize(server)
        self.assertFalse(os.path.exists(self.instance_dir(server) +
                                        '_resize'))
        disk = self.disk(server)
        confirmed = self._figures(disk, fmt, 'space', 2 * units.Gi,
                                  image_id)
        self.assertEqual(after['allocated'], confirmed['allocated'])
        self.assertContentEqual(disk, self.reference(
            image_path, 2 * units.Gi, [GUEST_WRITE]))
        self.assertEqual([], base.journal_files(self.instance_dir(server)))

    def _revert(self, fmt):
        server, image_id, image_path, before, _after = (
            self._boot_and_resize(fmt))
        server = self._revert_resize(server)
        self.assertFalse(os.path.exists(self.instance_dir(server) +
                                        '_resize'))
        disk = self.disk(server)
        reverted = self._figures(disk, fmt, 'space', units.Gi, image_id)
        self.assertEqual(before['allocated'], reverted['allocated'])
        self.assertContentEqual(disk, self.reference(
            image_path, units.Gi, [GUEST_WRITE]))
        self._check_xml(server, disk, fmt, units.Gi)
        self.assertEqual([], base.journal_files(self.instance_dir(server)))

    def test_qcow2_confirm(self):
        self._confirm('qcow2')

    def test_qcow2_revert(self):
        self._revert('qcow2')

    def test_raw_confirm(self):
        self._confirm('raw')

    def test_raw_revert(self):
        self._revert('raw')
