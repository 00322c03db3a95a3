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

"""``prealloc-backend check`` and ``bench`` run as root in a tree the nova
user owns.

The nova user is an unprivileged user made for the test (useradd, removed
afterwards) who owns the instances tree, as nova owns /var/lib/nova. Its
moves run in a process of its own (the system python3, stdlib only): it
watches instances_path with inotify and, the moment a scratch directory of
the check or the benchmark appears, swaps it (renameat2 RENAME_EXCHANGE)
for a directory of its own whose base.raw, overlay.qcow2 and
_base/bench-data-*.part are symlinks to a root-only file (0600 in a 0700
directory) made for the test; it also plants ``.bench-direct-probe`` there
as a symlink to that file. check and bench then run as root, many times
(bounded: each test stays well under a minute), in this process (the code
behind the command lines: ``HostChecks``' checks, ``cmd.bench``'s
preflight and ``engine.Bench``) and once each through the real command
line. The root-only file must keep its content, size and mtime and never be
opened (inotify); every run either did its work safely or refused.

The test runs the check in this process, whose interpreter (under
/root, 0700) the attacker user cannot run: the check's child, dropped to
that user, then runs qemu-img without oslo.concurrency's prlimit wrapper,
as it does on any host where root's interpreter is not the nova user's
(checks/qemu_img._no_prlimit_wrapper).
"""

import collections
import ctypes
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys

from oslo_log import log as logging
from oslo_utils import units

from prealloc_backend.checks import filesystem
from prealloc_backend.checks import owner
from prealloc_backend.checks import qemu_img
from prealloc_backend.checks import result
from prealloc_backend.disk import fsprobe
from prealloc_bench import cmd as cmd_bench
from prealloc_bench import engine
from tests import base
from tests import fixtures as pb_fixtures

LOG = logging.getLogger(__name__)

ATTACKER_PYTHON = '/usr/bin/python3'
# Iterations of the races (bounded: each test stays under about 60 s).
CHECK_ROUNDS = 30
BENCH_ROUNDS = 150
SCRATCH_PREFIXES = ('.prealloc-check-', 'prealloc-bench-')

# inotify(7)
IN_ACCESS, IN_MODIFY, IN_OPEN = 0x1, 0x2, 0x20
_libc = ctypes.CDLL(None, use_errno=True)

# The nova user's moves (its own python, stdlib only): swap every scratch
# directory that appears for a decoy of symlinks to the target.
SWAPPER = r'''
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
inst, target, prefixes = sys.argv[1], sys.argv[2], tuple(sys.argv[3:])
SIZES = [n << 20 for n in range(1, 65)] + [1 << k for k in range(27, 35)]
made = [0]
def decoy():
    made[0] += 1
    d = os.path.join(inst, '.decoy-%d' % made[0])
    os.mkdir(d)
    for name in ('base.raw', 'overlay.qcow2'):
        os.symlink(target, os.path.join(d, name))
    os.mkdir(os.path.join(d, '_base'))
    for size in SIZES:
        os.symlink(target, os.path.join(d, '_base',
                                        'bench-data-%d.part' % size))
    return d
pool = [decoy() for _ in range(3)]
plant = os.path.join(inst, '.bench-direct-probe')
os.symlink(target, plant)
IN_CREATE, IN_DELETE, IN_ISDIR = 0x100, 0x200, 0x40000000
fd = libc.inotify_init1(0)
libc.inotify_add_watch(fd, inst.encode(), IN_CREATE | IN_DELETE)
print('ready', flush=True)
while True:
    data = os.read(fd, 65536)
    pos = 0
    while pos < len(data):
        _wd, mask, _cookie, length = struct.unpack_from('iIII', data, pos)
        name = data[pos + 16:pos + 16 + length].rstrip(b'\0').decode()
        pos += 16 + length
        if mask & IN_CREATE and mask & IN_ISDIR and name.startswith(prefixes):
            # renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)
            if libc.renameat2(-100, os.path.join(inst, name).encode(), -100,
                              pool.pop().encode(), 2) == 0:
                print('swap ' + name, flush=True)
            else:
                print('miss %s %d' % (name, ctypes.get_errno()), flush=True)
            pool.append(decoy())
        elif mask & IN_DELETE and name == '.bench-direct-probe':
            try:
                os.symlink(target, plant)
            except OSError:
                pass
'''


class Watch:
    """IN_OPEN/IN_ACCESS/IN_MODIFY events on one file (stat() makes none,
    any open does).
    """

    def __init__(self, path):
        self.fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0
        wd = _libc.inotify_add_watch(self.fd, path.encode(),
                                     IN_OPEN | IN_ACCESS | IN_MODIFY)
        assert wd >= 0, path

    def count(self):
        found = 0
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return found
            pos = 0
            while pos < len(data):
                _wd, _mask, _cookie, length = struct.unpack_from(
                    'iIII', data, pos)
                pos += 16 + length
                found += 1

    def close(self):
        os.close(self.fd)


def file_state(path):
    """(sha256, size, mtime) of a file."""
    with open(path, 'rb') as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    st = os.stat(path)
    return digest, st.st_size, st.st_mtime_ns


def quick_state(path):
    """What changes when a file is written, read without opening it."""
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


class NovaTreeTestCase(base.AttackerTreeTestCase):
    """The nova user's instances tree, a root-only target outside it."""

    USER_PREFIX = 'pbscr'

    def setUp(self):
        super().setUp()
        # Root's: a 0700 directory holding a 0600 file.
        secret = os.path.join(self.scratch, 'secret')
        os.mkdir(secret, 0o700)
        self.target = os.path.join(secret, 'target')
        with open(self.target, 'wb') as f:
            f.write(os.urandom(units.Mi))
        os.chmod(self.target, 0o600)
        self.before = file_state(self.target)

    def start_swapper(self):
        """The nova user's inotify + RENAME_EXCHANGE loop; returns a
        function that stops it and returns the names it swapped.
        """
        proc = subprocess.Popen(
            [ATTACKER_PYTHON, '-c', SWAPPER, self.instances, self.target]
            + list(SCRATCH_PREFIXES),
            user=self.uid, group=self.gid, extra_groups=[],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(proc.wait)
        self.addCleanup(proc.kill)
        self.assertEqual('ready\n', proc.stdout.readline(), proc.stderr)

        def stop():
            proc.kill()
            out, err = proc.communicate()
            LOG.debug('swapper: %s %s', out, err)
            return [line.split(' ', 1)[1] for line in out.splitlines()
                    if line.startswith('swap ')]
        return stop

    def watch_target(self):
        watch = Watch(self.target)
        self.addCleanup(watch.close)
        return watch

    def record(self, test, **figures):
        LOG.info('%s: %s', test, json.dumps(figures, sort_keys=True))
        print('ITERATIONS %s %s' % (test, json.dumps(figures,
                                                     sort_keys=True)))

    def assert_target_untouched(self, watch, hits):
        self.assertEqual(0, watch.count(), 'root opened the target')
        self.assertEqual([], hits)
        self.assertEqual(self.before, file_state(self.target))


class CheckAsRootTestCase(NovaTreeTestCase):

    def test_check_swapped_scratch_directory(self):
        conf_path = os.path.join(self.scratch, 'nova.conf')
        host = self.useFixture(pb_fixtures.CheckHost(
            conf_path, pb_fixtures.check_sections(conf_path,
                                                  self.instances))).host
        stop = self.start_swapper()
        watch = self.watch_target()
        outcomes = collections.Counter()
        hits = []
        for index in range(CHECK_ROUNDS):
            seen = quick_state(self.target)
            # A fresh measure every round: the fallocate(2) probe too.
            host._fs = None
            fsprobe.forget()
            for check in (filesystem.check_filesystem,
                          qemu_img.check_qemu_img):
                res = check(host)
                outcomes['%s %s' % (check.__name__, res.code.name)] += 1
                if res.code is result.Code.FAILURE:
                    # Refused or failed on the nova user's moves, saying
                    # where: never a traceback.
                    self.assertIn(self.instances, res.details)
                    self.assertNotIn('Traceback', res.details)
            if quick_state(self.target) != seen:
                hits.append(index)
        swapped = stop()
        self.record('check_as_root', rounds=CHECK_ROUNDS,
                    swaps=len(swapped), outcomes=outcomes, hits=len(hits))
        # The moves were made against this check, not against nothing.
        self.assertGreater(len(swapped), 0)
        self.assert_target_untouched(watch, hits)
        # Nothing of root's is left in the nova user's tree.
        for dirpath, dirnames, filenames in os.walk(self.instances):
            for name in dirnames + filenames:
                st = os.lstat(os.path.join(dirpath, name))
                self.assertEqual(self.uid, st.st_uid,
                                 os.path.join(dirpath, name))

    def test_check_command_line(self):
        conf_path = pb_fixtures.write_conf(
            os.path.join(self.scratch, 'nova.conf'),
            pb_fixtures.check_sections(os.path.join(self.scratch,
                                                    'nova.conf'),
                                       self.instances))
        stop = self.start_swapper()
        watch = self.watch_target()
        proc = subprocess.run(
            [os.path.join(os.path.dirname(sys.executable),
                          'prealloc-backend'), 'check', '--config-file',
             conf_path, '--json', '--timeout', '110'],
            capture_output=True, text=True, timeout=120)
        swapped = stop()
        checks = {c['check']: c for c in json.loads(proc.stdout)['checks']}
        self.record('check_command_line', swaps=len(swapped),
                    qemu_img=checks['qemu-img']['status'])
        self.assertIn(checks['qemu-img']['status'], ('Success', 'Failure'))
        self.assertIn(self.instances, checks['qemu-img']['details'])
        self.assertEqual('Success', checks['Instances filesystem']['status'],
                         checks['Instances filesystem']['details'])
        self.assert_target_untouched(watch, [])


class BenchAsRootTestCase(NovaTreeTestCase):

    def test_bench_swapped_scratch_directory(self):
        stop = self.start_swapper()
        watch = self.watch_target()
        config = engine.QUICK
        outcomes = collections.Counter()
        hits = []
        for index in range(BENCH_ROUNDS):
            seen = quick_state(self.target)
            reason = cmd_bench._preflight(self.instances)
            if reason:
                self.assertIn('refusing to run as root in %s'
                              % self.instances, reason)
                outcomes['preflight refused'] += 1
            try:
                with engine.Bench(self.instances, config) as bench:
                    bench.base(units.Mi)
                    outcomes['bench ran'] += 1
            except owner.UnsafeDirectory as exc:
                self.assertIn('sudo -u %s' % self.user, str(exc))
                outcomes['bench refused'] += 1
            except OSError as exc:
                # What the nova user's moves may make a run meet.
                outcomes['bench failed: %s' % type(exc).__name__] += 1
            if quick_state(self.target) != seen:
                hits.append(index)
        swapped = stop()
        self.record('bench_as_root', rounds=BENCH_ROUNDS,
                    swaps=len(swapped), outcomes=outcomes, hits=len(hits))
        self.assert_target_untouched(watch, hits)

    def test_bench_command_line(self):
        stop = self.start_swapper()
        watch = self.watch_target()
        proc = subprocess.run(
            [os.path.join(os.path.dirname(sys.executable),
                          'prealloc-bench'), '--quick',
             '--only', 'create', '--dir', self.instances],
            capture_output=True, text=True, timeout=300)
        swapped = stop()
        self.record('bench_command_line', swaps=len(swapped),
                    exit_status=proc.returncode)
        self.assert_target_untouched(watch, [])
        self.assertEqual(2, proc.returncode, proc.stderr)
        self.assertIn('refusing to run as root in %s (owned by %s (uid %d))'
                      % (self.instances, self.user, self.uid), proc.stderr)
        self.assertIn('sudo -u %s prealloc-bench --dir %s'
                      % (self.user, self.instances), proc.stderr)
        self.assertEqual([], swapped)


def _identity(fd, target):
    """In the child: who it runs as, and whether it can read target."""
    try:
        with open(target, 'rb'):
            readable = True
    except PermissionError:
        readable = False
    return {'uid': os.getuid(), 'euid': os.geteuid(), 'gid': os.getgid(),
            'groups': sorted(os.getgroups()), 'cwd': os.getcwd(),
            'readable': readable}


class DropTestCase(NovaTreeTestCase):
    """Who checks/owner.py runs a step as, when root asks."""

    def step_identity(self, directory):
        fd = owner.open_directory(directory)
        self.addCleanup(os.close, fd)
        creds = owner.credentials_for(fd, directory)
        return creds, owner.run_in(fd, directory, _identity, self.target,
                                   creds=creds, deadline=60,
                                   what='the test step')

    def test_nova_users_tree_runs_as_the_nova_user(self):
        creds, seen = self.step_identity(self.instances)
        self.assertEqual((self.uid, self.gid), (creds.uid, creds.gid))
        self.assertEqual(
            {'uid': self.uid, 'euid': self.uid, 'gid': self.gid,
             'groups': sorted(os.getgrouplist(self.user, self.gid)),
             'cwd': self.instances, 'readable': False}, seen)

    def test_root_directory_in_the_nova_users_tree(self):
        # Root's directory, but the nova user can rename it away: the
        # step runs as the nova user, who cannot write there.
        rooted = os.path.join(self.instances, 'rooted')
        os.mkdir(rooted, 0o755)
        creds, seen = self.step_identity(rooted)
        self.assertEqual(self.uid, seen['euid'])

    def test_root_only_directory_keeps_root(self):
        rooted = os.path.join(self.scratch, 'rooted')
        os.mkdir(rooted, 0o755)
        creds, seen = self.step_identity(rooted)
        self.assertIsNone(creds)
        self.assertEqual((0, True), (seen['euid'], seen['readable']))
        self.assertIsNone(owner.refusal_as_root(rooted, 'cmd'))

    def test_root_directory_others_may_write_is_refused(self):
        shared = os.path.join(self.scratch, 'shared')
        os.mkdir(shared)
        os.chmod(shared, 0o777)
        fd = owner.open_directory(shared)
        self.addCleanup(os.close, fd)
        exc = self.assertRaises(owner.UnsafeDirectory,
                                owner.credentials_for, fd, shared)
        self.assertIn('%s may be written by its group or by others (mode '
                      '0777)' % shared, str(exc))
        self.assertIn('refusing to run as root in %s' % shared,
                      owner.refusal_as_root(shared, 'cmd'))

    def test_symlink_planted_by_the_nova_user(self):
        # instances_path through a symlink of the nova user's, to a root
        # directory: the step still runs as the nova user.
        rooted = os.path.join(self.scratch, 'rooted')
        os.mkdir(rooted, 0o755)
        link = os.path.join(self.nova_home, 'link')
        os.symlink(rooted, link)
        os.lchown(link, self.uid, self.gid)
        creds, seen = self.step_identity(link)
        self.assertEqual((self.uid, rooted), (seen['euid'], seen['cwd']))
        self.assertIn('sudo -u %s cmd --dir %s' % (self.user, link),
                      owner.refusal_as_root(link, 'cmd'))

    def test_two_users_are_refused(self):
        other = self.useFixture(pb_fixtures.SystemUser('pbsc2')).name
        inner = os.path.join(self.instances, 'other')
        os.mkdir(inner)
        shutil.chown(inner, other)
        fd = owner.open_directory(inner)
        self.addCleanup(os.close, fd)
        exc = self.assertRaises(owner.UnsafeDirectory,
                                owner.credentials_for, fd, inner)
        self.assertIn('several users', str(exc))
        self.assertIn(other, str(exc))
        self.assertIn(self.user, str(exc))
