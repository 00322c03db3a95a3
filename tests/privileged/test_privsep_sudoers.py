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

"""etc/prealloc_backend.sudoers, judged by sudo itself.

The documented way to close oslo.rootwrap's built-in privsep-helper rule
(doc/source/admin/security.rst): a sudo rule with fixed arguments for
prealloc-privsep-helper plus ``[prealloc_backend_privsep]
helper_command``. The command line is the one
oslo.privsep builds for the plugin's context (its own helper_command() and
socket directory from tempfile.mkdtemp()), asked of ``sudo -l -U`` for a
user made for the test, with the rule installed in /etc/sudoers.d for the
test's duration.
"""

import os
import pwd
import shlex
import shutil
import subprocess
import tempfile
import uuid

from oslo_config import cfg
from oslotest import base

import prealloc_backend.privsep
from tests.privileged import test_privsep_helper_sudo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SUDOERS = os.path.join(ROOT, 'etc', 'prealloc_backend.sudoers')


class SudoersRuleTestCase(base.BaseTestCase):

    def setUp(self):
        super().setUp()
        if os.geteuid() != 0:
            self.skipTest('installs a sudoers rule and a user: root only')
        if not shutil.which('sudo') or not shutil.which('visudo'):
            self.skipTest('sudo is not installed')
        self.user = 'pbsudo' + uuid.uuid4().hex[:8]
        subprocess.run(['useradd', '--system', '--no-create-home',
                        self.user], check=True, capture_output=True)
        self.addCleanup(subprocess.run, ['userdel', self.user],
                        capture_output=True)
        pwd.getpwnam(self.user)
        # The shipped rule, for the test's user, naming the program that
        # exists in this venv (sudo -l answers only for existing commands).
        rule = self.useFixture(test_privsep_helper_sudo.SudoRule(
            self.user, '/etc/nova/nova.conf'))
        self.helper = rule.program
        self.assertEqual('prealloc-privsep-helper',
                         os.path.basename(self.helper))

    def allowed(self, argv):
        return subprocess.run(['sudo', '-l', '-U', self.user] + argv,
                              capture_output=True).returncode == 0

    def command(self):
        """What nova-compute runs with the documented helper_command."""
        ctx = prealloc_backend.privsep.ctx
        group = ctx.cfg_section
        self.addCleanup(cfg.CONF.clear_override, 'helper_command', group)
        cfg.CONF.set_override(
            'helper_command',
            'sudo %s --config-file /etc/nova/nova.conf' % self.helper, group)
        # oslo.privsep's tempfile.mkdtemp() in nova-compute, TMPDIR unset
        # (the test runner nests its own temporary directories).
        sockdir = tempfile.mkdtemp(dir='/tmp')
        self.addCleanup(os.rmdir, sockdir)
        argv = ctx.helper_command(os.path.join(sockdir, 'privsep.sock'))
        self.assertEqual('sudo', argv[0])
        return argv[1:]

    def test_rule_parses(self):
        subprocess.run(['visudo', '-cf', SUDOERS], check=True,
                       capture_output=True)

    def test_exact_command_allowed_everything_else_refused(self):
        argv = self.command()
        self.assertTrue(self.allowed(argv), shlex.join(argv))
        context = argv.index('--privsep_context') + 1
        refused = [
            argv + ['--config-file', '/tmp/evil.conf'],
            argv + ['--log-file', '/etc/shadow'],
            [argv[0], '--config-file', '/tmp/evil.conf'] + argv[3:],
            [argv[0], '--config-file', '/etc/nova/novaXconf'] + argv[3:],
            argv[:1] + argv[3:],
            argv[:context] + ['nova.privsep.sys_admin_pctxt'] +
            argv[context + 1:],
            argv[:-1] + ['/var/lib/nova/x/privsep.sock'],
            argv[:-1] + [argv[-1] + ' --config-file /tmp/evil.conf'],
        ]
        for other in refused:
            self.assertFalse(self.allowed(other), shlex.join(other))
