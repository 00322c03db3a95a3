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

"""prealloc_backend/system/stopping.py: real signals sent to this process, real
child processes (sleep, sh) killed (the bench run end to end is in
tests/integration/test_bench_signals.py).
"""

import io
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import fixtures

from prealloc_backend.system import stopping
from tests import base
from tests import fixtures as pb_fixtures

# A killed child is gone well within this (the watcher sweeps every
# stopping.POLL seconds).
KILL_SECONDS = 5


def _marked(token):
    return pb_fixtures.processes_with_env('PREALLOC_TEST_STOPPING', token)


def _left(token):
    """The marked processes still alive once SIGKILL had time to land: a
    signal is delivered asynchronously, and a loaded machine (seen under a
    cloud and Tempest) can show a killed process as not yet dead for a
    moment after its parent was reaped.
    """
    deadline = time.monotonic() + KILL_SECONDS
    while _marked(token) and time.monotonic() < deadline:
        time.sleep(0.01)
    return _marked(token)


class StoppingTestCase(base.TestCase):

    def setUp(self):
        super().setUp()
        self.useFixture(fixtures.Timeout(60, gentle=True))
        self.unraisable = []
        self.useFixture(fixtures.MonkeyPatch(
            'sys.unraisablehook', self.unraisable.append))

    def test_a_signal_is_recorded_and_raises_nothing(self):
        previous = signal.getsignal(signal.SIGTERM)
        with stopping.on_signals() as stop:
            self.assertFalse(stop.requested)
            stop.check()
            stopping.check()
            os.kill(os.getpid(), signal.SIGTERM)
            # The handler has run (at the latest at the next bytecode):
            # nothing was raised, the flow goes on.
            self.assertEqual(signal.SIGTERM, stop.signum)
            self.assertTrue(stopping.requested())
            self.assertIs(stop, stopping.active())
            # A second signal changes nothing.
            os.kill(os.getpid(), signal.SIGINT)
            self.assertEqual(signal.SIGTERM, stop.signum)
            exc = self.assertRaises(stopping.Stopped, stop.check)
            self.assertEqual(143, exc.status)
            self.assertEqual('stopped by SIGTERM', str(exc))
            self.assertRaises(stopping.Stopped, stopping.check)
        self.assertEqual(143, stop.status)
        # Everything as before: handlers, wakeup fd, no context.
        self.assertIs(previous, signal.getsignal(signal.SIGTERM))
        self.assertIs(signal.default_int_handler,
                      signal.getsignal(signal.SIGINT))
        self.assertIsNone(stopping.active())
        stopping.check()
        self.assertEqual([], self.unraisable)

    def test_sigint(self):
        with stopping.on_signals() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            exc = self.assertRaises(stopping.Stopped, stop.check)
        self.assertEqual(130, exc.status)

    def test_stopped_is_not_an_exception(self):
        # No "except Exception" swallows it.
        self.assertFalse(issubclass(stopping.Stopped, Exception))

    def test_a_signal_in_a_del_is_not_lost(self):
        # Where an exception raised by a handler would be "ignored".
        class Sends:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)

        with stopping.on_signals() as stop:
            Sends()
            self.assertRaises(stopping.Stopped, stop.check)
        self.assertEqual([], self.unraisable)

    def test_the_running_child_and_its_child_are_killed(self):
        token = uuid.uuid4().hex
        env = dict(os.environ, PREALLOC_TEST_STOPPING=token)
        with stopping.on_signals() as stop:
            # sh, and its sleep (a grandchild).
            proc = subprocess.Popen(['sh', '-c', 'sleep 60; true'], env=env)
            self.addCleanup(proc.wait)
            self.addCleanup(proc.kill)
            deadline = time.monotonic() + KILL_SECONDS
            while len(_marked(token)) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertEqual(2, len(_marked(token)))
            threading.Timer(0.2, os.kill,
                            (os.getpid(), signal.SIGTERM)).start()
            started = time.monotonic()
            # Blocked in waitpid: the watcher, not the main thread, kills.
            status = proc.wait(timeout=KILL_SECONDS)
            self.assertLess(time.monotonic() - started, KILL_SECONDS)
            self.assertEqual(-signal.SIGKILL, status)
            self.assertTrue(stop.requested)
            self.assertIn(proc.pid, stop.killed)
        self.assertEqual([], _left(token))

    def test_a_child_started_after_the_signal_is_killed(self):
        with stopping.on_signals() as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            self.assertTrue(stop.requested)
            proc = subprocess.Popen(['sleep', '60'])
            self.addCleanup(proc.wait)
            self.addCleanup(proc.kill)
            self.assertEqual(-signal.SIGKILL,
                             proc.wait(timeout=KILL_SECONDS))

    def test_an_orphan_in_a_group_a_child_leads_is_killed(self):
        token = uuid.uuid4().hex
        env = dict(os.environ, PREALLOC_TEST_STOPPING=token)
        with stopping.on_signals():
            # The subshell's sleep is orphaned at once (not a descendant
            # any more), but stays in the group its session leader leads.
            proc = subprocess.Popen(['sh', '-c', '(sleep 60 &); sleep 60'],
                                    env=env, start_new_session=True)
            self.addCleanup(proc.wait)
            self.addCleanup(os.killpg, proc.pid, signal.SIGKILL)
            deadline = time.monotonic() + KILL_SECONDS
            while len(_marked(token)) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertEqual(3, len(_marked(token)))
            os.kill(os.getpid(), signal.SIGTERM)
            proc.wait(timeout=KILL_SECONDS)
        deadline = time.monotonic() + KILL_SECONDS
        while _marked(token) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual([], _left(token))

    def test_no_stop_kills_nothing(self):
        with stopping.on_signals() as stop:
            out = subprocess.run(['sh', '-c', 'sleep 0.3; echo done'],
                                 capture_output=True, text=True, check=True)
        self.assertEqual('done\n', out.stdout)
        self.assertFalse(stop.requested)
        self.assertIsNone(stop.status)
        self.assertEqual([], stop.killed)

    def test_left_children_are_reaped(self):
        with stopping.on_signals():
            proc = subprocess.Popen(['sleep', '60'])
            os.kill(os.getpid(), signal.SIGTERM)
        # Nobody waited for it: the context did.
        self.assertNotIn(proc.pid, stopping.children(os.getpid()))
        self.assertFalse(os.path.exists('/proc/%d' % proc.pid))

    def test_descendants_parents_first(self):
        proc = subprocess.Popen(['sh', '-c', 'sleep 60; true'])
        self.addCleanup(proc.wait)
        self.addCleanup(proc.kill)
        deadline = time.monotonic() + KILL_SECONDS
        while (len(stopping.descendants(proc.pid)) < 1 and
               time.monotonic() < deadline):
            time.sleep(0.01)
        (sleep,) = stopping.descendants(proc.pid)
        mine = stopping.descendants()
        self.assertLess(mine.index(proc.pid), mine.index(sleep))
        self.assertIn(proc.pid, stopping.children(os.getpid()))
        self.assertNotIn(sleep, stopping.children(os.getpid()))

    def test_main_thread_only_and_one_at_a_time(self):
        with stopping.on_signals():
            self.assertRaises(RuntimeError,
                              stopping.on_signals().__enter__)
        errors = []

        def enter():
            try:
                with stopping.on_signals():
                    pass
            except RuntimeError as exc:
                errors.append(exc)

        thread = threading.Thread(target=enter)
        thread.start()
        thread.join()
        self.assertEqual(1, len(errors))

    def test_exit_status(self):
        self.assertEqual(130, stopping.exit_status(signal.SIGINT))
        self.assertEqual(143, stopping.exit_status(signal.SIGTERM))
        self.assertEqual('SIGINT', stopping.signal_name(2))


class TestHooksTestCase(base.TestCase):

    def setUp(self):
        super().setUp()
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_backend.system.stopping._paused', set()))
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_backend.system.stopping.PAUSE_SECONDS', 0.1))
        self.stderr = io.StringIO()
        self.useFixture(fixtures.MonkeyPatch('sys.stderr', self.stderr))

    def said(self):
        return self.stderr.getvalue()

    def test_nothing_without_the_variable(self):
        self.useFixture(fixtures.EnvironmentVariable(stopping.PAUSE_ENV))
        stopping.pause_point('here')
        self.assertFalse(stopping.test_point('here'))
        self.assertEqual('', self.said())

    def test_pause_once(self):
        self.useFixture(fixtures.EnvironmentVariable(stopping.PAUSE_ENV,
                                                     'here'))
        stopping.pause_point('elsewhere')
        started = time.monotonic()
        stopping.pause_point('here')
        stopping.pause_point('here')
        self.assertGreaterEqual(time.monotonic() - started, 0.1)
        self.assertEqual('stopping: paused at here\n', self.said())

    def test_a_stop_ends_the_pause(self):
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_backend.system.stopping.PAUSE_SECONDS', 30))
        self.useFixture(fixtures.EnvironmentVariable(stopping.PAUSE_ENV,
                                                     'here:del'))
        with stopping.on_signals() as stop:
            threading.Timer(0.1, os.kill,
                            (os.getpid(), signal.SIGTERM)).start()
            started = time.monotonic()
            stopping.pause_point('here')
            self.assertLess(time.monotonic() - started, 5)
            self.assertTrue(stop.requested)
        self.assertEqual('stopping: paused at here:del\n', self.said())

    def test_point(self):
        self.useFixture(fixtures.EnvironmentVariable(stopping.PAUSE_ENV,
                                                     'child:x'))
        self.assertFalse(stopping.test_point('child:y'))
        self.assertTrue(stopping.test_point('child:x'))
        self.assertFalse(stopping.test_point('child:x'))
        self.assertEqual('stopping: at child:x\n', self.said())


class TestSecondsSinceStart(base.TestCase):

    def test_as_ps_counts_it(self):
        # ps's etimes: the kernel's elapsed time of the process, in whole
        # seconds (this test process has run for a while already).
        ours = stopping.seconds_since_start()
        ps = subprocess.run(['ps', '-o', 'etimes=', '-p', str(os.getpid())],
                            capture_output=True, text=True, check=True)
        self.assertLess(abs(ours - int(ps.stdout)), 2)

    def test_a_new_process_is_young(self):
        out = subprocess.run(
            [sys.executable, '-c', 'from prealloc_backend.system import '
             'stopping; print(stopping.seconds_since_start())'],
            capture_output=True, text=True, check=True)
        self.assertLess(float(out.stdout), 30)
        self.assertGreaterEqual(float(out.stdout), 0)
