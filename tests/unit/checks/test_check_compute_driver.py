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

"""The compute driver check on real nova.conf files.

The check imports the driver as nova-compute would (nova.virt.<name>), in
this process. The warning branch (prealloc-nova-compute not installed) is
not tested: the check also looks beside this Python, where tox installs it.
"""

import os

from prealloc_backend.checks import compute_driver
from prealloc_backend.checks import result
from tests import base


class TestComputeDriver(base.CheckTestCase):

    def check(self, value):
        sections = self.nova_conf()
        sections['DEFAULT']['compute_driver'] = value
        return compute_driver.check_compute_driver(self.check_host(sections))

    def test_the_plugins_driver(self):
        res = self.check('prealloc_backend.LibvirtDriver')
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        self.assertEqual('prealloc_backend.adapter.driver.LibvirtDriver',
                         res.facts['driver_class'])
        self.assertTrue(os.access(res.facts['wrapper'], os.X_OK))
        self.assertEqual('prealloc-nova-compute',
                         os.path.basename(res.facts['wrapper']))

    def test_the_natural_guess_nova_cannot_import(self):
        res = self.check('prealloc_backend.adapter.driver.LibvirtDriver')
        self.assertEqual(result.Code.FAILURE, res.code)
        self.assertIn('this name cannot be loaded', res.details)
        self.assertIn('compute_driver = prealloc_backend.LibvirtDriver',
                      res.fix)
        self.assertIn('prealloc-nova-compute', res.fix)

    def test_novas_own_driver(self):
        res = self.check('libvirt.LibvirtDriver')
        self.assertEqual(result.Code.FAILURE, res.code)
        self.assertIn('will load nova.virt.libvirt.LibvirtDriver, not the '
                      'plugin', res.details)
        self.assertNotIn('driver_class', res.facts)
