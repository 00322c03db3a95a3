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
"""nova's regression test of bug 2079850 with the plugin in place.

nova/tests/functional/regressions/test_bug_2079850.py: the ephemeral base
file nova generates for a qcow2 disk (through Image.cache and
LibvirtDriver._create_ephemeral) must pass oslo.utils' format inspector.
Both tests skip unless mkfs.vfat (Debian dosfstools) is installed.
"""

from nova.tests.functional.regressions import test_bug_2079850 as nova_tests

from tests.conformance import base

# (nova class, test, modes, why the plugin differs on purpose)
EXCLUDED = [
]

base.conformance_cases(
    globals(), [nova_tests.TestBugBackingFilePartitionTables],
    excluded=EXCLUDED, substitute_driver=True)
