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

"""Hard reboot and resize of real guests keep the preallocation."""

import os

from tests.functional.real import base

GIB = 1024 ** 3


class _HardReboot:

    def test_hard_reboot_keeps_preallocation(self):
        server = self.boot(self.flavor(mode='space'),
                           self.image(self.IMAGES_TYPE))
        before = self.check_hypervisor_view(server, self.IMAGES_TYPE,
                                            'space', GIB)
        path = self.disk_path(server)
        inode = os.stat(path).st_ino

        self._reboot_server(server, hard=True)

        # A new QEMU and a new boot of the guest, on the same file (nova
        # re-created nothing), still fully allocated, with the same XML.
        self.check_hypervisor_view(server, self.IMAGES_TYPE, 'space', GIB,
                                   after=before)
        self.assertEqual(inode, os.stat(path).st_ino)
        self.delete(server)
        self.assert_no_leftovers(server)


class _Resize:

    def test_resize_keeps_preallocation(self):
        server = self.boot(self.flavor(mode='space'),
                           self.image(self.IMAGES_TYPE))
        before = self.check_hypervisor_view(server, self.IMAGES_TYPE,
                                            'space', GIB)
        bigger = self.flavor(disk_gb=2, mode='space')

        server = self._resize_server(server, bigger)

        # The guest booted again from the grown disk: 2 GiB, allocated over
        # all of it (the part nova copied too), for qcow2 a metadata cache
        # sized for 2 GiB; the base data still shows.
        resized = self.check_hypervisor_view(server, self.IMAGES_TYPE,
                                             'space', 2 * GIB, after=before)
        server = self._confirm_resize(server)
        self.assertEqual(resized, self.check_hypervisor_view(
            server, self.IMAGES_TYPE, 'space', 2 * GIB))
        self.assertFalse(os.path.exists(self.instance_dir(server) +
                                        '_resize'))
        self.delete(server)
        self.assert_no_leftovers(server)


class TestQcow2Lifecycle(_HardReboot, _Resize, base.RealHypervisorTestCase):

    IMAGES_TYPE = 'qcow2'


class TestRawLifecycle(_HardReboot, _Resize, base.RealHypervisorTestCase):

    IMAGES_TYPE = 'raw'
