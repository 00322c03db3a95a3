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

"""prealloc_backend.planner.hostpolicy: the host's policy from its
configuration, checked once (every option and value: test_bad_input.py;
each contradiction on real filesystems: tests/privileged/
test_contradictions.py).
"""

from prealloc_backend import conf
from prealloc_backend import exception
from prealloc_backend.planner import hostpolicy
from prealloc_backend.planner import modes
from tests import base


class TestValidate(base.TestCase):

    def test_the_host_mode_is_returned(self):
        self.flags(mode='full', group='prealloc_backend')
        self.assertIs(modes.Mode.FULL, hostpolicy.validate(conf.CONF))
        self.flags(mode=None, group='prealloc_backend')
        self.flags(preallocate_images='space')
        self.assertIs(modes.Mode.SPACE, hostpolicy.validate(conf.CONF))

    def test_overlays_without_extended_l2_are_refused(self):
        self.flags(mode='metadata', qcow2_extended_l2=False,
                   group='prealloc_backend')
        self.flags(images_type='qcow2', group='libvirt')
        self.assertRaises(exception.ConflictingOptions, hostpolicy.validate,
                          conf.CONF)
        # Raw disks have no overlay to preallocate.
        self.flags(images_type='raw', group='libvirt')
        self.assertIs(modes.Mode.METADATA, hostpolicy.validate(conf.CONF))

    def test_an_empty_value_is_refused_naming_the_option(self):
        self.flags_fixture.load_raw_values(group='prealloc_backend',
                                           progress_interval='')
        exc = self.assertRaises(exception.InvalidOption,
                                hostpolicy.check_options, conf.CONF)
        self.assertIn('progress_interval', str(exc))
