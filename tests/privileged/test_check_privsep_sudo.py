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

"""``prealloc-backend check`` (its privsep check) against real sudo rules.

A user made for the test owns instances_path and the log directory root's
nova.conf names, as on Ubuntu or kolla; the site's sudoers keeps HOME for
that user. With the route documented before prealloc-privsep-helper (a sudo
rule for privsep-helper itself) the check fails and names each condition;
with the shipped rule and prealloc-privsep-helper it passes. sudo answers for
real (``sudo -l -U``), and the check walks this venv's sys.path for real.
"""

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import uuid

from oslotest import base

from prealloc_backend.checks import privsep
from prealloc_backend.checks import result
from tests import fixtures as pb_fixtures
from tests.privileged import test_privsep_helper_sudo

BIN = os.path.dirname(sys.executable)
# The rule documented before prealloc-privsep-helper, for privsep-helper
# itself.
OLD_RULE = ('%(user)s ALL = (root) NOPASSWD: %(program)s ^--config-file '
            '%(conf)s --privsep_context prealloc_backend[.]privsep[.]ctx '
            '--privsep_sock_path /tmp/tmp[a-z0-9_]{8}/privsep[.]sock$\n')


class CheckSudoTestCase(base.BaseTestCase):

    def setUp(self):
        super().setUp()
        if os.geteuid() != 0:
            self.skipTest('installs a sudoers rule and a user: root only')
        for tool in ('sudo', 'visudo'):
            if not shutil.which(tool):
                self.skipTest('%s is not installed' % tool)
        self.tmp = tempfile.mkdtemp(prefix='pbcheck', dir='/tmp')
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        os.chmod(self.tmp, 0o755)
        self.user = 'pbchk' + uuid.uuid4().hex[:8]
        subprocess.run(['useradd', '--system', '--no-create-home',
                        self.user], check=True, capture_output=True)
        self.addCleanup(subprocess.run, ['userdel', self.user],
                        capture_output=True)
        self.uid = pwd.getpwnam(self.user).pw_uid
        self.instances = os.path.join(self.tmp, 'instances')
        self.log_dir = os.path.join(self.tmp, 'log')
        for path in (self.instances, self.log_dir):
            os.mkdir(path)
            os.chown(path, self.uid, -1)
        self.conf_path = os.path.join(self.tmp, 'nova.conf')
        self.site = 'Defaults:%s env_keep += "HOME"' % self.user

    def check(self, program):
        sections = pb_fixtures.check_sections(self.conf_path, self.instances)
        sections['DEFAULT']['log_dir'] = self.log_dir
        sections['prealloc_backend_privsep']['helper_command'] = (
            'sudo %s --config-file %s' % (program, self.conf_path))
        host = self.useFixture(pb_fixtures.CheckHost(
            self.conf_path, sections)).host
        return privsep.check_privsep(host)

    def test_privsep_helper_route_fails(self):
        program = os.path.join(BIN, 'privsep-helper')
        rule = OLD_RULE % {'user': self.user, 'program': program,
                           'conf': self.conf_path.replace('.', '[.]')}
        path = '/etc/sudoers.d/prealloc-test-' + self.user
        with open(path, 'w') as f:
            f.write(rule + self.site + '\n')
        os.chmod(path, 0o440)
        self.addCleanup(os.unlink, path)
        subprocess.run(['visudo', '-cf', path], check=True,
                       capture_output=True)
        res = self.check(program)
        self.assertEqual(result.Code.FAILURE, res.code)
        for text in (
                'privsep-helper run as root connects to the '
                '--privsep_sock_path %s names' % self.user,
                'privsep-helper opens %s/privsep-helper.log as root before '
                'it drops privileges ([DEFAULT] log_dir = %s), and %s can '
                'change it: %s is owned by %s'
                % (self.log_dir, self.log_dir, self.user, self.log_dir,
                   self.user),
                'sudo keeps HOME of %s for %s (env_keep)'
                % (self.user, program),
                'can change none of the code root runs'):
            self.assertIn(text, res.details)
        self.assertNotIn('sudo does not let', res.details)
        self.assertIn('helper_command = sudo /usr/bin/prealloc-privsep-helper',
                      res.fix)
        self.assertIn('always_set_home', res.fix)

    def test_shipped_route_passes(self):
        rule = self.useFixture(test_privsep_helper_sudo.SudoRule(
            self.user, self.conf_path, extra=self.site))
        res = self.check(rule.program)
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        self.assertIn('sudo resets the environment and HOME for %s'
                      % rule.program, res.details)
        self.assertIn('prealloc-privsep-helper logs to stderr only',
                      res.details)
        # nova's own rootwrap door is named, not hidden by the success.
        self.assertIn("This closes the plugin's route only", res.details)
        self.assertEqual([], res.facts['sudo_environment']['env_keep'])
        self.assertTrue(res.facts['sudo_environment']['always_set_home'])

    def test_shipped_route_without_its_rule(self):
        # No sudoers rule at all: the check says so.
        res = self.check(os.path.join(BIN, 'prealloc-privsep-helper'))
        self.assertEqual(result.Code.FAILURE, res.code)
        self.assertIn('sudo does not let %s run' % self.user, res.details)
