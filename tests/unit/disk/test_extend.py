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

"""prealloc_backend.disk.extend: nova's raw growth without its header probe,
and the guest filesystem of a grown qcow2 disk resized as nova would.

resize_qcow2_fs mounts the disk through nbd, which needs root and the
nbd module: here nova's mount helper is replaced (a recorder of what would
be resized); the real resize runs in the functional-real tier's guests.
"""

import os
import subprocess

import fixtures
from nova.virt.disk import api as disk_api
from nova.virt.disk.mount import api as mount
from oslo_utils import units

from prealloc_backend.disk import extend
from tests import base
from tests import fixtures as pb_fixtures


class TestGrowRaw(base.TestCase):

    def setUp(self):
        super().setUp()
        self.disk = os.path.join(self.instances_path, 'disk')
        # A guest-written qcow2 header: data, never a format to believe.
        subprocess.run(['qemu-img', 'create', '-f', 'qcow2', self.disk,
                        str(units.Gi)], check=True, capture_output=True)
        with open(self.disk, 'ab') as f:
            f.truncate(units.Mi)
        self.sha = pb_fixtures.sha256_of(self.disk)

    def test_grown_as_raw_data_kept(self):
        extend.grow_raw(self.disk, 4 * units.Mi)
        self.assertEqual(4 * units.Mi, os.path.getsize(self.disk))
        with open(self.disk, 'rb') as f:
            head = f.read(units.Mi)
        with open(self.disk + '.want', 'wb') as f:
            f.write(head)
        self.assertEqual(self.sha, pb_fixtures.sha256_of(self.disk + '.want'))

    def test_never_shrunk(self):
        extend.grow_raw(self.disk, units.Ki)
        self.assertEqual(units.Mi, os.path.getsize(self.disk))
        self.assertEqual(self.sha, pb_fixtures.sha256_of(self.disk))


class _Mounter:
    def __init__(self, device):
        self.device = device
        self.released = False

    def get_dev(self):
        return self.device is not None

    def unget_dev(self):
        self.released = True


class TestResizeQcow2Fs(base.TestCase):

    def setUp(self):
        super().setUp()
        self.resized = []
        self.useFixture(fixtures.MockPatchObject(
            disk_api, 'resize2fs',
            side_effect=lambda dev, **kw: self.resized.append((dev, kw))))

    def _resize(self, extendable, device):
        self.useFixture(fixtures.MockPatchObject(
            disk_api, 'is_image_extendable', return_value=extendable))
        mounter = _Mounter(device)
        self.useFixture(fixtures.MockPatchObject(
            mount.Mount, 'instance_for_format', return_value=mounter))
        extend.resize_qcow2_fs('/i/disk')
        return mounter

    def test_resized_on_the_nbd_device_as_root_then_released(self):
        mounter = self._resize(True, '/dev/nbd3')
        self.assertEqual([('/dev/nbd3', {'run_as_root': True,
                                         'check_exit_code': [0]})],
                         self.resized)
        self.assertTrue(mounter.released)

    def test_not_extendable_not_mounted(self):
        mounter = self._resize(False, '/dev/nbd3')
        self.assertEqual([], self.resized)
        self.assertFalse(mounter.released)

    def test_no_device_nothing_resized(self):
        self._resize(True, None)
        self.assertEqual([], self.resized)
