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

"""prealloc_backend/cmd/compute.py: ``prealloc-nova-compute`` makes the
plugin's driver loadable by nova's compute_driver, then runs nova-compute's
own main.

nova-compute's main itself cannot run in the unit tier (it starts the
service): it is replaced by a function that records what nova would load
at that moment. The real wrapper runs in tests/integration/
test_driver_loading.py.
"""

import sys
from unittest import mock

from nova.cmd import compute as nova_compute
import nova.virt
from oslo_utils import importutils
from oslotest import base

from prealloc_backend.adapter import driver
from prealloc_backend.cmd import compute


class ComputeTestCase(base.BaseTestCase):

    def test_driver_registered_before_nova_compute_main(self):
        name = 'nova.virt.' + driver.NOVA_VIRT_NAME
        self.assertEqual('prealloc_backend.LibvirtDriver',
                         driver.NOVA_VIRT_NAME + '.LibvirtDriver')
        seen = []

        def nova_main():
            seen.append(importutils.import_class(
                'nova.virt.' + driver.COMPUTE_DRIVER))
        # As a fresh nova-compute: nothing registered yet.
        with mock.patch.dict(sys.modules):
            sys.modules.pop(name, None)
            had = hasattr(nova.virt, driver.NOVA_VIRT_NAME)
            saved = getattr(nova.virt, driver.NOVA_VIRT_NAME, None)
            if had:
                delattr(nova.virt, driver.NOVA_VIRT_NAME)
            try:
                with mock.patch.object(nova_compute, 'main', nova_main):
                    compute.main()
            finally:
                if had:
                    setattr(nova.virt, driver.NOVA_VIRT_NAME, saved)
        self.assertEqual([driver.LibvirtDriver], seen)

    def test_nova_compute_main_is_novas(self):
        self.assertIs(nova_compute, compute.compute)
