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
tests/integration/test_check_privsep_import.py.

The boundary conditions run on real files whose owner and modes the test
sets: the "nova user" is a uid without a passwd entry (chown: root only).
sudo's answers are the text ``sudo -l -U`` printed for the rules named
(captured from sudo 1.9.13): this tier installs no sudoers rule;
tests/privileged/test_check_privsep_sudo.py asks real sudo.
"""

import os
import shutil

import fixtures

from prealloc_backend.checks import privsep
from prealloc_backend.checks import result
from tests import base
from tests import fixtures as pb_fixtures

BIN = base.BIN
PRIVSEP_HELPER = base.PRIVSEP_HELPER
PrivsepCase = base.PrivsepCheckCase
RootHelperCase = base.RootHelperCheckCase


class TestHelperCommand(PrivsepCase):

    def test_not_an_executable(self):
        missing = os.path.join(self.tmp, 'no-such-helper')
        res = self.check('%s --config-file %s' % (missing, self.conf_path))
        self.assertEqual(result.Code.FAILURE, res.code)
        self.assertIn('is not an executable in PATH', res.details)
        self.assertIn('helper_command', res.fix)

    def nova_owns_instances(self):
        if os.geteuid() != 0:
            self.skipTest('chown to the nova user: root only')
        os.chown(self.instances, NOVA_UID, NOVA_UID)

    def test_problems_only_warn_where_the_mode_needs_no_daemon(self):
        self.nova_owns_instances()
        missing = os.path.join(self.tmp, 'no-such-helper')
        res = self.check('%s --config-file %s' % (missing, self.conf_path),
                         mode='none')
        self.assertEqual(result.Code.WARNING, res.code)
        self.assertIn('Not needed in mode none', res.details)
        self.assertIn('prealloc:mode=space or full', res.details)

    def test_no_privsep_helper_named(self):
        self.nova_owns_instances()
        res = self.check('true --config-file %s' % self.conf_path)
        self.assertEqual(result.Code.WARNING, res.code, res.details)
        self.assertIn('names neither privsep-helper nor '
                      'prealloc-privsep-helper', res.details)
        self.assertNotIn('privsep_helper', res.facts)

    def test_unknown_nova_user_fails_rather_than_skips(self):
        # Everything root's (instances_path and state_path's parents):
        # nothing the nova user cannot swap names it.
        if os.geteuid() != 0:
            self.skipTest('a root-owned instances_path: root only')
        self.sections['DEFAULT']['state_path'] = self.tmp
        res = self.check('true --config-file %s' % self.conf_path,
                         mode='none')
        self.assertEqual(result.Code.FAILURE, res.code, res.details)
        self.assertIn('The boundary against the nova user is not checked: '
                      'cannot tell who the nova user is', res.details)
        self.assertIn('--nova-user', res.fix)

    def test_nova_user_through_a_symlink_is_not_believed(self):
        # The nova user moved its instances_path away and put a symlink to
        # a root-owned directory there: the check followed it, saw root,
        # and skipped the boundary. The owner of state_path (which nova
        # cannot swap) still names the nova user.
        if os.geteuid() != 0:
            self.skipTest('chown to the nova user: root only')
        state = os.path.join(self.tmp, 'state')
        os.mkdir(state)
        os.chown(state, NOVA_UID, NOVA_UID)
        moved = self.instances + '.moved'
        os.rename(self.instances, moved)
        root_dir = os.path.join(self.tmp, 'roots')
        os.mkdir(root_dir)
        os.symlink(root_dir, self.instances)
        self.sections['DEFAULT']['state_path'] = state
        # nova.conf writable by the nova user: the boundary check's own
        # failure must survive the swap.
        open(self.conf_path, 'w').close()
        os.chown(self.conf_path, NOVA_UID, -1)
        res = self.check('true --config-file %s' % self.conf_path,
                         mode='none')
        self.assertEqual(result.Code.FAILURE, res.code, res.details)
        self.assertEqual(NOVA_UID, res.facts['nova_uid'], res.details)
        self.assertIn('The daemon reads its configuration from %s, which '
                      'uid %d can change' % (self.conf_path, NOVA_UID),
                      res.details)

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


NOVA_UID = 54321
NOVA = (NOVA_UID, frozenset([NOVA_UID]))
WRAPPER = '/usr/bin/prealloc-privsep-helper'
RULE = ('%s ^--config-file /etc/nova/nova[.]conf --privsep_context '
        'prealloc_backend[.]privsep[.]ctx --privsep_sock_path '
        '/tmp/tmp[a-z0-9_]{8}/privsep[.]sock$' % WRAPPER)
# sudo -l -U nova, sudo 1.9.13, with etc/prealloc_backend.sudoers and a
# site's Defaults:nova env_keep += "HOME PYTHONPATH"
LISTING_SHIPPED = """Matching Defaults entries for nova on vm:
    env_reset, mail_badpass,
    secure_path=/usr/local/sbin\\:/usr/local/bin\\:/usr/sbin\\:/usr/bin,
    use_pty, env_keep+="HOME PYTHONPATH"

Runas and Command-specific defaults for nova:
    Defaults!%s env_reset, always_set_home, !setenv, !env_keep

User nova may run the following commands on vm:
    (root) NOPASSWD: %s
""" % (RULE, RULE)
# the rule alone (no Defaults of its own)
LISTING_BARE = """Matching Defaults entries for nova on vm:
    env_reset, mail_badpass,
    secure_path=/usr/local/sbin\\:/usr/local/bin\\:/usr/sbin\\:/usr/bin,
    use_pty%s

User nova may run the following commands on vm:
    (root) NOPASSWD: %s%s
"""


class BoundaryCase(base.CheckTestCase):

    def setUp(self):
        super().setUp()
        if os.geteuid() != 0:
            self.skipTest('chown to the nova user: root only')
        os.chmod(self.tmp, 0o755)
        self.found = privsep.Findings()

    def nova_owned(self, path, directory=False, mode=0o755):
        if directory:
            os.mkdir(path)
        else:
            open(path, 'w').close()
        os.chmod(path, mode)
        os.chown(path, NOVA_UID, NOVA_UID)
        return path

    def problems(self):
        return ' '.join(p[1] for p in self.found.problems)

    def assertSecurityFailure(self, *texts):
        self.assertTrue(self.found.security, self.found.problems)
        self.assertEqual({result.Code.FAILURE},
                         {p[0] for p in self.found.problems})
        for text in texts:
            self.assertIn(text, self.problems())

    def assertClean(self):
        self.assertEqual([], self.found.problems)
        self.assertFalse(self.found.security)


class TestCodePaths(BoundaryCase):

    def setUp(self):
        super().setUp()
        self.site = os.path.join(self.tmp, 'site-packages')
        os.makedirs(os.path.join(self.site, 'pkg'))
        open(os.path.join(self.site, 'pkg', '__init__.py'), 'w').close()

    def test_root_only(self):
        privsep.check_code_paths([self.site], NOVA, self.found)
        self.assertClean()
        self.assertIn('can change none of the code root runs (2 files)',
                      self.found.notes[0])

    def test_sys_path_entry_of_nova(self):
        os.chown(self.site, NOVA_UID, NOVA_UID)
        privsep.check_code_paths([self.site], NOVA, self.found)
        self.assertSecurityFailure(
            'Root runs code from %s' % self.site,
            '%s is owned by uid %d' % (self.site, NOVA_UID))

    def test_file_beneath_writable(self):
        module = os.path.join(self.site, 'pkg', '__init__.py')
        os.chmod(module, 0o666)
        privsep.check_code_paths([self.site], NOVA, self.found)
        self.assertSecurityFailure('%s there is writable by everyone'
                                   % module)


class TestConfigPaths(BoundaryCase):

    def test_root_only(self):
        open(self.conf_path, 'w').close()
        privsep.check_config_paths([self.conf_path], [], NOVA, self.found)
        self.assertClean()

    def test_nova_conf_of_nova(self):
        self.nova_owned(self.conf_path, mode=0o640)
        privsep.check_config_paths([self.conf_path], [], NOVA, self.found)
        self.assertSecurityFailure(
            'configuration from %s, which uid %d can change (%s is owned '
            'by uid %d)' % (self.conf_path, NOVA_UID, self.conf_path,
                            NOVA_UID))

    def test_etc_nova_of_nova(self):
        etc = self.nova_owned(os.path.join(self.tmp, 'etc-nova'),
                              directory=True)
        conf = os.path.join(etc, 'nova.conf')
        open(conf, 'w').close()
        privsep.check_config_paths([conf], [], NOVA, self.found)
        self.assertSecurityFailure('%s is owned by uid %d' % (etc, NOVA_UID))


class TestLogging(BoundaryCase):

    def conf(self, **options):
        pb_fixtures.write_conf(self.conf_path, {'DEFAULT': options})
        return [self.conf_path]

    def test_log_dir_of_nova(self):
        log_dir = self.nova_owned(os.path.join(self.tmp, 'log'),
                                  directory=True)
        privsep.check_logging(self.conf(log_dir=log_dir), [],
                              '/usr/bin/privsep-helper', NOVA, self.found)
        self.assertSecurityFailure(
            'privsep-helper opens %s/privsep-helper.log as root before it '
            'drops privileges ([DEFAULT] log_dir = %s)' % (log_dir, log_dir),
            '%s is owned by uid %d' % (log_dir, NOVA_UID))
        self.assertIn('Make %s root\'s' % log_dir, self.found.problems[0][2])

    def test_log_file_in_root_log_dir(self):
        log_dir = os.path.join(self.tmp, 'log')
        os.mkdir(log_dir)
        privsep.check_logging(self.conf(log_dir=log_dir, log_file='h.log'),
                              [], '/usr/bin/privsep-helper', NOVA,
                              self.found)
        self.assertClean()
        self.assertEqual(os.path.join(log_dir, 'h.log'),
                         self.found.facts['helper_log_file'])

    def test_log_config_append_of_nova(self):
        append = self.nova_owned(os.path.join(self.tmp, 'logging.conf'))
        privsep.check_logging(self.conf(log_config_append=append), [],
                              '/usr/bin/privsep-helper', NOVA, self.found)
        self.assertSecurityFailure('log_config_append = %s' % append,
                                   'logging.fileConfig')

    def test_no_log_file(self):
        privsep.check_logging(self.conf(use_journal='true'), [],
                              '/usr/bin/privsep-helper', NOVA, self.found)
        self.assertClean()
        self.assertIsNone(self.found.facts['helper_log_file'])


class TestSudoEnvironment(base.CheckTestCase):

    def judge(self, listing):
        found = privsep.Findings()
        privsep.judge_sudo_environment(
            privsep.parse_sudo_listing(listing, WRAPPER), 'nova', WRAPPER,
            found)
        return found

    def test_shipped_rule_wins_over_site_env_keep(self):
        found = self.judge(LISTING_SHIPPED)
        self.assertEqual([], found.problems)
        self.assertIn('sudo resets the environment and HOME', found.notes[0])
        self.assertEqual([], found.facts['sudo_environment']['env_keep'])

    def test_always_set_home_overrides_env_keep(self):
        listing = LISTING_SHIPPED.replace(', !setenv, !env_keep', '')
        problems = self.judge(listing).problems
        self.assertEqual(1, len(problems))
        self.assertIn('sudo keeps PYTHONPATH of nova', problems[0][1])
        listing = listing.replace(', always_set_home', '')
        self.assertIn('sudo keeps HOME, PYTHONPATH of nova',
                      self.judge(listing).problems[0][1])

    def test_home_kept(self):
        found = self.judge(LISTING_BARE % (', env_keep+="HOME"', RULE, ''))
        self.assertTrue(found.security)
        self.assertIn('sudo keeps HOME of nova for %s (env_keep): '
                      'oslo.config reads ~/.privsep/privsep.conf.d/*.conf'
                      % WRAPPER, found.problems[0][1])
        self.assertIn('always_set_home', found.problems[0][2])

    def test_python_and_oslo_variables_kept(self):
        found = self.judge(LISTING_BARE % (', env_keep+="OS_* PYTHONPATH '
                                           'DISPLAY"', RULE, ''))
        self.assertIn('sudo keeps OS_*, PYTHONPATH of nova',
                      found.problems[0][1])

    def test_environment_not_reset(self):
        found = self.judge(LISTING_BARE.replace('env_reset', '!env_reset')
                           % ('', RULE, ''))
        self.assertIn('does not reset the environment', found.problems[0][1])

    def test_setenv_tag(self):
        found = self.judge(LISTING_BARE.replace('NOPASSWD: ',
                                                'NOPASSWD: SETENV: ')
                           % ('', RULE, ''))
        self.assertIn('lets nova set environment variables',
                      found.problems[0][1])

    def test_bare_rule_default_environment(self):
        found = self.judge(LISTING_BARE % ('', RULE, ''))
        self.assertEqual([], found.problems)


class TestSudoRoute(PrivsepCase):
    """helper_command through sudo, nova's instances_path."""

    def setUp(self):
        super().setUp()
        if os.geteuid() != 0:
            self.skipTest('chown to the nova user: root only')
        os.chown(self.instances, NOVA_UID, NOVA_UID)
        # Not the venv: its 70,000 files are walked by the privileged
        # tier; here the socket and sudo conditions are what is tested.
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_backend.checks.privsep.helper_imports',
            lambda helper, found: []))

    def test_privsep_helper_through_sudo_fails_in_any_mode(self):
        res = self.check('sudo %s --config-file %s'
                         % (PRIVSEP_HELPER, self.conf_path), mode='none')
        self.assertEqual(result.Code.FAILURE, res.code, res.details)
        self.assertIn('privsep-helper run as root connects to the '
                      '--privsep_sock_path uid %d names' % NOVA_UID,
                      res.details)
        self.assertIn('whatever the mode', res.details)
        self.assertIn('helper_command = sudo /usr/bin/prealloc-privsep-helper'
                      ' --config-file /etc/nova/nova.conf', res.fix)
        # uid 54321 has no account: sudo's rule cannot be asked about
        self.assertIn("sudo's rule and environment for the nova user are "
                      'not verified (no nova user account)', res.details)

    def test_wrapper_through_sudo(self):
        wrapper = os.path.join(BIN, 'prealloc-privsep-helper')
        if not os.path.exists(wrapper):
            self.skipTest('prealloc-privsep-helper is not installed here')
        res = self.check('sudo %s --config-file %s'
                         % (wrapper, self.conf_path), mode='none')
        self.assertNotIn('--privsep_sock_path', res.details)
        self.assertIn('prealloc-privsep-helper logs to stderr only',
                      res.details)
        self.assertEqual(result.Code.WARNING, res.code, res.details)


class TestRootHelperBoundary(RootHelperCase):

    def test_builtin_rule_is_no_boundary(self):
        if os.geteuid() != 0:
            self.skipTest('chown to the nova user: root only')
        os.chown(self.instances, NOVA_UID, NOVA_UID)
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_backend.checks.privsep.helper_imports',
            lambda helper, found: []))
        self.write_rootwrap(BIN)
        res = self.check(mode='none')
        self.assertIn("nova-rootwrap lets uid %d run privsep-helper as root "
                      "with any arguments (oslo.rootwrap's built-in rule)"
                      % NOVA_UID, res.details)
        self.assertIn('Not a boundary against the nova user', res.details)
        self.assertIn('helper_command = sudo /usr/bin/prealloc-privsep-helper',
                      res.fix)
        self.assertNotEqual(result.Code.SUCCESS, res.code)
