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

"""Options: nova's preallocate_images untouched, ours registered cleanly.

Both import orders of nova's options and ours need a fresh Python each:
tests/integration/test_conf_import_orders.py.
"""

import importlib.metadata

from oslo_config import cfg
from oslo_config import types

from prealloc_backend import conf
from tests import base


class TestOpts(base.TestCase):

    def test_entry_point_loads_by_name(self):
        eps = importlib.metadata.entry_points(group='oslo.config.opts',
                                              name='prealloc_backend')
        self.assertEqual(1, len(eps))
        list_opts = list(eps)[0].load()
        self.assertIs(conf.list_opts, list_opts)
        groups = dict((getattr(group, 'name', group), opts)
                      for group, opts in list_opts())
        names = sorted(opt.name for opt in groups['prealloc_backend'])
        self.assertEqual(sorted(opt.name for opt in conf.prealloc_opts),
                         names)
        self.assertNotIn('preallocate_images', names)
        self.assertIn('helper_command', [
            opt.name for opt in groups['prealloc_backend_privsep']])

    def test_list_opts_returns_copies(self):
        (_group, opts), = [item for item in conf.list_opts()
                           if item[0] is conf.prealloc_group]
        self.assertEqual(conf.prealloc_opts, opts)
        self.assertIsNot(conf.prealloc_opts[0], opts[0])

    def test_register_opts_is_idempotent(self):
        conf.register_opts(base.CONF)
        fresh = cfg.ConfigOpts()
        conf.register_opts(fresh)
        conf.register_opts(fresh)
        fresh([], default_config_files=[])
        self.assertIsNone(fresh.prealloc_backend.mode)
        self.assertEqual('128K', fresh.prealloc_backend.qcow2_cluster_size)

    def test_every_option_has_choices_or_bounds(self):
        # By the option's type, not its class: the integer options
        # are cfg.Opt(type=conf.Integer(...)), never cfg.IntOpt.
        kinds = []
        for opt in conf.prealloc_opts:
            if isinstance(opt.type, types.String):
                self.assertTrue(opt.type.choices, opt.name)
                kinds.append('choices')
            elif isinstance(opt.type, types.Integer):
                self.assertIsNotNone(opt.type.min, opt.name)
                kinds.append('bounds')
            elif isinstance(opt.type, types.Boolean):
                kinds.append('boolean')
            elif isinstance(opt.type, types.List):
                self.assertTrue(opt.default, opt.name)
                kinds.append('list')
            else:
                self.fail('%s: a type this test does not know' % opt.name)
            self.assertTrue(opt.help.strip(), opt.name)
        self.assertEqual(['choices', 'boolean', 'choices', 'choices',
                          'bounds', 'choices', 'choices', 'boolean',
                          'choices', 'bounds', 'bounds', 'list'],
                         kinds)

    def test_bad_value_names_option_and_choices(self):
        self.flags_fixture.load_raw_values(group='prealloc_backend',
                                           mode='fast')
        exc = self.assertRaises(cfg.ConfigFileValueError, getattr,
                                base.CONF.prealloc_backend, 'mode')
        self.assertIn('fast', str(exc))
        self.assertIn('metadata', str(exc))
