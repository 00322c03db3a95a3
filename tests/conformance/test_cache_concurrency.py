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
"""nova's test_driver.py CacheConcurrencyTestCase with the plugin's Backend.

The test builds ``imagebackend.Backend(False)`` (the plugin's, see
base.PluginInPlace) and checks that two cache() calls for the same base
file run one after the other and for different files concurrently. The
rest of nova's test_driver.py tests nova's driver methods, which the plugin
inherits unchanged (its driver overrides __init__, _create_image, spawn and
_disk_raw_to_qcow2): those are left out, for the tier's time.
"""

from nova.tests.unit.virt.libvirt import test_driver as nova_tests

from tests.conformance import base

# (nova class, test, modes, why the plugin differs on purpose)
EXCLUDED = [
]

base.conformance_cases(
    globals(), [nova_tests.CacheConcurrencyTestCase], excluded=EXCLUDED)
