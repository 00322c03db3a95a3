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

"""The privsep daemon check on real nova.conf, rootwrap.conf and filters.

The helper commands are real executables (this venv's privsep-helper, a
script whose Python lacks the plugin); the root-helper case builds the
command line oslo.privsep would run and matches it with oslo.rootwrap's own
code against the plugin's shipped filter file. The cases where the
helper's Python imports the plugin (a child process importing nova) are in
tests/integration/test_check_privsep.py.
"""

import os
import shutil
import sys

from oslo_privsep import priv_context

from prealloc_backend.checks import privsep
from prealloc_backend.checks import result
from tests import base
from tests import fixtures as pb_fixtures

BIN = os.path.dirname(sys.executable)
PRIVSEP_HELPER = os.path.join(BIN, 'privsep-helper')
FILTERS = os.path.join(os.path.dirname(__file__), '..', '..', 'etc',
                       'rootwrap.d', 'prealloc_backend.filters')


class PrivsepCase(base.CheckTestCase):

    def setUp(self):
        super().setUp()
        self.sections = self.nova_conf()

    def check(self, helper_command=None, mode='space'):
        self.sections['prealloc_backend']['mode'] = mode
        if helper_command is None:
            del self.sections['prealloc_backend_privsep']
        else:
            self.sections['prealloc_backend_privsep']['helper_command'] = (
                helper_command)
        return privsep.check_privsep(self.check_host(self.sections))


class TestHelperCommand(PrivsepCase):

    def test_not_an_executable(self):
        missing = os.path.join(self.tmp, 'no-such-helper')
        res = self.check('%s --config-file %s' % (missing, self.conf_path))
        self.assertEqual(result.Code.FAILURE, res.code)
        self.assertIn('is not an executable in PATH', res.details)
        self.assertIn('helper_command', res.fix)

    def test_problems_only_warn_where_the_mode_needs_no_daemon(self):
        missing = os.path.join(self.tmp, 'no-such-helper')
        res = self.check('%s --config-file %s' % (missing, self.conf_path),
                         mode='none')
        self.assertEqual(result.Code.WARNING, res.code)
        self.assertIn('Not needed in mode none', res.details)
        self.assertIn('prealloc:mode=space or full', res.details)

    def test_no_privsep_helper_named(self):
        res = self.check('true --config-file %s' % self.conf_path)
        self.assertEqual(result.Code.WARNING, res.code, res.details)
        self.assertIn('does not name privsep-helper', res.details)
        self.assertNotIn('privsep_helper', res.facts)

    def test_python_without_the_plugin(self):
        helper = os.path.join(self.tmp, 'privsep-helper')
        with open(helper, 'w') as f:
            # The system's Python, isolated from this venv and the cwd.
            f.write('#!%s -I\n' % (shutil.which('python3', path='/usr/bin')
                                   or '/usr/bin/python3'))
        os.chmod(helper, 0o755)
        res = self.check('%s --config-file %s' % (helper, self.conf_path))
        self.assertEqual(result.Code.FAILURE, res.code, res.details)
        self.assertIn('cannot import the plugin', res.details)
        self.assertIn('ModuleNotFoundError', res.details)
        self.assertIn('Install prealloc_backend', res.fix)


class RootHelperCase(PrivsepCase):
    """nova-compute's root helper (sudo nova-rootwrap) and its filters."""

    def setUp(self):
        super().setUp()
        # oslo.privsep keeps the root helper in a global: put its
        # default back.
        self.addCleanup(priv_context.init, root_helper=['sudo'])
        self.filters_dir = os.path.join(self.tmp, 'rootwrap.d')
        os.mkdir(self.filters_dir)
        shutil.copy(FILTERS, self.filters_dir)
        self.rootwrap_conf = os.path.join(self.tmp, 'rootwrap.conf')
        self.sections['DEFAULT']['rootwrap_config'] = self.rootwrap_conf

    def write_rootwrap(self, exec_dirs):
        pb_fixtures.write_conf(self.rootwrap_conf, {'DEFAULT': {
            'filters_path': self.filters_dir, 'exec_dirs': exec_dirs}})


class TestRootHelper(RootHelperCase):

    def test_privsep_helper_outside_exec_dirs(self):
        self.write_rootwrap(self.filters_dir)
        res = self.check()
        self.assertEqual(result.Code.FAILURE, res.code)
        self.assertIn('finds no privsep-helper in its exec_dirs (%s)'
                      % self.filters_dir, res.details)
        self.assertIn('Add the directory holding privsep-helper (%s)' % BIN,
                      res.fix)

    def test_rootwrap_conf_missing(self):
        res = self.check()
        self.assertEqual(result.Code.FAILURE, res.code)
        self.assertIn('The rootwrap configuration %s ([DEFAULT] '
                      'rootwrap_config) cannot be read' % self.rootwrap_conf,
                      res.details)
        self.assertIn('helper_command', res.fix)
