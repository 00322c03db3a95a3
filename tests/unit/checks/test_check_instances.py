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

"""The instances_path checks (checks/instances.py) on real directories.

Each refusal is compared with what the daemon's own ``pinned_root`` does
with the same instances_path (run in-process as in the daemon:
``in_daemon`` true), so the check and the daemon cannot drift apart. Root
only where a directory is given to another user (chown).
"""

import os

import fixtures

from prealloc_backend.checks import instances
from prealloc_backend.checks import result
from prealloc_backend import exception
import prealloc_backend.privsep.fs
from tests import base

Code = result.Code
NOVA_UID = 54321


class PinBase(base.CheckTestCase):

    def setUp(self):
        super().setUp()
        self.sections = self.nova_conf()
        # state_path: root's here, so it names no nova user unless a test
        # gives it one.
        self.sections['DEFAULT']['state_path'] = self.tmp

    def nova_dir(self, path):
        if os.geteuid() != 0:
            self.skipTest('chown to the nova user: root only')
        if not os.path.isdir(path):
            os.mkdir(path)
        os.chown(path, NOVA_UID, NOVA_UID)
        return path

    def host(self, instances_path, nova_user=None):
        self.sections['DEFAULT']['instances_path'] = instances_path
        host = self.check_host(self.sections)
        host.nova_user = nova_user
        return host

    def daemon_refuses(self, host):
        """What the daemon's pinned_root does with host's instances_path:
        the refusal's reason, or None when it pins it.
        """
        fs = prealloc_backend.privsep.fs
        self.useFixture(fixtures.MockPatchObject(fs, 'in_daemon',
                                                 return_value=True))
        self.useFixture(fixtures.MockPatchObject(fs, '_root', None))
        try:
            fs.pinned_root()
        except exception.InstancesPathUnusable as exc:
            return exc.kwargs['reason']
        finally:
            if fs._root is not None:
                fs._root.close()
        return None

    def assert_refused(self, instances_path, rule, code=Code.FAILURE):
        host = self.host(instances_path)
        res = instances.check_pin(host)
        self.assertEqual(code, res.code, res.details)
        self.assertIn('The privileged daemon refuses [DEFAULT] '
                      'instances_path %r: ' % instances_path, res.details)
        self.assertIn(rule, res.details)
        self.assertFalse(res.facts['pinned'])
        # The very refusal the daemon makes.
        reason = self.daemon_refuses(host)
        self.assertIsNotNone(reason)
        self.assertEqual(reason, res.facts['refusal'])
        self.assertIn(reason, res.details)
        return res


class PinCheckTestCase(PinBase):

    def test_symlink(self):
        self.nova_dir(self.instances)
        link = os.path.join(self.tmp, 'link')
        os.symlink(self.instances, link)
        res = self.assert_refused(link, 'symlink')
        self.assertIn('no symlink in any component', res.fix)

    def test_symlink_in_a_parent(self):
        self.nova_dir(self.instances)
        os.symlink(self.tmp, os.path.join(self.tmp, 'up'))
        self.assert_refused(os.path.join(self.tmp, 'up', 'instances'),
                            'symlink')

    def test_root_owned_directory(self):
        if os.geteuid() != 0:
            self.skipTest('a root-owned directory: root only')
        res = self.assert_refused(self.instances, 'it is owned by root')
        self.assertIn('chown nova: %s' % self.instances, res.fix)

    def test_relative_path(self):
        self.assert_refused('instances', 'it is not an absolute path')

    def test_regular_file(self):
        path = os.path.join(self.tmp, 'file')
        open(path, 'w').close()
        self.assert_refused(path, 'it is not a directory')

    def test_root_directory(self):
        self.assert_refused('/', 'it is the root directory /')

    def test_missing_is_a_warning(self):
        # nova-compute creates it (as the nova user) before it calls the
        # daemon, which pins it then.
        res = self.assert_refused(os.path.join(self.tmp, 'none'),
                                  'it does not exist', code=Code.WARNING)
        self.assertIn('creates it at the first spawn', res.details)

    def test_nova_users_directory_is_pinned(self):
        self.nova_dir(self.instances)
        host = self.host(self.instances)
        res = instances.check_pin(host)
        self.assertEqual(Code.SUCCESS, res.code, res.details)
        self.assertIsNone(self.daemon_refuses(host))
        self.assertEqual(NOVA_UID, res.facts['nova_uid'])
        self.assertIn('from the owner of instances_path %s (no symlink '
                      'followed)' % self.instances, res.details)

    def test_nova_user_option_must_own_it(self):
        self.nova_dir(self.instances)
        res = instances.check_pin(self.host(self.instances, 'nobody'))
        self.assertEqual(Code.FAILURE, res.code, res.details)
        self.assertIn('is owned by uid %d, not by the nova user nobody'
                      % NOVA_UID, res.details)

    def test_unknown_nova_user_option(self):
        self.nova_dir(self.instances)
        res = instances.check_pin(self.host(self.instances,
                                            'no-such-user-pb'))
        self.assertEqual(Code.FAILURE, res.code, res.details)
        self.assertIn('--nova-user no-such-user-pb: no such user',
                      res.details)

    def test_nova_user_from_state_path_when_refused(self):
        state = self.nova_dir(os.path.join(self.tmp, 'state'))
        self.sections['DEFAULT']['state_path'] = state
        link = os.path.join(self.tmp, 'link')
        os.symlink(self.tmp, link)
        res = instances.check_pin(self.host(link))
        self.assertEqual(Code.FAILURE, res.code, res.details)
        self.assertIn('The nova user is uid %d, from the owner of '
                      'state_path %s' % (NOVA_UID, state), res.details)

    def test_state_path_through_a_symlink_names_nobody(self):
        state = self.nova_dir(os.path.join(self.tmp, 'state'))
        link = os.path.join(self.tmp, 'state-link')
        os.symlink(state, link)
        self.sections['DEFAULT']['state_path'] = link
        if os.geteuid() != 0:
            self.skipTest('a root-owned directory: root only')
        host = self.host(self.instances)
        self.assertRaises(instances.NovaUserUnknown, instances.nova_user,
                          host)

    def test_nova_user_unknown(self):
        if os.geteuid() != 0:
            self.skipTest('a root-owned directory: root only')
        host = self.host(self.instances)
        exc = self.assertRaises(instances.NovaUserUnknown,
                                instances.nova_user, host)
        self.assertIn('cannot tell who the nova user is', str(exc))
        res = instances.check_pin(host)
        self.assertIn('Nor does state_path %r tell who the nova user is'
                      % self.tmp, res.details)


class PinAgainTestCase(PinBase):
    """The pin looked at again after the other checks."""

    def test_unchanged(self):
        self.nova_dir(self.instances)
        host = self.host(self.instances)
        self.assertEqual(Code.SUCCESS, instances.check_pin(host).code)
        res = instances.check_pin_again(host)
        self.assertEqual(Code.SUCCESS, res.code, res.details)
        self.assertIn('is the directory the first check pinned',
                      res.details)

    def _swap_to(self, make):
        self.nova_dir(self.instances)
        host = self.host(self.instances)
        self.assertEqual(Code.SUCCESS, instances.check_pin(host).code)
        os.rename(self.instances, self.instances + '.away')
        make(self.instances)
        return host, instances.check_pin_again(host)

    def test_swapped_for_a_symlink(self):
        root_dir = os.path.join(self.tmp, 'roots')
        os.mkdir(root_dir)
        host, res = self._swap_to(lambda path: os.symlink(root_dir, path))
        self.assertEqual(Code.FAILURE, res.code, res.details)
        self.assertIn('symlink', res.details)
        self.assertIn('It changed while the check ran (at the start: a '
                      'directory of uid %d)' % NOVA_UID, res.details)
        self.assertIsNotNone(self.daemon_refuses(host))

    def test_swapped_for_a_root_directory(self):
        host, res = self._swap_to(os.mkdir)
        self.assertEqual(Code.FAILURE, res.code, res.details)
        self.assertIn('it is owned by root', res.details)
        self.assertIsNotNone(self.daemon_refuses(host))

    def test_swapped_for_a_file(self):
        host, res = self._swap_to(lambda path: open(path, 'w').close())
        self.assertEqual(Code.FAILURE, res.code, res.details)
        self.assertIn('it is not a directory', res.details)

    def test_swapped_for_another_nova_directory(self):
        host, res = self._swap_to(self.nova_dir)
        self.assertEqual(Code.WARNING, res.code, res.details)
        self.assertIn('It changed while the check ran', res.details)
        self.assertIsNone(self.daemon_refuses(host))

    def test_repaired_during_the_check(self):
        # Refused at the start, pinned at the end: the end's verdict is
        # what the daemon does next.
        link = os.path.join(self.tmp, 'link')
        os.symlink(self.instances, link)
        host = self.host(link)
        self.assertEqual(Code.FAILURE, instances.check_pin(host).code)
        os.unlink(link)
        self.nova_dir(link)
        res = instances.check_pin_again(host)
        self.assertEqual(Code.WARNING, res.code, res.details)
        self.assertIn('at the start: refused, it, or a directory above it, '
                      'is a symlink', res.details)
        self.assertIsNone(self.daemon_refuses(host))


class OrderTestCase(base.CheckTestCase):

    def test_pin_checked_before_the_probes_and_again_last(self):
        from prealloc_backend import checks

        names = [name for name, _func in checks.CHECKS]
        self.assertLess(names.index('Instances path'),
                        names.index('Instances filesystem'))
        self.assertEqual('Instances path, at the end', names[-1])
