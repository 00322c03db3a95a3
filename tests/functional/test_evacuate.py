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

"""Evacuation from a failed host to a plugin host.

NON-SHARED instance directories: the destination rebuilds the disk from the
image (the guest's writes stay on the dead host, as with stock nova); when
the failed host comes back, nova removes the evacuated server's disks there.
"""

from oslo_utils import units

from tests.functional import base
from tests.functional import test_migrate


class TestEvacuate(test_migrate._MigrateMixin,
                   test_migrate.multihost.MultiHostTestBase):

    def _evacuate(self, mode, dest_mode):
        self.add_host('src', 'qcow2', mode)
        self.add_host('dst', 'qcow2', dest_mode)
        server = self._boot('src')
        self.computes['src'].stop()
        self.force_down('src')
        # nova's fake libvirt reports the guest of a stopped compute as shut
        # off: nova evacuates it as such (nova's own helper expects it).
        server = self._evacuate_server(server, {'host': 'dst'},
                                       expected_host='dst',
                                       expected_state='SHUTOFF')
        disk = self.host_disk('dst', server)
        self.assertQcow2Overlay(disk, dest_mode, units.Gi,
                                self.host_base('dst', self.image_id))
        self.assertContentEqual(disk, self.reference(self.image_path,
                                                     units.Gi))
        self.assertEqual([], base.journal_files(self.host_dir('dst',
                                                              server)))
        # The failed host comes back: nova deletes what it held.
        self.restart_compute_service('src')
        self.force_down('src', False)
        self.assertNothingLeft(server, 'src')

    def test_space(self):
        self._evacuate('space', 'space')

    def test_none_to_metadata(self):
        self._evacuate('none', 'metadata')
