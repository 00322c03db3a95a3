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

"""checks/owner.py without root: who controls a path, the forked step.

Dropping to another user needs root: tests/privileged/test_root_scratch.py
runs it with a real unprivileged user.
"""

import os
import signal
import stat
import time

import fixtures
from oslotest import base

from prealloc_backend.checks import owner


def fake_stat(mode, uid=0):
    return os.stat_result((mode, 0, 0, 2, uid, 0, 0, 0, 0, 0))


def _where(fd, name):
    return {'cwd': os.getcwd(), 'name': name, 'uid': os.getuid(),
            'exists': os.path.exists(name)}


def _raise(fd):
    raise PermissionError(13, 'Permission denied', 'somewhere')


class WritableTestCase(base.BaseTestCase):

    def test_writable_by_others(self):
        for mode, expected in ((0o755, False), (0o700, False),
                               (0o775, True), (0o757, True),
                               (0o1777, False), (0o1775, False)):
            self.assertEqual(expected, owner.writable_by_others(
                fake_stat(stat.S_IFDIR | mode)), oct(mode))


class ControlTestCase(base.BaseTestCase):

    def setUp(self):
        super().setUp()
        self.tmp = os.path.realpath(self.useFixture(fixtures.TempDir()).path)

    def mkdir(self, *parts, mode=0o755):
        path = os.path.join(self.tmp, *parts)
        os.mkdir(path)
        os.chmod(path, mode)
        return path

    def test_shared_directory_on_the_way(self):
        shared = self.mkdir('shared', mode=0o777)
        inner = self.mkdir('shared', 'inner')
        found = owner.control(inner)
        self.assertEqual([(shared, 'mode 0777')], found.shared)
        self.assertFalse(found.root_only)
        self.assertIn('%s may be written by its group or by others (mode '
                      '0777)' % shared, found.describe())

    def test_sticky_directory_is_not_shared(self):
        self.mkdir('sticky', mode=0o1777)
        inner = self.mkdir('sticky', 'inner')
        self.assertEqual([], owner.control(inner).shared)

    def test_symlinks_are_followed_as_the_kernel_does(self):
        # A path through a symlink is controlled by what the link leads
        # through too: here a shared directory the path does not name.
        shared = self.mkdir('shared', mode=0o777)
        self.mkdir('shared', 'inner')
        os.symlink('shared/inner', os.path.join(self.tmp, 'relative'))
        os.symlink(os.path.join(self.tmp, 'relative'),
                   os.path.join(self.tmp, 'absolute'))
        for name in ('relative', 'absolute'):
            found = owner.control(os.path.join(self.tmp, name, '.', 'x',
                                               '..'))
            self.assertEqual([(shared, 'mode 0777')], found.shared, name)

    def test_symlink_loop(self):
        os.symlink('loop', os.path.join(self.tmp, 'loop'))
        exc = self.assertRaises(OSError, owner.control,
                                os.path.join(self.tmp, 'loop'))
        self.assertIn('too many symlinks', str(exc))

    def test_owners_are_listed(self):
        inner = self.mkdir('inner')
        found = owner.control(inner)
        uid = os.geteuid()
        if uid == 0:
            self.assertEqual({}, found.users)
            self.assertTrue(found.root_only)
        else:
            self.assertEqual(uid, min(found.users))
            self.assertIn('is owned by %s' % owner.user_name(uid),
                          found.describe())

    def test_unprivileged_caller_keeps_its_credentials(self):
        inner = self.mkdir('shared', mode=0o777)
        fd = owner.open_directory(inner)
        self.addCleanup(os.close, fd)
        self.assertIsNone(owner.credentials_for(fd, inner, euid=1000))

    def test_refusal_only_for_root(self):
        if os.geteuid() == 0:
            self.skipTest('the unprivileged caller is tested here')
        self.assertIsNone(owner.refusal_as_root(self.tmp, 'cmd'))


def _stop(fd):
    os.kill(os.getpid(), signal.SIGSTOP)


class RunInTestCase(base.BaseTestCase):

    def setUp(self):
        super().setUp()
        self.tmp = os.path.realpath(self.useFixture(fixtures.TempDir()).path)
        self.fd = owner.open_directory(self.tmp)
        self.addCleanup(os.close, self.fd)

    def test_step_works_in_the_directory_held_open(self):
        open(os.path.join(self.tmp, 'here'), 'w').close()
        # The name is moved away after the open: the step still works in
        # the directory it was given.
        moved = self.tmp + '.moved'
        os.rename(self.tmp, moved)
        self.addCleanup(os.rename, moved, self.tmp)
        got = owner.run_in(self.fd, self.tmp, _where, 'here', deadline=60,
                           what='the test step')
        self.assertEqual({'cwd': moved, 'name': 'here',
                          'uid': os.getuid(), 'exists': True}, got)
        # The caller's own working directory is not changed.
        self.assertNotEqual(moved, os.getcwd())

    def test_step_error_comes_back_typed(self):
        exc = self.assertRaises(owner.StepFailed, owner.run_in, self.fd,
                                self.tmp, _raise, deadline=60,
                                what='the test step')
        self.assertEqual('PermissionError', exc.kind)
        self.assertIn('Permission denied', exc.message)
        # Who the step ran as (here: the caller itself), for the check's
        # advice.
        self.assertEqual(owner.user_name(os.geteuid()), exc.user)

    def test_step_answer_must_be_json(self):
        exc = self.assertRaises(owner.StepFailed, owner.run_in, self.fd,
                                self.tmp, lambda fd: object(),
                                deadline=60, what='the test step')
        self.assertEqual('TypeError', exc.kind)

    def test_stopped_step_times_out_naming_it(self):
        started = time.monotonic()
        exc = self.assertRaises(owner.StepTimedOut, owner.run_in, self.fd,
                                self.tmp, _stop, deadline=1,
                                what='the test step')
        self.assertLess(time.monotonic() - started, 10)
        self.assertEqual('Timeout', exc.kind)
        self.assertIn('the test step in %s, run as %s, did not end within '
                      'its deadline of 1 s' % (self.tmp, exc.user),
                      exc.message)
        # A StepFailed: the check's callers report it as a failed step.
        self.assertIsInstance(exc, owner.StepFailed)


class VanishingPathTestCase(base.BaseTestCase):

    def test_path_changing_under_the_walk_is_refused(self):
        tmp = self.useFixture(fixtures.TempDir()).path
        fd = owner.open_directory(tmp)
        self.addCleanup(os.close, fd)
        gone = os.path.join(tmp, 'gone')
        exc = self.assertRaises(owner.UnsafeDirectory,
                                owner.credentials_for, fd, gone, euid=0)
        self.assertIn('cannot tell who controls %s' % gone, str(exc))
