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
"""nova's libvirt evacuate functional tests with the plugin's driver.

nova/tests/functional/libvirt/test_evacuate.py: a server of each kind
(local root disk, boot from volume with and without an ephemeral or swap
disk) is built on compute0, compute0 is forced down and the server is
evacuated to compute1, where plugging the VIFs fails; the test checks which
instance directories and disks are left on each side, with shared and
non-shared instance directories.

Left out: LibvirtRbdEvacuateTest and LibvirtLVMEvacuateTest (the plugin
keeps nova's Rbd and Lvm classes).
"""

from nova.tests.functional.libvirt import test_evacuate as nova_tests

from tests.conformance import base

# (nova class, test, modes, why the plugin differs on purpose)
EXCLUDED = [
]

base.conformance_cases(
    globals(),
    [nova_tests.LibvirtFlatEvacuateTest, nova_tests.LibvirtQcowEvacuateTest],
    excluded=EXCLUDED, substitute_driver=True, starts_computes=True)
