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
"""nova's libvirt rescue functional tests with the plugin's driver.

nova/tests/functional/libvirt/test_rescue_deleted_base.py (nova 34 has no
other libvirt rescue functional test): stable-mode rescue of a server whose
original image was deleted, with a local root disk and boot from volume.
nova's ServersTestBase mocks the image backend and _create_image here.
"""

from nova.tests.functional.libvirt import test_rescue_deleted_base \
    as nova_tests

from tests.conformance import base

# (nova class, test, modes, why the plugin differs on purpose)
EXCLUDED = [
]

base.conformance_cases(
    globals(), [nova_tests.RescueServerTestWithDeletedBaseImage],
    excluded=EXCLUDED, substitute_driver=True, starts_computes=True)
