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

"""Finding what interrupted adoptions left, the host's adopt lock, and the
task states they left.

Real files and a real flock; libvirt's connection and nova's instance list
are fakes (this tier has neither libvirtd nor nova's services). nova-compute's
start recovering for real: tests/functional/real/test_adopt.py.
"""

import json
import os
import subprocess
import sys
from unittest import mock

import fixtures

from prealloc_backend.adoption import live
from prealloc_backend.adoption import recovery
from prealloc_backend import exception
from tests import base


class NoDomain(Exception):
    def get_error_code(self):
        return recovery.VIR_ERR_NO_DOMAIN


class ConnectionLost(Exception):
    def get_error_code(self):
        return 38   # VIR_ERR_SYSTEM_ERROR


class Conn:
    def __init__(self, domains):
        self.domains = domains

    def lookupByUUIDString(self, uuid):
        if uuid not in self.domains:
            raise NoDomain(uuid)
        return self.domains[uuid]


class Instance:
    def __init__(self, uuid, task_state):
        self.uuid = uuid
        self.task_state = task_state
        self.saved = []

    def save(self, expected_task_state=None):
        self.saved.append((self.task_state, expected_task_state))


class TestRecovery(base.TestCase):

    def setUp(self):
        super().setUp()
        self.top = self.useFixture(fixtures.TempDir()).path

    def disk(self, uuid, name='disk'):
        os.makedirs(os.path.join(self.top, uuid), exist_ok=True)
        path = os.path.join(self.top, uuid, name)
        with open(path, 'w') as f:
            f.write('guest')
        return path

    def test_leftovers_found_per_instance(self):
        a = self.disk('a')
        with open(a + live.NEW_SUFFIX, 'w'):
            pass
        b = self.disk('b', 'disk.local')
        with open(live.journal_path(b), 'w'):
            pass
        self.disk('c')
        d = self.disk('d')
        with open(live.journal_path(d) + '.tmp', 'w'):
            pass
        self.assertEqual([a, b, d], recovery.leftovers(self.top))
        self.assertEqual([b], recovery.leftovers(self.top, 'b'))
        self.assertEqual([], recovery.leftovers(self.top, 'c'))

    def test_one_adopt_per_host(self):
        # nova-compute's start never creates the lock: no adopt ran.
        self.assertIsNone(recovery.host_lock(self.top, 'h1', create=False))
        fd = recovery.host_lock(self.top, 'h1')
        self.addCleanup(os.close, fd)
        self.assertRaises(recovery.AlreadyRunning, recovery.host_lock,
                          self.top, 'h1')
        self.assertRaises(recovery.AlreadyRunning, recovery.host_lock,
                          self.top, 'h1', create=False)
        # Another host sharing instances_path has its own.
        other = recovery.host_lock(self.top, 'h2')
        os.close(other)

    def test_lock_waited_for(self):
        # Another process holds it (nova-compute's start recovering) for
        # a second.
        path = recovery.lock_path(self.top, 'h1')
        holder = subprocess.Popen(
            [sys.executable, '-c', 'import fcntl, os, sys, time\n'
             'fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n'
             'fcntl.flock(fd, fcntl.LOCK_EX)\n'
             'print("held", flush=True)\n'
             'time.sleep(float(sys.argv[2]))', path, '1'],
            stdout=subprocess.PIPE, text=True)
        self.addCleanup(holder.wait)
        self.assertEqual('held', holder.stdout.readline().strip())
        exc = self.assertRaises(recovery.AlreadyRunning, recovery.host_lock,
                                self.top, 'h1', wait=0.2)
        self.assertIn("or nova-compute's start is recovering", str(exc))
        self.assertIn('waited 0.2 s', str(exc))
        fd = recovery.host_lock(self.top, 'h1', wait=30)
        os.close(fd)
        self.assertIsNotNone(holder.poll())

    def test_lock_is_not_followed_through_a_symlink(self):
        os.symlink('/etc/passwd', recovery.lock_path(self.top, 'h1'))
        self.assertRaises(OSError, recovery.host_lock, self.top, 'h1')

    def test_only_domains_of_this_host_are_recovered(self):
        path = self.disk('other')
        os.rename(path, path + live.ORIG_SUFFIX)
        with open(path, 'w') as f:
            f.write('copy')
        with open(live.journal_path(path), 'w') as f:
            json.dump({'phase': live.SWAPPED, 'dev': 'vda'}, f)
        said, failed = [], []
        recovery.recover_all(Conn({}), self.top, said.append, failed.append)
        self.assertEqual([], failed)
        self.assertIn('defines no domain', said[0])
        # Left exactly as it was: another host's guest may run on it.
        self.assertTrue(os.path.exists(path + live.ORIG_SUFFIX))
        self.assertTrue(os.path.exists(live.journal_path(path)))

    def test_a_libvirt_error_is_a_failure_not_another_hosts_domain(self):
        path = self.disk('mine')
        with open(path + live.NEW_SUFFIX, 'w'):
            pass
        conn = mock.Mock()
        conn.lookupByUUIDString.side_effect = ConnectionLost('gone')
        said, failed = [], []
        recovery.recover_all(conn, self.top, said.append, failed.append)
        self.assertEqual([], said)
        self.assertEqual(1, len(failed))
        self.assertIn('could not recover an interrupted adoption: gone',
                      failed[0])
        self.assertTrue(os.path.exists(path + live.NEW_SUFFIX))

    def test_stale_claims_cleared_unless_leftovers(self):
        self.disk('clean')
        busy = self.disk('busy')
        with open(busy + live.NEW_SUFFIX, 'w'):
            pass
        clean = Instance('clean', recovery.TASK_STATE)
        kept = Instance('busy', recovery.TASK_STATE)
        other = Instance('other', 'resize_migrating')
        said = []
        with mock.patch('nova.objects.InstanceList.get_by_host',
                        return_value=[clean, kept, other]):
            recovery.release_stale_claims(None, 'host1', self.top,
                                          said.append)
        self.assertEqual([(None, [recovery.TASK_STATE])], clean.saved)
        self.assertEqual([], kept.saved)
        self.assertEqual([], other.saved)
        self.assertEqual(2, len(said))


class FlakyConn:
    """A libvirt connection that answers until ``dead``."""

    def __init__(self, uri='qemu:///system', dead=False):
        self.uri = uri
        self.dead = dead
        self.closed = False

    def getURI(self):
        return self.uri

    def getLibVersion(self):
        if self.dead:
            raise RuntimeError('internal error: client socket is closed')
        return 9000000

    def close(self):
        self.closed = True

    def lookupByUUIDString(self, uuid):
        return ('domain', uuid, self)


class TestConnection(base.TestCase):

    def setUp(self):
        super().setUp()
        self.useFixture(fixtures.MockPatch('time.sleep'))

    def test_live_connection_kept(self):
        conn = FlakyConn()
        opened = []
        wrapped = recovery.Connection(conn, opener=opened.append)
        self.assertIs(conn, wrapped.get())
        self.assertEqual([], opened)

    def test_dead_connection_opened_again_when_libvirtd_answers(self):
        conn = FlakyConn()
        tries = []
        fresh = FlakyConn()

        def opener(uri):
            tries.append(uri)
            if len(tries) < 3:
                raise RuntimeError('Failed to connect socket')
            return fresh

        wrapped = recovery.Connection(conn, opener=opener)
        conn.dead = True
        self.assertEqual(('domain', 'u1', fresh), wrapped.lookup('u1'))
        self.assertEqual(['qemu:///system'] * 3, tries)
        self.assertTrue(conn.closed)

    def test_libvirtd_not_back_in_time(self):
        conn = FlakyConn()
        wrapped = recovery.Connection(conn, opener=lambda uri: FlakyConn(
            dead=True), timeout=0)
        conn.dead = True
        self.assertRaisesRegex(exception.PreallocError,
                               'did not answer again within 0 s',
                               wrapped.get)

    def test_given_up_once_fails_at_once_after(self):
        conn = FlakyConn()
        tries = []

        def opener(uri):
            tries.append(uri)
            raise RuntimeError('Failed to connect socket')

        wrapped = recovery.Connection(conn, opener=opener, timeout=0)
        conn.dead = True
        self.assertRaises(exception.PreallocError, wrapped.get)
        self.assertTrue(wrapped.gone)
        n = len(tries)
        self.assertRaisesRegex(exception.PreallocError, 'did not answer',
                               wrapped.get)
        self.assertEqual(n, len(tries))
