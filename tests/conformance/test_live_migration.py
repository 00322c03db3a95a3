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
"""nova's libvirt live-migration functional tests with the plugin's driver.

nova/tests/functional/libvirt/test_live_migration.py: queued live
migrations aborted, a compute's cleanup_host cancelling queued migrations,
and live migrations between hosts with different cpu_shared_set. nova's
ServersTestBase replaces the image backend (LibvirtImageBackendFixture) and
LibvirtDriver._create_image with mocks in these tests: what runs of the
plugin is its driver (start-up, option checks, spawn, pre/post live
migration).
"""

from nova.tests.functional.libvirt import test_live_migration as nova_tests

from tests.conformance import base

# (nova class, test, modes, why the plugin differs on purpose)
EXCLUDED = [
]

base.conformance_cases(
    globals(),
    [nova_tests.LiveMigrationQueuedAbortTestVmStatus,
     nova_tests.LiveMigrationQueuedAbortTestLeftoversRemoved,
     nova_tests.ManagerCleanupHostCancelsQueuedMigration,
     nova_tests.LiveMigrationWithCpuSharedSet],
    excluded=EXCLUDED, substitute_driver=True, starts_computes=True)
