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

"""The configuration checks (option values, effective mode) on real
nova.conf files parsed into nova's configuration as nova-compute parses
them.
"""

from oslo_utils import units

from prealloc_backend.checks import config
from prealloc_backend.checks import result
from prealloc_backend.planner import diskplan
from tests import base


class ConfigCase(base.CheckTestCase):

    def setUp(self):
        super().setUp()
        self.sections = self.nova_conf()

    def host(self, disk_size=64 * units.Mi):
        return self.check_host(self.sections, disk_size=disk_size)


class TestOptions(ConfigCase):

    def test_valid(self):
        res = config.check_options(self.host())
        self.assertEqual(result.Code.SUCCESS, res.code)
        self.assertEqual('Values valid in %s.' % self.conf_path, res.details)
        self.assertEqual([self.conf_path], res.facts['config_files'])

    def test_invalid_values_named_with_file_and_allowed_values(self):
        self.sections['DEFAULT']['preallocate_images'] = 'always'
        self.sections['prealloc_backend'].update(
            mode='bogus', qcow2_metadata_cache_max_mb='0')
        self.sections['prealloc_backend_privsep']['user'] = ''
        host = self.host()
        res = config.check_options(host)
        self.assertEqual(result.Code.FAILURE, res.code)
        self.assertIn("[prealloc_backend] mode = 'bogus' (in %s) is not "
                      "valid: allowed values are none, metadata, space, full"
                      % self.conf_path, res.details)
        self.assertIn("[DEFAULT] preallocate_images = 'always' (in %s) is "
                      "not valid: allowed values are none, space"
                      % self.conf_path, res.details)
        self.assertIn("[prealloc_backend] qcow2_metadata_cache_max_mb = '0' "
                      "(in %s) is not valid: allowed values are integers from "
                      "1 to 4096" % self.conf_path, res.details)
        self.assertEqual(3, res.facts['invalid'])
        self.assertEqual(['[DEFAULT] preallocate_images',
                          '[prealloc_backend] mode',
                          '[prealloc_backend] qcow2_metadata_cache_max_mb'],
                         sorted(host.invalid_options))
        self.assertIn('Correct the values', res.fix)

    def test_every_option_read(self):
        # One invalid value per option the check reads: each is found.
        names = config.checked_options()
        self.assertIn(('prealloc_backend', 'fallocate_unsupported'), names)
        self.assertIn(('prealloc_backend_privsep', 'helper_command'), names)
        self.assertIn(('libvirt', 'images_type'), names)
        self.sections['prealloc_backend']['fallocate_unsupported'] = 'maybe'
        self.sections['libvirt'] = {'images_type': 'floppy'}
        res = config.check_options(self.host())
        self.assertEqual(2, res.facts['invalid'], res.details)
        self.assertIn('fallocate_unsupported', res.details)
        self.assertIn("images_type = 'floppy'", res.details)


class TestMode(ConfigCase):

    def plan(self, host):
        return diskplan.make_plan(host.conf.prealloc_backend, {}, host.mode,
                                host.disk_format, host.disk_size,
                                host.fs_facts())

    def test_space_from_nova(self):
        host = self.host()
        res = config.check_mode(host)
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        self.assertEqual('space', res.facts['mode'])
        self.assertEqual('[DEFAULT] preallocate_images = space',
                         res.facts['source'])
        self.assertEqual('qcow2', res.facts['disk_format'])
        self.assertEqual('falloc', res.facts['preallocation'])
        self.assertTrue(res.facts['extended_l2'])
        plan = self.plan(host)
        self.assertEqual(plan.needed_bytes, res.facts['needed_bytes'])
        self.assertEqual(plan.cluster_size, res.facts['cluster_size'])
        self.assertIn('preallocation=falloc', res.details)

    def test_own_mode_overrides_novas(self):
        self.sections['prealloc_backend']['mode'] = 'full'
        self.sections['libvirt'] = {'images_type': 'raw'}
        res = config.check_mode(self.host())
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        self.assertEqual('[prealloc_backend] mode = full (overrides '
                         '[DEFAULT] preallocate_images = space)',
                         res.facts['source'])
        self.assertEqual('zero-fill', res.facts['raw_action'])
        self.assertEqual(64 * units.Mi, res.facts['needed_bytes'])
        self.assertIn('raw disk holes zero-filled', res.details)

    def test_metadata_with_raw_disks(self):
        self.sections['prealloc_backend']['mode'] = 'metadata'
        self.sections['libvirt'] = {'images_type': 'raw'}
        res = config.check_mode(self.host())
        self.assertEqual(result.Code.WARNING, res.code)
        self.assertIn('raw disks have no metadata', res.details)
        self.assertEqual('nothing', res.facts['raw_action'])

    def test_extended_l2_off_conflicts(self):
        self.sections['prealloc_backend']['qcow2_extended_l2'] = 'false'
        res = config.check_mode(self.host())
        self.assertEqual(result.Code.FAILURE, res.code)
        self.assertIn('qcow2_extended_l2', res.details)
        self.assertIn('refuses to start', res.fix)

    def test_disks_the_plugin_does_not_handle(self):
        self.sections['libvirt'] = {'images_type': 'rbd'}
        res = config.check_mode(self.host())
        self.assertEqual(result.Code.WARNING, res.code)
        self.assertIsNone(res.facts['disk_format'])
        self.assertIn('images_type = rbd', res.details)
