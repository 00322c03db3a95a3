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

"""The privsep daemon check where the helper's Python imports the plugin.

The check runs this venv's Python (the one privsep-helper starts with) to
import the plugin, a child process that imports nova: these cases are here,
the others in tests/unit/checks/test_check_privsep.py (the cases they share in
tests/base.py).
"""

import os
import sys

from prealloc_backend.checks import result
from tests import base

PRIVSEP_HELPER = base.PRIVSEP_HELPER
BIN = base.BIN
# The nova user of a healthy host owns instances_path (the check takes the
# nova user from it, and the daemon refuses a root-owned one).
NOVA_UID = 54321


def nova_owns(path):
    if os.geteuid() == 0:
        os.chown(path, NOVA_UID, NOVA_UID)


class TestHelperCommand(base.PrivsepCheckCase):

    def test_healthy(self):
        nova_owns(self.instances)
        res = self.check('%s --config-file %s' % (PRIVSEP_HELPER,
                                                  self.conf_path))
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        self.assertEqual('helper_command', res.facts['method'])
        self.assertEqual(self.instances, res.facts['helper_instances_path'])
        self.assertEqual(PRIVSEP_HELPER, res.facts['privsep_helper'])
        self.assertEqual([sys.executable], res.facts['python'])
        self.assertIn('imports the plugin', res.details)

    def test_helper_without_nova_conf(self):
        res = self.check(PRIVSEP_HELPER)
        self.assertEqual(result.Code.FAILURE, res.code)
        self.assertIn('not %s' % self.instances, res.details)
        self.assertIn('refuses every disk', res.details)
        self.assertIn('--config-file', res.fix)
        self.assertEqual([], res.facts['helper_config_files'])
        # nova's default: $state_path/instances.
        self.assertNotEqual(self.instances, res.facts['helper_instances_path'])
        self.assertEqual('instances', os.path.basename(
            res.facts['helper_instances_path']))


class TestRootHelper(base.RootHelperCheckCase):

    def test_command_line_matched_against_the_filters(self):
        nova_owns(self.instances)
        self.write_rootwrap(BIN)
        res = self.check(mode='none')
        facts = res.facts
        self.assertEqual('root_helper', facts['method'])
        # Exactly what oslo.privsep runs for nova-compute.
        self.assertEqual(
            ['sudo', 'nova-rootwrap', self.rootwrap_conf, 'privsep-helper',
             '--config-file', self.conf_path,
             '--privsep_context', 'prealloc_backend.privsep.ctx',
             '--privsep_sock_path'], facts['command'][:-1])
        self.assertEqual([os.path.join(self.filters_dir,
                                       'prealloc_backend.filters')],
                         facts['filter_files'])
        # The plugin's filter only allows configuration files under /etc:
        # oslo.rootwrap's own privsep-helper rule lets this one through.
        self.assertEqual('privsep-helper', facts['filter'])
        self.assertIn("oslo.rootwrap's built-in rule", res.details)
        self.assertEqual(PRIVSEP_HELPER, facts['privsep_helper'])
        # The built-in rule is no boundary against the nova user: a
        # warning, whether or not sudo and nova-rootwrap are installed.
        self.assertEqual(result.Code.WARNING, res.code, res.details)
        self.assertIn('Not a boundary against the nova user', res.details)
        self.assertIn('helper_command', res.fix)
