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
"""nova's libvirt device-bus migration functional tests with the plugin's
driver.

nova/tests/functional/libvirt/test_device_bus_migration.py: image
properties for machine type, disk and network models registered at boot
and kept across host changes, and nova-manage's machine type migration.
nova's ServersTestBase mocks the image backend and _create_image here.
"""

from nova.tests.functional.libvirt import test_device_bus_migration \
    as nova_tests

from tests.conformance import base

# (nova class, test, modes, why the plugin differs on purpose)
EXCLUDED = [
]
# (nova class, test, modes, why it is not run in these modes)
LEFT_OUT = [
    ('LibvirtDeviceBusMigration',
     'test_default_image_property_persists_across_host_flag_changes',
     ('space',),
     'the tier\'s longest test (about 35 s: it restarts the compute twice '
     'with other [libvirt] flags); the image backend is mocked in it, so '
     'the mode changes nothing it checks; run in mode none'),
]

base.conformance_cases(
    globals(), [nova_tests.LibvirtDeviceBusMigration], excluded=EXCLUDED,
    left_out=LEFT_OUT, substitute_driver=True, starts_computes=True)
