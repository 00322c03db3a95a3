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

"""A rolling deployment: hosts running stock nova's LibvirtDriver beside
hosts running the plugin's, servers moving both ways (cold migration,
NON-SHARED instance directories, rsync --sparse).
"""

import subprocess

from oslo_utils import units

from tests import fixtures as pb_fixtures
from tests.functional import base
from tests.functional import test_migrate


class TestMixedFleet(test_migrate._ColdMigrateBase):

    def _move(self, source_kind, dest_kind, fmt):
        """Boot on 'src', cold migrate to 'dst', confirm. ``*_kind``:
        'stock' (nova's driver, preallocate_images = none) or 'plugin'
        (mode space).
        """
        for name, kind in (('src', source_kind), ('dst', dest_kind)):
            self.add_host(name, fmt, 'none' if kind == 'stock' else 'space',
                          stock=kind == 'stock')
        server = self._boot('src', fmt)
        server = self._migrate_server(server, host='dst')
        server = self._confirm_resize(server)
        self.assertEqual('ACTIVE', server['status'])
        disk = self.host_disk('dst', server)
        self.assertContentEqual(disk, self.reference(
            self.image_path, units.Gi, [test_migrate.GUEST_WRITE]))
        self.assertNothingLeft(server, 'src')
        self.assertEqual([], base.journal_files(self.host_dir('dst',
                                                              server)))
        return server, disk

    def test_stock_to_plugin_qcow2(self):
        _server, disk = self._move('stock', 'plugin', 'qcow2')
        info = pb_fixtures.qemu_img_info(disk)
        # nova's overlay, without extended_l2: QEMU cannot preallocate its
        # clusters; the plugin reserves the file's blocks only (a warning
        # says so), the disk keeps working.
        self.assertFalse(info['format-specific']['data'].get('extended-l2'))
        base.record_figures(self, disk, 'space',
                            {'allocated': pb_fixtures.allocated(disk)})

    def test_plugin_to_stock_qcow2(self):
        _server, disk = self._move('plugin', 'stock', 'qcow2')
        # The plugin's xl2 overlay is a qcow2 disk like any other for stock
        # nova (its clusters stay mapped, qemu-img check finds nothing);
        # rsync --sparse made holes of the blocks the source had reserved,
        # and a stock host (preallocate_images = none) keeps them.
        info = pb_fixtures.qemu_img_info(disk)
        self.assertTrue(info['format-specific']['data']['extended-l2'])
        self.assertEqual(self.host_base('dst', self.image_id),
                         info['backing-filename'])
        subprocess.run(['qemu-img', 'check', '-U', disk], check=True,
                       capture_output=True)
        allocated = pb_fixtures.allocated(disk)
        base.record_figures(self, disk, 'stock', {'allocated': allocated})
        self.assertLess(allocated, base.SLACK + test_migrate.GUEST_WRITE[1])

    def test_stock_to_plugin_raw(self):
        _server, disk = self._move('stock', 'plugin', 'raw')
        self.assertRaw(disk, 'space', units.Gi)

    def test_plugin_to_stock_raw(self):
        _server, disk = self._move('plugin', 'stock', 'raw')
        # rsync --sparse copied the zeros as holes; stock nova keeps them.
        self.assertRaw(disk, 'none', units.Gi)
