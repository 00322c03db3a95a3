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

"""etc/rootwrap.d/prealloc_backend.filters, read by oslo.rootwrap itself.

The command lines are built by oslo.privsep for the plugin's real context
(PrivContext.helper_command, after nova-compute's priv_context.init with its
root helper), with nova-compute's --config-file/--config-dir arguments, and
matched with oslo.rootwrap's own load_filters/match_filter as nova-rootwrap
does.

oslo.rootwrap's load_filters always appends a catch-all rule for
privsep-helper (any arguments) after the filters read from files; the
plugin's filters are checked here without it, so that what they allow and
refuse is theirs. TestBuiltInRule records that catch-all, which is why the
filter file is optional with nova-rootwrap (doc/source/install/install.rst).
"""

import os
import sys

import fixtures
from oslo_config import cfg
from oslo_privsep import priv_context
from oslo_rootwrap import filters as rootwrap_filters
from oslo_rootwrap import wrapper
from oslotest import base

import prealloc_backend.privsep

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
FILTERS_DIR = os.path.join(ROOT, 'etc', 'rootwrap.d')
# Where privsep-helper is installed with the plugin (rootwrap's exec_dirs).
EXEC_DIRS = [os.path.dirname(sys.executable)]
ROOT_HELPER = ['sudo', 'nova-rootwrap', '/etc/nova/rootwrap.conf']
# oslo.privsep's socket: tempfile.mkdtemp() + '/privsep.sock'.
SOCK = '/tmp/tmpk2v9x_1q/privsep.sock'
BUILT_IN = 'privsep-helper'


class FilterTestCase(base.BaseTestCase):

    def setUp(self):
        super().setUp()
        self.all_filters = wrapper.load_filters([FILTERS_DIR])
        self.ours = [f for f in self.all_filters if f.name != BUILT_IN]

    def command(self, config_files=(), config_dirs=(), ctx=None):
        """The helper command line oslo.privsep builds for nova-compute,
        without the root helper (what nova-rootwrap matches).
        """
        ctx = ctx or prealloc_backend.privsep.ctx
        # nova-compute's parsed configuration, without files that
        # must exist: a ConfigOpts of its own replaces the global one for
        # this call only, with the options helper_command reads.
        conf = cfg.ConfigOpts()
        conf.register_opts(priv_context.OPTS, group=ctx.cfg_section)
        conf.register_opt(cfg.MultiStrOpt('config_file'))
        conf.register_opt(cfg.MultiStrOpt('config_dir'))
        conf.set_override('config_file', list(config_files))
        conf.set_override('config_dir', list(config_dirs) or None)
        self.useFixture(fixtures.MonkeyPatch(
            'oslo_privsep.priv_context.cfg.CONF', conf))
        self.useFixture(fixtures.MonkeyPatch(
            'oslo_privsep.priv_context._HELPER_COMMAND_PREFIX', ROOT_HELPER))
        cmd = ctx.helper_command(SOCK)
        self.assertEqual(ROOT_HELPER, cmd[:len(ROOT_HELPER)])
        return cmd[len(ROOT_HELPER):]

    def match(self, userargs, filters=None):
        return wrapper.match_filter(
            self.ours if filters is None else filters, userargs,
            exec_dirs=EXEC_DIRS)

    def assert_refused(self, userargs):
        self.assertRaises(wrapper.NoFilterMatched, self.match, userargs)


class TestFilterFile(FilterTestCase):

    def test_file_loads_as_regexp_filters_run_as_root(self):
        self.assertEqual(['prealloc_backend_privsep',
                          'prealloc_backend_privsep_2',
                          'prealloc_backend_privsep_3'],
                         [f.name for f in self.ours])
        for f in self.ours:
            self.assertIsInstance(f, rootwrap_filters.RegExpFilter)
            self.assertEqual('root', f.run_as)
            # privsep-helper found where the plugin is installed.
            self.assertEqual(os.path.join(EXEC_DIRS[0], 'privsep-helper'),
                             f.get_exec(exec_dirs=EXEC_DIRS))

    def test_one_config_file_allowed(self):
        userargs = self.command(['/etc/nova/nova.conf'])
        self.assertEqual(
            ['privsep-helper', '--config-file', '/etc/nova/nova.conf',
             '--privsep_context', 'prealloc_backend.privsep.ctx',
             '--privsep_sock_path', SOCK], userargs)
        self.assertEqual('prealloc_backend_privsep',
                         self.match(userargs).name)

    def test_two_config_files_allowed(self):
        userargs = self.command(['/etc/nova/nova.conf',
                                 '/etc/nova/nova-compute.conf'])
        self.assertEqual('prealloc_backend_privsep_2',
                         self.match(userargs).name)

    def test_config_file_and_dir_allowed(self):
        userargs = self.command(['/etc/nova/nova.conf'],
                                ['/etc/nova/nova.conf.d'])
        self.assertEqual(
            ['privsep-helper', '--config-file', '/etc/nova/nova.conf',
             '--config-dir', '/etc/nova/nova.conf.d',
             '--privsep_context', 'prealloc_backend.privsep.ctx',
             '--privsep_sock_path', SOCK], userargs)
        self.assertEqual('prealloc_backend_privsep_3',
                         self.match(userargs).name)

    def test_other_contexts_refused(self):
        import nova.privsep

        self.assert_refused(self.command(['/etc/nova/nova.conf'],
                                         ctx=nova.privsep.sys_admin_pctxt))
        userargs = self.command(['/etc/nova/nova.conf'])
        context = userargs.index('--privsep_context') + 1
        for other in ('prealloc_backend.privsep.ctx2',
                      'prealloc_backend.privsep.ctxX',
                      'prealloc_backend.privsep',
                      'os_brick.privileged.default',
                      'xprealloc_backend.privsep.ctx'):
            changed = list(userargs)
            changed[context] = other
            self.assert_refused(changed)

    def test_config_files_outside_etc_refused(self):
        # A configuration file sets the daemon's capabilities, user and
        # logging: only root's /etc may provide it.
        for path in ('/tmp/nova.conf', 'nova.conf', '/home/nova/etc/x.conf',
                     '/etc/../tmp/nova.conf',
                     '/etc/nova/../../tmp/nova.conf'):
            self.assert_refused(self.command([path]))
            self.assert_refused(self.command(['/etc/nova/nova.conf', path]))

    def test_other_command_lines_refused(self):
        userargs = self.command(['/etc/nova/nova.conf'])
        # No configuration file: not what nova-compute runs.
        self.assert_refused(self.command([]))
        # Three configuration files: no filter has that many arguments.
        self.assert_refused(self.command(['/etc/a.conf', '/etc/b.conf',
                                          '/etc/c.conf']))
        # Extra options (logging to any file as root, say).
        self.assert_refused(userargs + ['--log-file', '/etc/shadow'])
        self.assert_refused(userargs[:1] + ['--log-file', '/etc/shadow'] +
                            userargs[3:])
        # Arguments reordered or the socket outside /tmp.
        self.assert_refused(userargs[:1] + userargs[3:] + userargs[1:3])
        changed = list(userargs)
        changed[-1] = '/var/lib/nova/privsep.sock'
        self.assert_refused(changed)
        # Other programs.
        self.assert_refused(['sh', '-c', 'id'])
        self.assert_refused(['/usr/bin/privsep-helper'] + userargs[1:])
        self.assert_refused(['privsep-helper2'] + userargs[1:])


class TestBuiltInRule(FilterTestCase):
    """oslo.rootwrap itself lets privsep-helper run with any arguments."""

    def test_load_filters_appends_catch_all_privsep_rule(self):
        self.assertEqual(BUILT_IN, self.all_filters[-1].name)
        self.assertIsInstance(self.all_filters[-1],
                              rootwrap_filters.CommandFilter)
        self.assertEqual([BUILT_IN], [f.name for f in
                                      wrapper.load_filters([])])

    def test_our_filter_matches_first_when_it_applies(self):
        userargs = self.command(['/etc/nova/nova.conf'])
        self.assertEqual('prealloc_backend_privsep',
                         self.match(userargs, self.all_filters).name)

    def test_catch_all_allows_what_ours_refuses(self):
        userargs = self.command(['/tmp/nova.conf'])
        self.assert_refused(userargs)
        self.assertEqual(BUILT_IN,
                         self.match(userargs, self.all_filters).name)

    def test_catch_all_allows_any_context_and_options(self):
        """What the built-in rule implies (doc/source/admin/security.rst):
        any configuration file, any option, any context (nova's CAP_SYS_ADMIN
        one included).
        """
        import nova.privsep

        for userargs in (
                self.command(['/home/nova/mine.conf'],
                             ctx=nova.privsep.sys_admin_pctxt),
                self.command(['/etc/nova/nova.conf']) +
                ['--log-file', '/etc/shadow'],
                ['privsep-helper', '--privsep_context',
                 'prealloc_backend.privsep.ctx']):
            self.assert_refused(userargs)
            matched = self.match(userargs, self.all_filters)
            self.assertEqual(BUILT_IN, matched.name)
            self.assertIsInstance(matched, rootwrap_filters.CommandFilter)
            self.assertEqual('root', matched.run_as)
