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

"""A flavor's ``prealloc:mode`` extra spec overrides the host's mode: at
boot, and for the disk grown by a resize to a flavor with another mode.

The extra specs are set through nova's API (at the flavors API's default
microversion; the API-side validation has its own tests).
"""

import os

from oslo_utils import units

from prealloc_backend.planner import modes
from tests import fixtures as pb_fixtures
from tests.functional import base


class TestFlavorModeAtBoot(base.ServersTestBase):

    def _test(self, fmt, host_mode, flavor_mode):
        self.start_host(fmt, preallocate_images=host_mode)
        image_id, image_path = self.upload_image('raw')
        flavor = self.create_flavor(
            disk=1, swap=64, extra_specs={modes.FLAVOR_MODE_KEY: flavor_mode})
        server = self.boot(image_id, flavor)
        # Every disk of the server follows the flavor, not the host.
        return self.assertServerDisks(server, fmt, flavor_mode, image_id,
                                      image_path, swap_mb=64)

    def test_full_on_space_host_qcow2(self):
        self._test('qcow2', 'space', 'full')

    def test_metadata_on_space_host_qcow2(self):
        self._test('qcow2', 'space', 'metadata')

    def test_full_on_space_host_raw(self):
        self._test('raw', 'space', 'full')

    def test_none_on_space_host_raw(self):
        self._test('raw', 'space', 'none')


class TestFlavorModeAtResize(base.ServersTestBase):
    """Resize from a flavor following the host (none) to a larger flavor
    with ``prealloc:mode = full``: the new flavor's mode applies to the disk
    grown by the resize.
    """

    def setUp(self):
        super().setUp()
        self.flags(allow_resize_to_same_host=True)

    def _boot_and_resize(self, fmt):
        self.start_host(fmt, preallocate_images='none')
        image_id, image_path = self.upload_image('raw')
        server = self.boot(image_id, self.create_flavor(disk=1))
        disk = self.disk(server)
        thin = pb_fixtures.allocated(disk)
        self.assertLess(thin, base.SLACK + base.IMAGE_SIZE)
        full = self.create_flavor(
            disk=2, extra_specs={modes.FLAVOR_MODE_KEY: 'full'})
        server = self._resize_server(server, full)
        self.assertContentEqual(disk, self.reference(image_path,
                                                     2 * units.Gi))
        xml = self.guest_xml(server)
        self.validate_xml(xml)
        return server, disk, thin, xml

    def test_qcow2(self):
        server, disk, thin, xml = self._boot_and_resize('qcow2')
        info = pb_fixtures.qemu_img_info(disk)
        self.assertEqual(2 * units.Gi, info['virtual-size'])
        # Mode none made stock nova's overlay (no extended_l2); growing it
        # for a full flavor rewrites it with the plugin's layout first
        # (qemu-img convert -B, preallocation=full), then grows it with
        # preallocation=full: the whole disk is mapped and written, and
        # the guest still reads the image (checked in _boot_and_resize).
        self.assertTrue(info['format-specific']['data']['extended-l2'])
        self.assertEqual(128 * units.Ki, info['cluster-size'])
        tail = [r for r in base.qemu_img_map(disk)
                if r['start'] + r['length'] > units.Gi]
        for mapped in tail:
            self.assertEqual(0, mapped['depth'], mapped)
            self.assertIn('offset', mapped)
        allocated = pb_fixtures.allocated(disk)
        self.assertGreaterEqual(allocated, 2 * units.Gi)
        self.assertLess(allocated, 2 * units.Gi + base.SLACK + thin)
        self.assertLess(pb_fixtures.hole_bytes(disk), base.SLACK)
        base.record_figures(self, disk, 'none->full', {
            'allocated_before': thin, 'allocated': allocated,
            'file_size': os.path.getsize(disk)})
        self.assertGuestDisk(xml, disk, 'qcow2',
                             base.expected_metadata_cache(2 * units.Gi,
                                                          128 * units.Ki),
                             'native')

    def test_raw(self):
        server, disk, thin, xml = self._boot_and_resize('raw')
        # raw: the whole grown disk is zero-filled (data kept, compared
        # above), not only the added GiB.
        figures = self.assertRaw(disk, 'full', 2 * units.Gi)
        figures['allocated_before'] = thin
        self.assertGuestDisk(xml, disk, 'raw', None, 'native')
