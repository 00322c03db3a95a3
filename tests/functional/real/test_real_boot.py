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

"""Boot real guests from the plugin's disks, one per mode and format, and
check what libvirt and QEMU see; then delete them and check nothing is left.
"""

from tests.functional.real import base

GIB = 1024 ** 3


class _BootPerMode:
    """Boots one server per mode on one compute, then checks each."""

    # (flavor's prealloc:mode, the mode it means); None: the host's mode.
    MODES = ()

    def test_boot_per_mode(self):
        image = self.image(self.IMAGES_TYPE)
        servers = []
        # Boot them all first: the guests come up while the next spawns.
        for flavor_mode, mode in self.MODES:
            flavor = self.flavor(mode=flavor_mode)
            servers.append((mode, self.boot(flavor, image)))
        for mode, server in servers:
            self.check_hypervisor_view(server, self.IMAGES_TYPE, mode, GIB)
        for _mode, server in servers:
            self.delete(server)
            self.assert_no_leftovers(server)


class TestBootQcow2(_BootPerMode, base.RealHypervisorTestCase):
    """qcow2 overlays; the host has nova's one-line setup
    (preallocate_images = space), flavors override it.
    """

    IMAGES_TYPE = 'qcow2'
    PREALLOCATE_IMAGES = 'space'
    MODES = ((None, 'space'), ('none', 'none'), ('metadata', 'metadata'),
             ('full', 'full'))


class TestBootRaw(_BootPerMode, base.RealHypervisorTestCase):
    """Raw disks; the host mode is none, flavors ask for space and full."""

    IMAGES_TYPE = 'raw'
    PREALLOCATE_IMAGES = 'none'
    MODES = ((None, 'none'), ('space', 'space'), ('full', 'full'))
