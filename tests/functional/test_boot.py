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

"""Boot a server, check its disks: scenarios 1, 2 and 3, and each mode.

Each test is one user-visible flow: an operator configures the compute
host, a user boots a server, and the test inspects the real disk files and
the guest XML nova handed to libvirt.
"""

from oslo_utils import units

from prealloc_backend.adapter import driver
from prealloc_backend import conf
from tests.functional import base

CONF = conf.CONF


class TestDriverLoading(base.ServersTestBase):

    def test_documented_configuration_loads_the_plugin(self):
        """The documented nova.conf: compute_driver =
        prealloc_backend.LibvirtDriver and the wrapper's register(); nova's
        load_compute_driver does the rest (start_compute starts nova's
        compute service).
        """
        self.start_host('qcow2')
        self.assertEqual('prealloc_backend.LibvirtDriver',
                         CONF.compute_driver)
        compute_driver = self.computes['compute1'].driver
        self.assertIs(driver.LibvirtDriver, type(compute_driver))
        self.assertEqual('prealloc_backend.adapter.backend',
                         type(compute_driver.image_backend).__module__)


class TestBootOneLineSetup(base.ServersTestBase):
    """Scenario 1: ``preallocate_images = space`` and nothing else."""

    def test_qcow2_overlay_of_raw_image(self):
        self.start_host('qcow2', preallocate_images='space')
        image_id, image_path = self.upload_image('raw')
        server = self.boot(image_id, self.create_flavor(disk=1))
        self.assertServerDisks(server, 'qcow2', 'space', image_id,
                               image_path)

    def test_qcow2_overlay_of_qcow2_image(self):
        self.start_host('qcow2', preallocate_images='space')
        image_id, image_path = self.upload_image('qcow2', seed=2)
        server = self.boot(image_id, self.create_flavor(disk=1))
        self.assertServerDisks(server, 'qcow2', 'space', image_id,
                               image_path)

    def test_raw_disk_of_qcow2_image(self):
        self.start_host('raw', preallocate_images='space')
        image_id, image_path = self.upload_image('qcow2', seed=3)
        server = self.boot(image_id, self.create_flavor(disk=1))
        self.assertServerDisks(server, 'raw', 'space', image_id, image_path)


class TestBootEveryDisk(base.ServersTestBase):
    """Scenario 2: a flavor with ephemeral and swap: every disk allocated.
    """

    def _test(self, fmt):
        self.start_host(fmt, preallocate_images='space')
        image_id, image_path = self.upload_image('raw')
        flavor = self.create_flavor(disk=1, ephemeral=1, swap=64)
        server = self.boot(image_id, flavor)
        self.assertServerDisks(server, fmt, 'space', image_id, image_path,
                               ephemeral_gb=1, swap_mb=64)

    def test_qcow2(self):
        self._test('qcow2')

    def test_raw(self):
        self._test('raw')


class TestBootModes(base.ServersTestBase):
    """Scenario 3 (mode none, the control) and the other modes, per format.
    """

    def _test(self, fmt, mode, **opts):
        if mode in ('none', 'space'):
            # nova's own switch says it all for these two.
            self.start_host(fmt, preallocate_images=mode, **opts)
        else:
            self.start_host(fmt, preallocate_images='none', mode=mode,
                            **opts)
        image_id, image_path = self.upload_image('raw')
        flavor = self.create_flavor(disk=1, swap=64)
        server = self.boot(image_id, flavor)
        return self.assertServerDisks(
            server, fmt, mode, image_id, image_path, swap_mb=64,
            cluster_size=base.CLUSTER_SIZES[opts.get('qcow2_cluster_size',
                                                     '128K')])

    def test_none_qcow2_is_stock_novas_overlay(self):
        # Mode none makes stock nova's overlay whatever the layout options
        # say (doc/source/admin/modes.rst: an extended_l2 overlay left thin
        # is slower than nova's): no extended_l2, nova's cluster size, no
        # <metadata_cache>.
        figures = self._test('qcow2', 'none', qcow2_cluster_size='256K')
        self.assertEqual(base.NOVA_CLUSTER_SIZE,
                         figures['disk']['cluster_size'])

    def test_cluster_size_option_applies(self):
        figures = self._test('qcow2', 'space', qcow2_cluster_size='256K')
        self.assertEqual(256 * units.Ki, figures['disk']['cluster_size'])

    def test_none_raw(self):
        self._test('raw', 'none')

    def test_metadata_qcow2(self):
        self._test('qcow2', 'metadata')

    def test_metadata_raw_does_nothing(self):
        # raw has no metadata: exactly mode none's sparse file.
        self._test('raw', 'metadata')

    def test_full_qcow2(self):
        self._test('qcow2', 'full')

    def test_full_raw(self):
        self._test('raw', 'full')
