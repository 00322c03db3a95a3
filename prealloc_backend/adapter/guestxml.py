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

"""Guest XML: the qcow2 metadata cache element nova's config does not know.

nova's LibvirtConfigGuestDisk writes only attributes of ``<driver>``;
libvirt (7.0+) also accepts, for the top image of a qcow2 disk::

    <driver name='qemu' type='qcow2'>
      <metadata_cache><max_size unit='bytes'>N</max_size></metadata_cache>
    </driver>

and turns it into the qcow2 node's ``cache-size`` on the QEMU command line.
"""

from lxml import etree
from nova.virt.libvirt import config as vconfig


class MetadataCacheDisk(vconfig.LibvirtConfigGuestDisk):
    """A guest disk whose ``<driver>`` carries ``<metadata_cache>``."""

    metadata_cache_max_size = None

    def format_dom(self):
        dev = super().format_dom()
        if self.metadata_cache_max_size:
            driver = dev.find('driver')
            if driver is None:
                driver = etree.SubElement(dev, 'driver')
            cache = etree.SubElement(driver, 'metadata_cache')
            max_size = etree.SubElement(cache, 'max_size', unit='bytes')
            max_size.text = str(self.metadata_cache_max_size)
        return dev


def with_metadata_cache(disk, max_size):
    """Make ``disk`` (a LibvirtConfigGuestDisk) emit a metadata cache."""
    disk.__class__ = MetadataCacheDisk
    disk.metadata_cache_max_size = int(max_size)
    return disk
