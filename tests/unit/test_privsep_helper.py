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

"""prealloc_backend.privsep_helper on real files, sockets and modes.

The "caller" is this test's own uid (what sudo's SUDO_UID names); a second
uid for ownership cases is used only when the test runs as root (chown).
The wrapper run as root through real sudo by a real user is in
tests/privileged/test_privsep_helper_sudo.py.
"""

import os
import socket
import struct
import subprocess
import sys

import fixtures
from oslotest import base

from prealloc_backend import privsep_helper as helper

OTHER_UID = 54321
OTHER_GID = 54321


class ChangeableByTestCase(base.BaseTestCase):

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        os.chmod(self.tmp, 0o755)
        self.uid, self.gids = OTHER_UID, frozenset([OTHER_GID])

    def need_root(self):
        if os.geteuid() != 0:
            self.skipTest('chown to another uid: root only')

    def path(self, name, mode=0o644, uid=None, directory=False, gid=None):
        path = os.path.join(self.tmp, name)
        if directory:
            os.mkdir(path)
        else:
            with open(path, 'w'):
                pass
        os.chmod(path, mode)
        if uid is not None or gid is not None:
            os.chown(path, -1 if uid is None else uid,
                     -1 if gid is None else gid)
        return path

    def changeable(self, path):
        return helper.changeable_by(path, self.uid, self.gids)

    def test_safe_file(self):
        self.need_root()
        self.assertIsNone(self.changeable(self.path('conf')))

    def test_owner(self):
        self.need_root()
        path = self.path('conf', uid=OTHER_UID)
        self.assertEqual('%s is owned by uid %d' % (path, OTHER_UID),
                         self.changeable(path))

    def test_group_writable(self):
        self.need_root()
        path = self.path('conf', mode=0o664, gid=OTHER_GID)
        self.assertEqual('%s is writable by group gid %d'
                         % (path, OTHER_GID), self.changeable(path))
        os.chmod(path, 0o644)
        self.assertIsNone(self.changeable(path))

    def test_other_writable(self):
        self.need_root()
        path = self.path('conf', mode=0o646)
        self.assertIn('writable by everyone', self.changeable(path))

    def test_directory_above_writable(self):
        self.need_root()
        directory = self.path('etc', mode=0o777, directory=True)
        path = os.path.join(directory, 'nova.conf')
        open(path, 'w').close()
        self.assertEqual('%s is writable by everyone' % directory,
                         self.changeable(path))

    def test_sticky_directory(self):
        # /tmp-like: the user may replace only its own entries.
        self.need_root()
        directory = self.path('tmp', mode=0o1777, directory=True)
        theirs = os.path.join(directory, 'theirs')
        mine = os.path.join(directory, 'mine')
        for path, uid in ((theirs, OTHER_UID), (mine, 0)):
            os.mkdir(path, 0o755)
            os.chown(path, uid, -1)
        self.assertIsNone(self.changeable(os.path.join(mine, 'x')))
        self.assertIn('%s is owned by uid %d' % (theirs, OTHER_UID),
                      self.changeable(os.path.join(theirs, 'x')))
        self.assertIn('may be created there',
                      self.changeable(os.path.join(directory, 'new')))

    def test_symlink_into_a_writable_directory(self):
        self.need_root()
        writable = self.path('log', uid=OTHER_UID, directory=True,
                             mode=0o755)
        target = os.path.join(writable, 'target')
        open(target, 'w').close()
        link = os.path.join(self.tmp, 'link')
        os.symlink(target, link)
        self.assertEqual('%s is owned by uid %d' % (writable, OTHER_UID),
                         self.changeable(link))

    def test_missing_path_counts_its_directory(self):
        self.need_root()
        directory = self.path('log', uid=OTHER_UID, directory=True,
                              mode=0o755)
        self.assertIn(directory, self.changeable(
            os.path.join(directory, 'a', 'b.log')))
        self.assertIsNone(self.changeable(
            os.path.join(self.tmp, 'missing', 'b.log')))

    def test_acl(self):
        self.need_root()
        path = self.path('conf', mode=0o640)
        # version 2; USER_OBJ rw, USER uid rw, GROUP_OBJ r, MASK rw,
        # OTHER none (what "setfacl -m u:UID:rw" writes)
        acl = struct.pack('<I', 2) + b''.join(
            struct.pack('<HHI', tag, perm, ident) for tag, perm, ident in (
                (0x01, 6, 0xffffffff), (0x02, 6, OTHER_UID),
                (0x04, 4, 0xffffffff), (0x10, 6, 0xffffffff),
                (0x20, 0, 0xffffffff)))
        try:
            os.setxattr(path, 'system.posix_acl_access', acl)
        except OSError as exc:
            self.skipTest('no POSIX ACLs here: %s' % exc)
        self.assertEqual('%s is an ACL lets uid %d write it'
                         % (path, OTHER_UID), self.changeable(path))

    def test_root_is_never_reported(self):
        path = self.path('conf', mode=0o666)
        self.assertIsNone(helper.changeable_by(path, 0, frozenset([0])))


class ArgsTestCase(base.BaseTestCase):

    GOOD = ['--config-file', '/etc/nova/nova.conf', '--privsep_context',
            helper.CONTEXT, '--privsep_sock_path', '/tmp/tmpx/privsep.sock']

    def test_good(self):
        self.assertEqual((['/etc/nova/nova.conf'], [],
                          '/tmp/tmpx/privsep.sock'),
                         helper.parse_args(self.GOOD))

    def test_refused(self):
        for argv, message in (
                (self.GOOD + ['--log-file', '/etc/shadow'],
                 "argument '--log-file' is not allowed"),
                (self.GOOD + ['--config-file'], '--config-file needs a value'),
                (self.GOOD[:2] + ['--privsep_context',
                                  'nova.privsep.sys_admin_pctxt'] +
                 self.GOOD[4:], '--privsep_context must be given once, as '
                 'prealloc_backend.privsep.ctx'),
                (self.GOOD[2:], 'at least one --config-file'),
                (self.GOOD[:4], '--privsep_sock_path must be given once'),
                (['--config-file', 'nova.conf'] + self.GOOD[2:],
                 "'nova.conf' is not an absolute path")):
            exc = self.assertRaises(helper.Refused, helper.parse_args, argv)
            self.assertIn(message, str(exc))


class SocketTestCase(base.BaseTestCase):
    """pin_socket on real sockets; the caller is this test's uid."""

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.uid = os.getuid()

    def sockdir(self, name='tmpabcdefgh', mode=0o700):
        path = os.path.join(self.tmp, name)
        os.mkdir(path)
        os.chmod(path, mode)
        return path

    def listen(self, path):
        listener = socket.socket(socket.AF_UNIX)
        self.addCleanup(listener.close)
        listener.bind(path)
        listener.listen(1)
        listener.setblocking(False)
        return listener

    def refused(self, sock_path, message):
        exc = self.assertRaises(helper.Refused, helper.pin_socket,
                                sock_path, self.uid)
        self.assertIn(message, str(exc))

    def test_pinned_socket_connects(self):
        directory = self.sockdir()
        listener = self.listen(os.path.join(directory, 'privsep.sock'))
        pinned = helper.pin_socket(os.path.join(directory, 'privsep.sock'),
                                   self.uid)
        self.assertTrue(pinned.startswith('/proc/self/fd/'))
        self.addCleanup(os.close, int(pinned.rsplit('/', 1)[1]))
        # Renaming the directory afterwards changes nothing.
        os.rename(directory, directory + '.moved')
        client = socket.socket(socket.AF_UNIX)
        self.addCleanup(client.close)
        client.connect(pinned)
        conn, _ = listener.accept()
        conn.close()

    def test_socket_symlink(self):
        directory = self.sockdir()
        other = self.sockdir('other')
        self.listen(os.path.join(other, 'real.sock'))
        os.symlink(os.path.join(other, 'real.sock'),
                   os.path.join(directory, 'privsep.sock'))
        self.refused(os.path.join(directory, 'privsep.sock'),
                     'must be a socket bound by the caller')

    def test_directory_symlink(self):
        other = self.sockdir('other')
        self.listen(os.path.join(other, 'privsep.sock'))
        link = os.path.join(self.tmp, 'tmplinkxxx')
        os.symlink(other, link)
        self.refused(os.path.join(link, 'privsep.sock'),
                     'its directory is a symlink')

    def test_directory_missing(self):
        self.refused(os.path.join(self.tmp, 'gone', 'privsep.sock'),
                     'its directory does not exist')

    def test_directory_is_a_file(self):
        path = os.path.join(self.tmp, 'file')
        open(path, 'w').close()
        self.refused(os.path.join(path, 'privsep.sock'),
                     'its directory is not a directory')

    def test_directory_mode(self):
        directory = self.sockdir(mode=0o755)
        self.listen(os.path.join(directory, 'privsep.sock'))
        self.refused(os.path.join(directory, 'privsep.sock'),
                     'with mode 0700, not by')

    def test_directory_owner(self):
        if os.geteuid() != 0:
            self.skipTest('chown to another uid: root only')
        directory = self.sockdir()
        self.listen(os.path.join(directory, 'privsep.sock'))
        os.chown(directory, OTHER_UID, -1)
        self.refused(os.path.join(directory, 'privsep.sock'),
                     'not by uid %d' % OTHER_UID)

    def test_not_fresh(self):
        directory = self.sockdir()
        self.listen(os.path.join(directory, 'privsep.sock'))
        open(os.path.join(directory, 'other'), 'w').close()
        self.refused(os.path.join(directory, 'privsep.sock'),
                     "must hold only privsep.sock")

    def test_not_a_socket(self):
        directory = self.sockdir()
        open(os.path.join(directory, 'privsep.sock'), 'w').close()
        self.refused(os.path.join(directory, 'privsep.sock'),
                     'not a file of')

    def test_other_name(self):
        directory = self.sockdir()
        self.refused(os.path.join(directory, 'other.sock'),
                     'the socket must be named privsep.sock')


class PrepareTestCase(base.BaseTestCase):

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.conf = os.path.join(self.tmp, 'nova.conf')
        open(self.conf, 'w').close()
        directory = os.path.join(self.tmp, 'tmpabcdefgh')
        os.mkdir(directory, 0o700)
        self.sock_path = os.path.join(directory, 'privsep.sock')
        listener = socket.socket(socket.AF_UNIX)
        self.addCleanup(listener.close)
        listener.bind(self.sock_path)
        self.argv = ['--config-file', self.conf, '--privsep_context',
                     helper.CONTEXT, '--privsep_sock_path', self.sock_path]
        self.useFixture(fixtures.MonkeyPatch('os.chdir', lambda path: None))

    def test_environment_emptied(self):
        environ = {'HOME': '/home/nova', 'OS_DEFAULT__LOG_FILE': '/x',
                   'SUDO_UID': str(os.getuid()), 'TMPDIR': '/var/tmp'}
        args = helper.prepare(self.argv, environ)
        self.addCleanup(os.close, int(args[-1].rsplit('/', 1)[1]))
        self.assertEqual(['--config-file', self.conf, '--privsep_context',
                          helper.CONTEXT, '--privsep_sock_path'], args[:-1])
        self.assertEqual({'PATH', 'HOME', 'LC_ALL', 'USER', 'LOGNAME'},
                         set(environ))
        self.assertNotEqual('/home/nova', environ['HOME'])

    def test_python_variables_refused(self):
        environ = {'PYTHONPATH': '/home/nova/lib',
                   'SUDO_UID': str(os.getuid())}
        exc = self.assertRaises(helper.Refused, helper.check_interpreter,
                                environ, OTHER_UID, frozenset([OTHER_GID]))
        self.assertIn('sudo passed PYTHONPATH', str(exc))
        # Root started it itself: its own environment.
        self.assertIsNone(helper.check_interpreter(environ, 0,
                                                   frozenset([0])))

    def test_configuration_of_the_caller_refused(self):
        if os.geteuid() != 0:
            self.skipTest('chown to another uid: root only')
        os.chown(self.conf, OTHER_UID, -1)
        exc = self.assertRaises(helper.Refused, helper.check_config,
                                [self.conf], [], OTHER_UID,
                                frozenset([OTHER_GID]))
        self.assertIn('configuration %s can be changed by the caller: %s '
                      'is owned by uid %d' % (self.conf, self.conf,
                                              OTHER_UID), str(exc))
        self.assertIsNone(helper.check_config([self.conf], [], 1,
                                              frozenset([1])))


class LogOverridesTestCase(base.BaseTestCase):

    def test_root_configuration_names_no_log_file(self):
        from oslo_config import cfg
        from oslo_log import log as logging

        tmp = self.useFixture(fixtures.TempDir()).path
        conf_path = os.path.join(tmp, 'nova.conf')
        with open(conf_path, 'w') as f:
            f.write('[DEFAULT]\nlog_dir = %s\nlog_file = x.log\n'
                    'log_config_append = %s/logging.conf\n' % (tmp, tmp))
        conf = cfg.ConfigOpts()
        helper.log_overrides(conf)
        # helper_main registers the options again and parses argv.
        logging.register_options(conf)
        conf(['--config-file', conf_path, '--log-dir', tmp], project='privsep',
             default_config_files=[])
        self.assertIsNone(conf.log_config_append)
        # oslo.log's own choice of the file (none: stderr only)
        self.assertIsNone(logging._get_log_file_path(conf, 'privsep-helper'))
        self.assertTrue(conf.use_stderr)


class ImportTestCase(base.BaseTestCase):

    def test_only_the_standard_library_runs_before_the_checks(self):
        # What root runs before prepare(): importing the module, in a fresh
        # interpreter as the console script does (what the interpreter loads
        # at start-up, .pth files included, is not the module's).
        code = ('import sys; before = set(sys.modules); '
                'import prealloc_backend.privsep_helper; '
                'print("\\n".join(sorted(set(sys.modules) - before)))')
        out = subprocess.run([sys.executable, '-c', code], check=True,
                             capture_output=True, text=True).stdout.split()
        self.assertIn('prealloc_backend.privsep_helper', out)
        stdlib = set(sys.stdlib_module_names)
        foreign = [name for name in out
                   if name.split('.')[0] not in stdlib and
                   name not in ('prealloc_backend',
                                'prealloc_backend.privsep_helper')]
        self.assertEqual([], foreign)
