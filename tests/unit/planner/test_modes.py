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

"""Modes: parsed once, nova's option honoured, flavor override."""

from prealloc_backend import exception
from prealloc_backend.planner import modes
from prealloc_backend.planner.modes import Mode
from tests import base


class TestModes(base.TestCase):

    def test_parse(self):
        self.assertIs(Mode.FULL, Mode.parse(' Full ', 'here'))
        exc = self.assertRaises(exception.InvalidPreallocMode, Mode.parse,
                                'fast', 'somewhere')
        self.assertIn("'fast'", str(exc))
        self.assertIn('somewhere', str(exc))
        self.assertIn('none, metadata, space, full', str(exc))

    def test_unset_follows_nova(self):
        self.assertIs(Mode.NONE, modes.host_mode(base.CONF))
        self.flags(preallocate_images='space')
        self.assertIs(Mode.SPACE, modes.host_mode(base.CONF))

    def test_own_option_wins(self):
        self.flags(preallocate_images='space')
        for value in ('none', 'metadata', 'space', 'full'):
            self.flags(mode=value, group='prealloc_backend')
            self.assertIs(Mode(value), modes.host_mode(base.CONF))

    def test_nova_choices_enforced_by_nova(self):
        # nova's own definition refuses other values: we never register a
        # wider one.
        self.assertRaises(ValueError, self.flags,
                          preallocate_images='metadata')

    def test_flavor_override(self):
        self.flags(preallocate_images='space')
        host = modes.host_mode(base.CONF)
        self.assertIs(Mode.SPACE, modes.disk_mode({}, host))
        self.assertIs(Mode.SPACE, modes.disk_mode(None, host))
        self.assertIs(Mode.METADATA, modes.disk_mode(
            {'prealloc:mode': 'metadata'}, Mode.SPACE))
        self.assertIs(Mode.NONE, modes.disk_mode(
            {'prealloc:mode': 'none', 'hw:cpu_policy': 'x'}, Mode.SPACE))

    def test_bad_flavor_value_names_key_and_choices(self):
        exc = self.assertRaises(exception.InvalidFlavorPolicy,
                                modes.disk_mode,
                                {'prealloc:mode': 'turbo'}, Mode.SPACE)
        self.assertIn("'turbo'", str(exc))
        self.assertIn('prealloc:mode', str(exc))
        self.assertIn('none, metadata, space, full', str(exc))

    def test_preallocates(self):
        self.assertEqual([False, True, True, True],
                         [m.preallocates for m in Mode])
