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

Why the plugin's image classes are put in nova's place here, not only its
driver (LibvirtQcowEvacuateTest): nova's _Qcow2Test replaces
``nova.virt.libvirt.imagebackend.Qcow2.create_image`` with a fake that only
touches the disk file, so that no image is fetched (nova's GlanceFixture
serves bytes that nova's own fetch_to_raw deep inspection refuses). With
only the driver substituted, that patch lands on nova's class, while the
plugin's Qcow2 overrides create_image (prealloc_backend/adapter/backend.py
Qcow2.create_image: it makes its own overlays, and calls nova's method, the
fake, only for an existing disk or in mode none). So in mode space the
plugin's create_image runs for real on compute0's first build, fetches the
fixture's image and fails with "Image ... is unacceptable: Image not in a
supported format" (BuildAbortException, the server in ERROR): measured,
all Qcow2 tests in mode space at this commit, and in modes none and space
at 9920a6f (before mode none delegated to nova). The plugin is not wrong
there: given a real image it makes the disk (tests/functional/
test_evacuate.py); the fake simply never reaches its code. Put in place
before nova's setUp, the fake lands on the plugin's Qcow2, as it would if
the plugin's class were nova's. LibvirtFlatEvacuateTest is unaffected either
way: the plugin's Flat does not override create_image. The "timed out
waiting for the migration" once reported here was not reproduced (either
substitution, this commit and 9920a6f): where the builds succeed, each
evacuation to compute1 failed at plug_vifs, as nova's test expects, about
0.6 s after it started (logs of a run at this commit, mode none, driver
only), well inside the 5 s (10 x 0.5 s) of nova's
_wait_for_migration_status.
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
