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

"""prealloc_backend/adapter/guestxml.py: the <metadata_cache> element and
the discard_no_unref attribute in the XML nova's own LibvirtConfigGuestDisk
writes.
"""

from lxml import etree
from nova.virt.libvirt import config as vconfig

from prealloc_backend.adapter import guestxml
from tests import base


class MetadataCacheTestCase(base.TestCase):

    def disk(self):
        disk = vconfig.LibvirtConfigGuestDisk()
        disk.source_type = 'file'
        disk.source_path = '/instances/uuid/disk'
        disk.driver_name = 'qemu'
        disk.driver_format = 'qcow2'
        disk.driver_discard = 'ignore'
        disk.target_dev = 'vda'
        disk.target_bus = 'virtio'
        return disk

    def test_element_under_driver(self):
        disk = guestxml.with_metadata_cache(self.disk(), 134742016)
        dev = etree.fromstring(disk.to_xml())
        driver = dev.find('driver')
        # nova's attributes are kept.
        self.assertEqual(('qemu', 'qcow2', 'ignore'),
                         (driver.get('name'), driver.get('type'),
                          driver.get('discard')))
        [max_size] = driver.findall('metadata_cache/max_size')
        self.assertEqual('bytes', max_size.get('unit'))
        self.assertEqual('134742016', max_size.text)
        self.assertIsInstance(disk, vconfig.LibvirtConfigGuestDisk)

    def test_no_size_no_element(self):
        disk = guestxml.with_metadata_cache(self.disk(), 0)
        self.assertIsNone(etree.fromstring(disk.to_xml()).find(
            'driver/metadata_cache'))

    def test_driver_made_when_nova_wrote_none(self):
        disk = vconfig.LibvirtConfigGuestDisk()
        disk.source_type = 'file'
        disk.source_path = '/instances/uuid/disk'
        disk.target_dev = 'vda'
        disk.target_bus = 'virtio'
        self.assertIsNone(etree.fromstring(disk.to_xml()).find('driver'))
        guestxml.with_metadata_cache(disk, 4096)
        self.assertEqual('4096', etree.fromstring(disk.to_xml()).findtext(
            'driver/metadata_cache/max_size'))


class DiscardNoUnrefTestCase(base.TestCase):

    disk = MetadataCacheTestCase.disk

    def test_attribute_beside_novas(self):
        disk = self.disk()
        disk.driver_discard = 'unmap'
        guestxml.with_discard_no_unref(disk)
        driver = etree.fromstring(disk.to_xml()).find('driver')
        self.assertEqual(('qemu', 'qcow2', 'unmap', 'on'),
                         (driver.get('name'), driver.get('type'),
                          driver.get('discard'),
                          driver.get('discard_no_unref')))
        self.assertIsNone(driver.find('metadata_cache'))

    def test_with_metadata_cache_either_order(self):
        def cache(disk):
            return guestxml.with_metadata_cache(disk, 65536)

        for first, second in ((guestxml.with_discard_no_unref, cache),
                              (cache, guestxml.with_discard_no_unref)):
            disk = second(first(self.disk()))
            driver = etree.fromstring(disk.to_xml()).find('driver')
            self.assertEqual('on', driver.get('discard_no_unref'))
            self.assertEqual('65536', driver.findtext(
                'metadata_cache/max_size'))

    def test_not_written_unless_asked(self):
        disk = guestxml.with_metadata_cache(self.disk(), 65536)
        driver = etree.fromstring(disk.to_xml()).find('driver')
        self.assertIsNone(driver.get('discard_no_unref'))
