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
"""nova's libvirt cold migration, resize and evacuate functional tests with
the plugin's driver.

nova 34 has no libvirt functional module named for resize: nova/tests/
functional/libvirt/test_migration_addr.py is the one that cold-migrates,
resizes and evacuates a server between two libvirt computes (checking the
migration's destination address). nova's ServersTestBase mocks the image
backend and _create_image here, and the test mocks
migrate_disk_and_power_off.
"""

from nova.tests.functional.libvirt import test_migration_addr as nova_tests

from tests.conformance import base

# (nova class, test, modes, why the plugin differs on purpose)
EXCLUDED = [
]

base.conformance_cases(
    globals(), [nova_tests.LibvirtMigrationAddrTest], excluded=EXCLUDED,
    substitute_driver=True, starts_computes=True)
