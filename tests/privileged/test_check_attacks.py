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

"""Attacks on ``prealloc-backend check`` by the nova user (issue 31, 4-5).

``check`` runs as root, as operators run it (``python -m
prealloc_backend.cmd.main check --json``, a child process of the test); the
attacker is a user made for the test (useradd, as in
test_boundary_attacks) who owns instances_path and its parent, as nova owns
/var/lib/nova. Its moves run in its own processes (the system python3,
stdlib only).

- Its children: the check's steps in instances_path drop to the attacker,
  who stops (SIGSTOP) or kills (SIGKILL) every process it may signal
  (``kill(-1, sig)`` in a tight loop). The check must end within the
  time of a clean run plus the step's deadline, with a Failure naming the
  step. The deadlines (checks/host.py FALLOCATE_DEADLINE, checks/
  qemu_img.py OVERLAY_DEADLINE) are set to STEP_DEADLINE seconds in the
  check's process (``python -c`` setting them, then running the command),
  which also makes the fallocate(2) probe a second slower, so that the
  attacker's signal reliably lands while it runs.
- instances_path: while the check runs, the attacker renames it away and
  puts a symlink (to a root-owned directory), a root-owned directory or a
  regular file in its place (or a fresh directory of its own, the
  control). Then the real daemon (privsep-helper as root, started as in
  test_privsep_daemon_root) is asked to allocate a disk there with the
  same instances_path: the check's last verdict on instances_path must be
  a Failure exactly when the daemon refuses the pin, with its reason.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

from oslo_log import log as logging

from prealloc_backend.checks import qemu_img
import prealloc_backend.privsep.fs
from prealloc_backend.system import process
from tests import base
from tests import fixtures as pb_fixtures
from tests.privileged import test_privsep_daemon_root

LOG = logging.getLogger(__name__)

ATTACKER_PYTHON = '/usr/bin/python3'
# The steps' deadline in the attacked check (seconds).
STEP_DEADLINE = 3
# Time the check may take beyond a clean run and the deadline: its
# imports and the other checks on a loaded 2-core machine.
MARGIN = 30
# A check that hangs is stopped by the test after this long.
CHECK_TIMEOUT = 300
# Rounds of each instances_path swap.
SWAP_ROUNDS = 2

# Stop or kill the processes that run as the attacker (the check's step
# and what it runs), found in /proc by their real uid (a process that
# dropped from root is not dumpable: its /proc directory stays root's),
# optionally once the check's overlay step has made its scratch directory
# in instances_path. Prints each process signalled and its state after.
# Not kill(-1, sig): it succeeds whenever any other process exists,
# so it cannot tell the attacker that it hit the step.
SIGNALLER = r'''
import os, signal, sys, time
sig = getattr(signal, sys.argv[1])
watch = sys.argv[2]
me, myself = os.getuid(), os.getpid()
def mine():
    found = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit() or int(entry) == myself:
            continue
        try:
            with open('/proc/%s/status' % entry) as f:
                fields = dict(line.split(':', 1) for line in f)
        except (OSError, ValueError):
            continue
        if int(fields['Uid'].split()[0]) == me and \
                not fields['State'].strip().startswith(('Z', 'X')):
            found.append(int(entry))
    return found
if watch:
    while not any(n.startswith('.prealloc-check-')
                  for n in os.listdir(watch)):
        time.sleep(0.001)
print('armed', flush=True)
while True:
    pids = mine()
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    if pids:
        break
    time.sleep(0.001)
time.sleep(0.1)
for pid in pids:
    try:
        with open('/proc/%d/stat' % pid) as f:
            state = f.read().rsplit(')', 1)[1].split()[0]
    except OSError:
        state = 'gone'
    print('hit', pid, state, flush=True)
'''

# Rename instances_path away and put something else in its place, after
# a delay or once the overlay step's scratch directory appears.
SWAPPER = r'''
import os, sys, time
inst, kind, when, target = sys.argv[1:5]
if when == 'overlay':
    while not any(n.startswith('.prealloc-check-')
                  for n in os.listdir(inst)):
        time.sleep(0.001)
else:
    time.sleep(float(when))
os.rename(inst, inst + '.away')
if kind == 'symlink':
    os.symlink(target, inst)
elif kind == 'rootdir':
    os.rename(target, inst)
elif kind == 'file':
    open(inst, 'w').close()
elif kind == 'nova':
    os.mkdir(inst, 0o755)
print(time.monotonic(), flush=True)
'''

# The check with its steps' deadlines set to argv[1] seconds, and its
# fallocate(2) probe made argv[2] seconds slower (a slow filesystem): the
# probe itself takes a millisecond, and a signal that lands while its
# child exits changes nothing.
CHECK_WITH_DEADLINE = r'''
import sys, time
from prealloc_backend.checks import host, qemu_img
host.FALLOCATE_DEADLINE = qemu_img.OVERLAY_DEADLINE = float(sys.argv[1])
slow, step = float(sys.argv[2]), host._fallocate_step
def slowed(fd):
    time.sleep(slow)
    return step(fd)
host._fallocate_step = slowed
from prealloc_backend.cmd import main
sys.exit(main.main(sys.argv[3:]))
'''
# Seconds the fallocate(2) probe is slowed down by in those runs.
SLOW_PROBE = 1


class CheckAttackTestCase(test_privsep_daemon_root.DaemonMixin,
                          base.AttackerTreeTestCase):

    def setUp(self):
        super().setUp()
        self.conf_path = os.path.join(self.scratch, 'nova.conf')
        pb_fixtures.write_conf(self.conf_path, pb_fixtures.check_sections(
            self.conf_path, self.instances))
        # Whatever the attacker leaves running (a stopped qemu-img) ends
        # with the test; only this test's user's processes are signalled.
        self.addCleanup(self.kill_attackers)

    def kill_attackers(self):
        for entry in os.listdir('/proc'):
            if not entry.isdigit():
                continue
            try:
                if os.stat('/proc/' + entry).st_uid != self.uid:
                    continue
                os.kill(int(entry), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass

    def attacker_start(self, script, *args):
        proc = subprocess.Popen(
            [ATTACKER_PYTHON, '-c', script] + [str(a) for a in args],
            user=self.uid, group=self.gid, extra_groups=[],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(proc.wait)
        self.addCleanup(proc.kill)
        return proc

    def run_check(self, deadline=None, timeout=None):
        """(results by check name, exit status, seconds), the steps'
        deadlines ``deadline`` seconds (default: the command's own), the
        whole command's ``timeout`` (--timeout; default its own).
        """
        if deadline is None:
            cmd = [sys.executable, '-m', 'prealloc_backend.cmd.main']
        else:
            cmd = [sys.executable, '-c', CHECK_WITH_DEADLINE, str(deadline),
                   str(SLOW_PROBE)]
        cmd += ['check', '--config-file', self.conf_path, '--json',
                # Judged on what it finds, not on how fast a loaded test
                # machine runs it, unless the test is about the deadline.
                '--timeout', str(timeout or CHECK_TIMEOUT - 10)]
        started = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              timeout=CHECK_TIMEOUT, cwd=self.scratch)
        took = time.monotonic() - started
        try:
            report = json.loads(proc.stdout)
        except ValueError:
            self.fail('no JSON from the check (exit %d): %s'
                      % (proc.returncode, proc.stderr[-2000:]))
        return ({c['check']: c for c in report['checks']}, proc.returncode,
                took)

    def record(self, test, **figures):
        LOG.info('%s: %s', test, json.dumps(figures, sort_keys=True))
        print('ITERATIONS %s %s' % (test, json.dumps(figures,
                                                     sort_keys=True)))


class StoppedStepsTestCase(CheckAttackTestCase):
    """Finding 4: the nova user stops or kills the check's children."""

    def attacked(self, sig, watch=''):
        clean, _code, clean_took = self.run_check(STEP_DEADLINE)
        self.assertEqual('Success', clean['Instances filesystem']['status'],
                         clean['Instances filesystem']['details'])
        attacker = self.attacker_start(SIGNALLER, sig, watch)
        if not watch:
            self.assertEqual('armed', attacker.stdout.readline().strip())
        checks, code, took = self.run_check(STEP_DEADLINE)
        out, err = attacker.communicate(timeout=60)
        self.assertEqual(0, attacker.returncode, err)
        # Stopped (T) or killed (gone) while it ran.
        hits = [line.split() for line in out.splitlines()
                if line.startswith('hit ')]
        self.assertTrue(hits, out)
        for _hit, _pid, state in hits:
            self.assertIn(state, ('T', 'gone'), out)
        self.attacker_said = out
        self.assertEqual(2, code)
        # Ended within a clean run's time plus one deadline (the first
        # timed-out step is not waited for again) and the reaping.
        bound = clean_took + STEP_DEADLINE + process.KILL_WAIT + MARGIN
        self.assertLess(took, bound)
        self.record(self.id().rsplit('.', 1)[-1], clean_seconds=clean_took,
                    attacked_seconds=took, deadline=STEP_DEADLINE)
        return checks

    def test_stopped_fallocate_probe(self):
        checks = self.attacked('SIGSTOP')
        res = checks['Instances filesystem']
        self.assertEqual('Failure', res['status'], res['details'])
        self.assertIn('the fallocate(2) probe in %s, run as %s, did not end '
                      'within its deadline of %s s: it was killed'
                      % (self.instances, self.user, float(STEP_DEADLINE)),
                      res['details'])

    def test_killed_fallocate_probe(self):
        checks = self.attacked('SIGKILL')
        res = checks['Instances filesystem']
        self.assertEqual('Failure', res['status'],
                         res['details'] + self.attacker_said)
        self.assertIn('the fallocate(2) probe in %s ended (wait status 9) '
                      'without an answer' % self.instances, res['details'])

    def test_stopped_overlay_step(self):
        checks = self.attacked('SIGSTOP', watch=self.instances)
        res = checks['qemu-img']
        self.assertEqual('Failure', res['status'], res['details'])
        self.assertIn('the qemu-img overlay step in %s, run as %s, did not '
                      'end within its deadline of %s s: it was killed'
                      % (self.instances, self.user, float(STEP_DEADLINE)),
                      res['details'])


class WholeRunDeadlineTestCase(CheckAttackTestCase):
    """Finding 5 of issue 43: the steps keep their own deadlines (4 minutes
    for the overlay step), and the nova user stops them: the whole command
    still ends by its --timeout (60 s by default, what a health probe
    allows; 20 s here, to keep the tier short), with the stopped check a
    Failure "Not finished" and the checks after it "Not run".
    """

    TIMEOUT = 20

    def test_stopped_steps_end_by_the_deadline(self):
        attacker = self.attacker_start(SIGNALLER, 'SIGSTOP', self.instances)
        checks, code, took = self.run_check(
            deadline=qemu_img.OVERLAY_DEADLINE, timeout=self.TIMEOUT)
        out, err = attacker.communicate(timeout=60)
        self.assertEqual(0, attacker.returncode, err)
        hits = [line.split() for line in out.splitlines()
                if line.startswith('hit ')]
        self.assertTrue(hits, out)
        self.assertEqual(2, code)
        # From the command's start (its interpreter's start included) to
        # its table: the test's clock starts before it and ends after.
        self.assertLess(took, self.TIMEOUT + 2)
        res = checks['qemu-img']
        self.assertEqual('Failure', res['status'], res['details'])
        self.assertIn('Not finished: the command reached its deadline of '
                      '%d s (--timeout) with this check unfinished; the '
                      'processes it ran were killed' % self.TIMEOUT,
                      res['details'])
        names = list(checks)
        for later in names[names.index('qemu-img') + 1:]:
            self.assertTrue(checks[later]['details'].startswith('Not run'),
                            checks[later])
        self.record(self.id().rsplit('.', 1)[-1], attacked_seconds=took,
                    timeout=self.TIMEOUT)


class SwappedInstancesPathTestCase(CheckAttackTestCase):
    """Finding 5: the nova user swaps instances_path while check runs."""

    def setUp(self):
        super().setUp()
        self.use_daemon(self.instances)
        # Root's directory outside the tree, the symlinks' target.
        self.roots = os.path.join(self.scratch, 'roots')
        os.mkdir(self.roots)

    def reset(self):
        """A fresh instances directory of the nova user's, nothing else."""
        for path in (self.instances, self.instances + '.away'):
            if os.path.islink(path) or os.path.isfile(path):
                os.unlink(path)
            elif os.path.isdir(path):
                shutil.rmtree(path)
        self.attacker_dir(self.instances)

    def daemon_verdict(self):
        """(refused, message) of the real daemon's next call."""
        self.stop_daemons()
        disk = os.path.join(self.instances, 'inst', 'disk')
        try:
            prealloc_backend.privsep.fs.fallocate_range(disk, 0, 4096)
        except Exception as exc:
            return type(exc).__name__ == 'InstancesPathUnusable', str(exc)
        return False, 'ok'

    def one_round(self, kind, when):
        self.reset()
        target = ''
        if kind == 'symlink':
            target = self.roots
        elif kind == 'rootdir':
            # Root's, in the nova user's directory: the nova user can
            # rename it (same parent) but not change it.
            target = os.path.join(self.nova_home, 'rootdir')
            os.mkdir(target, 0o755)
        started = time.monotonic()
        swapper = (self.attacker_start(SWAPPER, self.instances, kind, when,
                                       target)
                   if kind != 'none' else None)
        checks, _code, took = self.run_check()
        ended = started + took
        if swapper is not None:
            out, err = swapper.communicate(timeout=60)
            self.assertEqual(0, swapper.returncode, err)
            # The swap happened while the check ran.
            self.assertLess(float(out.split()[0]), ended)
        last = checks['Instances path, at the end']
        refused, message = self.daemon_verdict()
        self.assertEqual(refused, last['status'] == 'Failure',
                         '%s at %s: the check says %s (%s); the daemon: %s'
                         % (kind, when, last['status'], last['details'],
                            message))
        if refused:
            self.assertIn(last['facts']['refusal'], message)
        return refused

    def verdicts_match(self, test, kinds, rounds):
        """Each round (kind, when) of the swapper: the check's last row
        and the daemon's next call agree, and the daemon refuses exactly
        the swaps to a symlink, root's directory or a file. ``when`` None:
        a random moment in the first 30% of a clean run's time.
        """
        # A clean run first: its time bounds the random swap moments.
        self.reset()
        _checks, _code, clean = self.run_check()
        rng = random.Random(31)
        refusals = 0
        for kind, when in rounds:
            if when is None:
                when = '%.2f' % rng.uniform(0, clean * 0.3)
            refused = self.one_round(kind, when)
            self.assertEqual(kind in kinds, refused, '%s at %s' % (kind,
                                                                  when))
            refusals += refused
        self.record(test, rounds=len(rounds), refusals=refusals,
                    clean_seconds=clean)

    # One test per kind of swap, so that the tier's two workers share the
    # rounds (each round is a whole check run, about 10 s).
    def swapped_to(self, kind):
        self.verdicts_match(
            'test_verdict_matches_the_daemon_' + kind, (kind,),
            [(kind, when) for _round in range(SWAP_ROUNDS)
             for when in ('overlay', None)])

    def test_verdict_matches_the_daemon_symlink(self):
        self.swapped_to('symlink')

    def test_verdict_matches_the_daemon_rootdir(self):
        self.swapped_to('rootdir')

    def test_verdict_matches_the_daemon_file(self):
        self.swapped_to('file')

    def test_verdict_matches_the_daemon_untouched(self):
        # No swap, and the nova user's own rename-and-recreate (a
        # directory of its own again): nothing to refuse.
        self.verdicts_match('test_verdict_matches_the_daemon_untouched', (),
                            [('none', '0'), ('nova', 'overlay')])
