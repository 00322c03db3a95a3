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

"""The nova user against the daemon's start through sudo.

Real sudo with the shipped rule (etc/prealloc_backend.sudoers, its user,
command path and configuration file replaced by the test's, checked with
``visudo -cf``, installed in /etc/sudoers.d for the test and removed after),
a real unprivileged user made for the test (useradd, removed after) who
owns the log directory and its home, and root's files made for the purpose
in a 0700 directory of root's. The attacker's moves run in processes of
that user (the system python3, stdlib only) and end with the very command
nova-compute runs, through ``sudo -n``:

- a symlink planted where root's log_dir puts the helper's log file;
- a socket path that is a symlink, or in a directory that is one;
- HOME kept by sudo (a site's ``env_keep``) with a
  ~/.privsep/privsep.conf.d/*.conf whose log_config_append root would
  evaluate (logging.fileConfig).

Each asserts root's files unchanged, nothing created, no connection to
root's socket. Run against the rule shipped before prealloc-privsep-helper
existed (privsep-helper itself) each of them failed.
"""

import json
import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import uuid

import fixtures
from oslotest import base

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SUDOERS = os.path.join(ROOT, 'etc', 'prealloc_backend.sudoers')
BIN = os.path.dirname(sys.executable)
ATTACKER_PYTHON = '/usr/bin/python3'
VICTIM_CONTENT = b'root only\n'
CONTEXT = 'prealloc_backend.privsep.ctx'

# The attacker's moves: prepare the socket as asked, then run nova-compute's
# command through sudo; print what happened as JSON.
ATTACKER = r'''
import json, os, socket, subprocess, sys, tempfile
spec = json.loads(sys.argv[1])
listener = None
if spec['socket'] == 'none':
    sockdir = tempfile.mkdtemp(dir='/tmp')
elif spec['socket'] == 'own':
    sockdir = tempfile.mkdtemp(dir='/tmp')
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(os.path.join(sockdir, 'privsep.sock'))
    listener.listen(1)
elif spec['socket'] == 'symlink':
    sockdir = tempfile.mkdtemp(dir='/tmp')
    os.symlink(spec['target'], os.path.join(sockdir, 'privsep.sock'))
elif spec['socket'] == 'dir-symlink':
    name = tempfile.mktemp(dir='/tmp')
    os.symlink(spec['target'], name)
    sockdir = name
for link, target in spec.get('links', {}).items():
    os.symlink(target, link)
for path, text in spec.get('files', {}).items():
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.write(text)
cmd = spec['command'] + ['--privsep_context', spec['context'],
                         '--privsep_sock_path',
                         os.path.join(sockdir, 'privsep.sock')]
# Output to a file: the daemon (a child of the helper) keeps it open.
with tempfile.TemporaryFile() as out:
    proc = subprocess.run(['sudo', '-n'] + cmd, stdout=out, stderr=out,
                          env=spec['env'], timeout=300)
    out.seek(0)
    output = out.read().decode(errors='replace')
served = None
if listener is not None:
    listener.settimeout(0)
    try:
        conn, _ = listener.accept()
        served = True
        conn.close()
    except BlockingIOError:
        served = False
print(json.dumps({'rc': proc.returncode, 'output': output,
                  'served': served}))
'''


class SudoRule(fixtures.Fixture):
    """The shipped sudoers file, for ``user``, its command naming this
    venv's program of the same name and its configuration file
    ``conf_path``; ``extra``: more sudoers lines (a site's Defaults);
    ``keep_defaults``: False drops the file's Defaults lines.
    """

    def __init__(self, user, conf_path, extra='', keep_defaults=True):
        super().__init__()
        self.user = user
        self.conf_path = conf_path
        self.extra = extra
        self.keep_defaults = keep_defaults

    def _setUp(self):
        with open(SUDOERS) as f:
            text = f.read()
        lines = [line for line in text.splitlines()
                 if line and not line.startswith('#')]
        if not self.keep_defaults:
            lines = [line for line in lines
                     if not line.startswith('Defaults')]
        text = '\n'.join(lines) + '\n' + self.extra + '\n'
        program = re.search(r'(/usr/bin/\S+)', text).group(1)
        self.program = os.path.join(BIN, os.path.basename(program))
        text = text.replace(program, self.program)
        text = text.replace('/etc/nova/nova[.]conf',
                            self.conf_path.replace('.', '[.]'))
        text = re.sub(r'^nova ALL', self.user + ' ALL', text, flags=re.M)
        # sudoers aliases are global: one per test user.
        text = text.replace('PREALLOC_PRIVSEP',
                            'PREALLOC_PRIVSEP_' + self.user.upper())
        self.path = '/etc/sudoers.d/prealloc-test-' + self.user
        staged = self.path + '.new'
        with open(staged, 'w') as f:
            f.write(text)
        os.chmod(staged, 0o440)
        check = subprocess.run(['visudo', '-cf', staged],
                               capture_output=True, text=True)
        if check.returncode:
            os.unlink(staged)
            raise AssertionError('visudo refuses the rule: %s%s'
                                 % (check.stdout, check.stderr))
        os.rename(staged, self.path)
        self.addCleanup(os.unlink, self.path)
        self.text = text


class SudoAttackTestCase(base.BaseTestCase):

    def setUp(self):
        super().setUp()
        if os.geteuid() != 0:
            self.skipTest('installs a sudoers rule and a user: root only')
        for tool in ('sudo', 'visudo'):
            if not shutil.which(tool):
                self.skipTest('%s is not installed' % tool)
        # Root's directory the attacker cannot enter; the test's files in
        # it; the attacker's directories beside it (open for traversal).
        self.scratch = tempfile.mkdtemp(prefix='pbsudo', dir='/tmp')
        self.addCleanup(shutil.rmtree, self.scratch, ignore_errors=True)
        os.chmod(self.scratch, 0o755)
        self.secret = os.path.join(self.scratch, 'secret')
        os.mkdir(self.secret, 0o700)
        self.victim = os.path.join(self.secret, 'victim')
        with open(self.victim, 'wb') as f:
            f.write(VICTIM_CONTENT)
        os.chmod(self.victim, 0o600)
        self.created = os.path.join(self.secret, 'created-by-root')
        self.marker = os.path.join(self.secret, 'attacker-code-ran')
        self.user = 'pbsudo' + uuid.uuid4().hex[:8]
        self.home = os.path.join(self.scratch, 'home')
        subprocess.run(['useradd', '--system', '--create-home',
                        '--home-dir', self.home, '--shell',
                        '/usr/sbin/nologin', self.user], check=True,
                       capture_output=True)
        self.addCleanup(subprocess.run, ['userdel', self.user],
                        capture_output=True)
        entry = pwd.getpwnam(self.user)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid
        # Like Ubuntu's /var/log/nova (nova:adm) or kolla's: the nova
        # user's log directory, named by root's nova.conf.
        self.log_dir = os.path.join(self.scratch, 'log')
        os.mkdir(self.log_dir)
        os.chown(self.log_dir, self.uid, self.gid)
        self.instances = os.path.join(self.scratch, 'instances')
        os.mkdir(self.instances)
        os.chown(self.instances, self.uid, self.gid)
        # root's nova.conf, in a directory of root's
        self.etc = os.path.join(self.scratch, 'etc')
        os.mkdir(self.etc)
        self.conf_path = os.path.join(self.etc, 'nova.conf')
        with open(self.conf_path, 'w') as f:
            f.write('[DEFAULT]\ninstances_path = %s\nlog_dir = %s\n'
                    % (self.instances, self.log_dir))

    def root_files_untouched(self):
        with open(self.victim, 'rb') as f:
            self.assertEqual(VICTIM_CONTENT, f.read())
        st = os.stat(self.victim)
        self.assertEqual((0, 0o600), (st.st_uid, stat.S_IMODE(st.st_mode)))
        self.assertFalse(os.path.lexists(self.created),
                         'root created %s' % self.created)
        self.assertFalse(os.path.lexists(self.marker),
                         "root ran the attacker's code")

    def rule(self, **kwargs):
        return self.useFixture(SudoRule(self.user, self.conf_path,
                                        **kwargs))

    def attack(self, rule, socket_kind, home=None, **spec):
        """Run the attacker's moves and nova-compute's command."""
        spec.update(
            socket=socket_kind, context=CONTEXT,
            command=[rule.program, '--config-file', self.conf_path],
            env={'PATH': '/usr/bin:/bin', 'HOME': home or self.home,
                 'OS_DEFAULT__LOG_FILE': self.victim})
        proc = subprocess.run(
            [ATTACKER_PYTHON, '-c', ATTACKER, json.dumps(spec)],
            user=self.uid, group=self.gid, extra_groups=[], cwd='/',
            capture_output=True, text=True, timeout=600)
        self.assertEqual(0, proc.returncode, proc.stderr)
        outcome = json.loads(proc.stdout)
        # sudo ran the command (its own errors start with "sudo:")
        self.assertNotIn('sudo:', outcome['output'])
        return outcome

    def log_links(self, target):
        """The helper's log file (oslo.log: <log_dir>/<program>.log) of
        either program, as a symlink to ``target``.
        """
        return {os.path.join(self.log_dir, name): target
                for name in ('privsep-helper.log',
                             'prealloc-privsep-helper.log')}


class TestLogSymlink(SudoAttackTestCase):

    def test_connect_fails(self):
        # No socket: the helper fails and (privsep-helper) logs the
        # traceback to its log file.
        rule = self.rule()
        outcome = self.attack(rule, 'none', links=self.log_links(
            self.victim))
        self.root_files_untouched()
        self.assertNotEqual(0, outcome['rc'], outcome)

    def test_daemon_starts(self):
        # A real socket of the attacker's: the helper gets as far as the
        # daemon (it connects and forks) with root's log_dir in force.
        # (The log file is opened, and so created, before the connect.)
        rule = self.rule()
        outcome = self.attack(rule, 'own', links=self.log_links(
            self.created))
        self.root_files_untouched()
        self.assertEqual(0, outcome['rc'], outcome)
        self.assertTrue(outcome['served'], outcome)


class TestSocketSymlink(SudoAttackTestCase):

    def root_socket(self, name):
        path = os.path.join(self.secret, name)
        listener = socket.socket(socket.AF_UNIX)
        self.addCleanup(listener.close)
        listener.bind(path)
        listener.listen(1)
        listener.setblocking(False)
        return listener, path

    def assert_no_connection(self, listener):
        # The helper has exited: had it connected, the connection would
        # be waiting in the backlog.
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return
        conn.close()
        self.fail('root connected to its own socket for the attacker')

    def test_socket_is_symlink(self):
        listener, path = self.root_socket('root.sock')
        rule = self.rule()
        outcome = self.attack(rule, 'symlink', target=path)
        self.assert_no_connection(listener)
        self.root_files_untouched()
        self.assertIn('refused', outcome['output'])

    def test_directory_is_symlink(self):
        listener, _path = self.root_socket('privsep.sock')
        rule = self.rule()
        outcome = self.attack(rule, 'dir-symlink', target=self.secret)
        self.assert_no_connection(listener)
        self.root_files_untouched()
        self.assertIn('refused', outcome['output'])


class TestHomeKept(SudoAttackTestCase):
    """A site's sudoers keeps HOME for the nova user."""

    def moves(self):
        logging_conf = os.path.join(self.home, 'logging.conf')
        code = ("__import__('os').close(__import__('os').open(%r, 0o101))"
                % self.marker)
        return {
            os.path.join(self.home, '.privsep', 'privsep.conf.d',
                         'x.conf'):
                '[DEFAULT]\nlog_config_append = %s\n' % logging_conf,
            logging_conf: (
                '[loggers]\nkeys = root\n[handlers]\nkeys = h\n'
                '[formatters]\nkeys =\n[logger_root]\nhandlers = h\n'
                '[handler_h]\nclass = StreamHandler\n'
                'args = (%s or __import__("sys").stderr,)\n' % code),
        }

    def check(self, **rule_kwargs):
        rule = self.rule(extra='Defaults:%s env_keep += "HOME"' % self.user,
                         **rule_kwargs)
        for socket_kind in ('none', 'own'):
            self.attack(rule, socket_kind, files=self.moves())
            self.root_files_untouched()

    def test_home_kept(self):
        self.check()

    def test_home_kept_without_the_rules_defaults(self):
        # The helper itself ignores HOME, should a site drop the rule's
        # Defaults line.
        self.check(keep_defaults=False)
