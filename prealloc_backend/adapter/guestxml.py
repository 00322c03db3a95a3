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

"""Guest XML: what nova's disk config does not know how to write.

nova's LibvirtConfigGuestDisk writes only the ``<driver>`` attributes it
knows; libvirt also accepts, for the top image of a qcow2 disk::

    <driver name='qemu' type='qcow2' discard='unmap' discard_no_unref='on'>
      <metadata_cache><max_size unit='bytes'>N</max_size></metadata_cache>
    </driver>

``<metadata_cache>`` (libvirt 7.0) becomes the qcow2 node's
``cache-size``; ``discard_no_unref`` (libvirt 9.5, QEMU 8.1) the qcow2
node's ``discard-no-unref``: the plugin writes it only where the host has
both (disk.hostcaps).

``GuestDisk`` is what the disk operation decided for a disk's XML
(operation.DiskOperation.guest_disk); ``apply`` writes it into nova's
LibvirtConfigGuestDisk.
"""

import dataclasses

from lxml import etree
from nova.virt.libvirt import config as vconfig


@dataclasses.dataclass(frozen=True)
class GuestDisk:
    """A disk's settings in the guest XML beyond nova's own: the driver's
    io mode (None: nova's), ``discard`` and ``discard_no_unref``, the
    ``<blockio>`` physical block size and the ``<metadata_cache>`` bytes
    (None: none).
    """
    driver_io: str | None = None
    discard: str | None = None
    discard_no_unref: bool = False
    physical_block_size: int | None = None
    metadata_cache_bytes: int | None = None


def apply(disk, guest):
    """nova's LibvirtConfigGuestDisk ``disk`` with the GuestDisk
    ``guest``'s settings (its driver_io is the image object's, which nova
    copies into ``disk`` itself).
    """
    disk.driver_discard = guest.discard
    if guest.discard_no_unref:
        disk = with_discard_no_unref(disk)
    if guest.physical_block_size:
        # <blockio>: a 512e disk whose physical block is a subcluster.
        disk.physical_block_size = str(guest.physical_block_size)
    if guest.metadata_cache_bytes:
        disk = with_metadata_cache(disk, guest.metadata_cache_bytes)
    return disk


class PreallocDisk(vconfig.LibvirtConfigGuestDisk):
    """A guest disk whose ``<driver>`` may carry ``<metadata_cache>`` and
    ``discard_no_unref``.
    """

    metadata_cache_max_size = None
    discard_no_unref = False

    def format_dom(self):
        dev = super().format_dom()
        if not (self.metadata_cache_max_size or self.discard_no_unref):
            return dev
        driver = dev.find('driver')
        if driver is None:
            driver = etree.SubElement(dev, 'driver')
        if self.discard_no_unref:
            driver.set('discard_no_unref', 'on')
        if self.metadata_cache_max_size:
            cache = etree.SubElement(driver, 'metadata_cache')
            max_size = etree.SubElement(cache, 'max_size', unit='bytes')
            max_size.text = str(self.metadata_cache_max_size)
        return dev


def _prealloc_disk(disk):
    if not isinstance(disk, PreallocDisk):
        disk.__class__ = PreallocDisk
    return disk


def with_metadata_cache(disk, max_size):
    """Make ``disk`` (a LibvirtConfigGuestDisk) emit a metadata cache."""
    disk = _prealloc_disk(disk)
    disk.metadata_cache_max_size = int(max_size)
    return disk


def with_discard_no_unref(disk):
    """Make ``disk`` emit ``discard_no_unref='on'``."""
    disk = _prealloc_disk(disk)
    disk.discard_no_unref = True
    return disk
