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

"""One SIGTERM or SIGINT stops a real ``prealloc-bench`` run,
wherever it comes (issue 36).

Each test starts the real command on a small directory (``--quick``, the
creation and extents workloads: two workloads, real qemu-img and filefrag
runs), makes it wait at a named point (prealloc_backend.system.stopping's test
hook, ``PREALLOC_TEST_PAUSE_AT``), sends it one signal there and checks
that it exits within STOP_SECONDS with the INTERRUPTED report, the
``interrupted`` key in its JSON and status 1, that Python ignored no
exception on the way, and that no process it started is left: every
process that inherited the run's marker variable is gone.
"""

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import testscenarios

from prealloc_backend.system import stopping
from tests import base
from tests import fixtures as pb_fixtures

load_tests = testscenarios.load_tests_apply_scenarios

# From the signal to the exit: the command stops at once; the slack is for
# a busy 2-CPU machine.
STOP_SECONDS = 10
# Starting the command (nova's imports) and reaching the point.
START_SECONDS = 120
MARKER = 'PREALLOC_TEST_RUN'


def _marked(token):
    """PIDs of the processes whose environment holds MARKER=token."""
    return pb_fixtures.processes_with_env(MARKER, token)


def _comm(pid):
    try:
        with open('/proc/%d/comm' % pid) as f:
            return f.read().strip()
    except OSError:
        return None


class BenchSignalsTestCase(base.TestCase):

    # (point, signal, what the point is)
    scenarios = [
        ('between_workloads_term', dict(point='between-workloads',
                                        signum=signal.SIGTERM)),
        # In a __del__: where a handler's exception is "ignored".
        ('in_del_term', dict(point='between-workloads:del',
                             signum=signal.SIGTERM)),
        # In the parent's at-fork callback, where logging releases its
        # lock after each fork: the "Exception ignored in _releaseLock" of
        # issue 36.
        ('after_fork_term', dict(point='after-fork',
                                 signum=signal.SIGTERM)),
        ('after_fork_int', dict(point='after-fork', signum=signal.SIGINT)),
        ('repetition_term', dict(point='repetition', signum=signal.SIGTERM)),
        # A tool running (sh, then its sleep, then filefrag).
        ('child_term', dict(point='child:filefrag', signum=signal.SIGTERM)),
        # In the finally of a workload (its teardown).
        ('teardown_int', dict(point='teardown', signum=signal.SIGINT)),
        # In a logging handler, its lock held.
        ('logging_term', dict(point='logging', signum=signal.SIGTERM)),
        ('report_term', dict(point='report', signum=signal.SIGTERM)),
    ]

    def setUp(self):
        super().setUp()
        self.token = uuid.uuid4().hex
        self.addCleanup(self._kill_leftovers)

    def _kill_leftovers(self):
        # Never leave a run behind, whatever the test found.
        for pid in _marked(self.token):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def _end(self, proc):
        if proc.poll() is None:
            proc.kill()
        proc.wait()

    def _wait_for(self, predicate, seconds, what, proc, err_path):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if predicate():
                return
            if proc.poll() is not None:
                break
            time.sleep(0.02)
        with open(err_path) as f:
            self.fail('%s not seen (exit %s); stderr: %s' % (
                what, proc.poll(), f.read()[-3000:]))

    def test_one_signal_stops_the_run(self):
        directory = os.path.join(self.instances_path, 'here')
        out_json = os.path.join(self.instances_path, 'bench.json')
        out_path = os.path.join(self.instances_path, 'stdout')
        err_path = os.path.join(self.instances_path, 'stderr')
        env = dict(os.environ)
        env[stopping.PAUSE_ENV] = self.point
        env[MARKER] = self.token
        with open(out_path, 'w') as out, open(err_path, 'w') as err:
            proc = subprocess.Popen(
                [sys.executable, '-m', 'prealloc_bench.cmd',
                 '--quick', '--only', 'create,extents', '--dir', directory,
                 '--json', out_json], stdout=out, stderr=err, env=env)
        self.addCleanup(self._end, proc)

        def at_point():
            with open(err_path) as f:
                text = f.read()
            return ('stopping: paused at %s\n' % self.point in text or
                    'stopping: at %s\n' % self.point in text)

        self._wait_for(at_point, START_SECONDS, 'the pause', proc, err_path)
        if self.point.startswith('child:'):
            # The tool's process tree is up: sh and its sleep.
            self._wait_for(
                lambda: 'sleep' in [_comm(p) for p in
                                    stopping.descendants(proc.pid)],
                STOP_SECONDS, 'the child tool', proc, err_path)
        started = set(_marked(self.token)) - {proc.pid}
        proc.send_signal(self.signum)
        sent = time.monotonic()
        try:
            status = proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            status = None
        took = time.monotonic() - sent
        with open(out_path) as f:
            stdout = f.read()
        with open(err_path) as f:
            stderr = f.read()
        self.assertIsNotNone(
            status, 'still running %d s after %s at %s; stderr: %s' % (
                STOP_SECONDS, stopping.signal_name(self.signum),
                self.point, stderr[-3000:]))
        self.assertEqual(1, status, stderr[-3000:])
        self.assertNotIn('Exception ignored', stderr)
        self.assertNotIn('Traceback', stderr)
        self.assertIn('INTERRUPTED: ', stdout)
        with open(out_json) as f:
            self.assertIn('interrupted', json.load(f))
        # Nothing it started outlives it.
        self.assertEqual([], _marked(self.token))
        if self.point.startswith('child:'):
            self.assertTrue(started, 'no child seen before the signal')
        # The scratch directory is removed.
        self.assertEqual([], os.listdir(directory))
        self.assertLess(took, STOP_SECONDS)
