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

"""prealloc_backend.system.process.execute, on real processes.

Nothing is mocked: true, false, sh, sleep and Python children run, a
timeout kills a real sleep (whose pid is then looked up), prlimit limits a
real Python. The last test reads the package's source: no other module
starts a process.
"""

import ast
import os
import signal
import sys
import time

import fixtures
from oslo_utils import units
from oslotest import base

from prealloc_backend import exception
from prealloc_backend.system import process
from tests import fixtures as pb_fixtures


class ExecuteTestCase(base.BaseTestCase):

    def test_success_returns_stdout(self):
        self.assertEqual('', process.execute('true'))
        self.assertEqual('a b\n', process.execute('echo', 'a', 'b'))
        # Arguments are not strings to the caller: sizes are ints.
        self.assertEqual('1073741824\n', process.execute('echo', units.Gi))

    def test_stdin_and_binary(self):
        self.assertEqual('fed to it', process.execute('cat',
                                                      stdin='fed to it'))
        self.assertEqual(b'\xff\x00', process.execute(
            'printf', '\\377\\000', binary=True))

    def test_cwd(self):
        tmp = self.useFixture(fixtures.TempDir()).path
        self.assertEqual(tmp, process.execute('pwd', cwd=tmp).strip())

    def test_false_is_a_typed_failure(self):
        exc = self.assertRaises(exception.ProcessFailed, process.execute,
                                'false')
        self.assertEqual(1, exc.exit_code)
        self.assertEqual('false', exc.cmd)
        self.assertEqual('', exc.stderr)
        self.assertEqual('false failed with exit code 1 and no error output',
                         str(exc))

    def test_exit_code_stderr_stdout_are_carried(self):
        script = 'echo said >&2; echo printed; exit 3'
        exc = self.assertRaises(exception.ProcessFailed, process.execute,
                                'sh', '-c', script)
        self.assertEqual(3, exc.exit_code)
        self.assertEqual('said', exc.stderr)
        self.assertEqual('printed\n', exc.stdout)
        # The command as the caller wrote it, without env or prlimit.
        self.assertEqual('sh -c ' + script, exc.cmd)
        self.assertEqual('sh -c %s failed with exit code 3: said' % script,
                         str(exc))
        # nova records it as an instance fault like its own errors.
        self.assertIsInstance(exc, exception.PreallocError)

    def test_missing_command(self):
        for limits in (None, process.Limits(cpu_time=10)):
            exc = self.assertRaises(exception.ProcessFailed, process.execute,
                                    'prealloc-no-such-command', '--x',
                                    limits=limits)
            # env's "command not found" exit code.
            self.assertEqual(127, exc.exit_code, limits)
            self.assertIn('prealloc-no-such-command', exc.stderr)
            self.assertIn('No such file or directory', str(exc))

    def test_cannot_start_is_the_same_failure(self):
        # Popen itself fails (OSError): still ProcessFailed, no exit code.
        missing = os.path.join(self.useFixture(fixtures.TempDir()).path,
                               'gone')
        exc = self.assertRaises(exception.ProcessFailed, process.execute,
                                'true', cwd=missing)
        self.assertIsNone(exc.exit_code)
        self.assertIn(missing, str(exc))

    def test_c_locale_whatever_the_callers(self):
        self.useFixture(fixtures.EnvironmentVariable('LC_ALL',
                                                     'de_DE.UTF-8'))
        self.useFixture(fixtures.EnvironmentVariable('LANG', 'fr_FR.UTF-8'))
        self.useFixture(fixtures.EnvironmentVariable('PREALLOC_TEST_VAR',
                                                     'kept'))
        for limits in (None, process.Limits(cpu_time=10)):
            self.assertEqual(
                'C C kept\n', process.execute(
                    'sh', '-c', 'echo $LC_ALL $LANG $PREALLOC_TEST_VAR',
                    limits=limits), limits)

    def test_timeout_kills_and_reaps(self):
        tmp = self.useFixture(fixtures.TempDir()).path
        for n, limits in enumerate((None, process.Limits(cpu_time=10))):
            pidfile = os.path.join(tmp, 'pid%d' % n)
            # The shell writes its pid, then becomes sleep (same pid).
            exc = self.assertRaises(
                exception.ProcessTimeout, process.execute, 'sh', '-c',
                'echo $$ > %s; exec sleep 60' % pidfile, timeout=3,
                limits=limits)
            # No bound on the time taken (it depends on the
            # machine): a timeout not applied would let sleep end and
            # execute return, failing assertRaises; one applied but not
            # killing would leave the pid alive (below).
            self.assertIn('did not finish within 3 s', str(exc))
            self.assertTrue(exc.cmd.startswith('sh -c echo'), exc.cmd)
            with open(pidfile) as f:
                pid = int(f.read())
            # Killed and reaped: not even a zombie is left.
            self.assertRaises(ProcessLookupError, os.kill, pid, 0)
            self.assertFalse(os.path.exists('/proc/%d' % pid))

    def test_timeout_without_eventlet(self):
        # This test process runs under nova's eventlet monkey patching
        # (tests/__init__.py); nova-compute may run in threading mode,
        # where processutils raises the standard TimeoutExpired: a fresh
        # interpreter that never imports eventlet.
        code = ('import sys\n'
                'from prealloc_backend import exception\n'
                'from prealloc_backend.system import process\n'
                'try:\n'
                '    process.execute("sleep", "60", timeout=0.5)\n'
                'except exception.ProcessTimeout as exc:\n'
                '    print(exc)\n'
                'print("eventlet" in sys.modules)\n')
        out = process.execute(sys.executable, '-c', code, timeout=120)
        self.assertEqual('sleep 60 did not finish within 0.5 s; it was '
                         'killed\nFalse\n', out)

    def test_no_timeout_when_it_finishes(self):
        self.assertEqual('done\n', process.execute(
            'sh', '-c', 'sleep 0.2; echo done', timeout=30))

    def test_address_space_limit(self):
        # An anonymous mapping of 512 MiB (never touched: costs no memory).
        code = 'import mmap; mmap.mmap(-1, 512 << 20); print("mapped")'
        self.assertEqual('mapped\n', process.execute(sys.executable, '-c',
                                                     code))
        exc = self.assertRaises(
            exception.ProcessFailed, process.execute, sys.executable, '-c',
            code, limits=process.Limits(address_space=256 * units.Mi))
        self.assertEqual(1, exc.exit_code)
        self.assertIn('Cannot allocate memory', exc.stderr)

    def test_cpu_time_limit_kills(self):
        # nova's images_cpu_time_limit: at the limit the kernel sends
        # SIGKILL (soft = hard), which qemu.py reports as the prlimit's.
        exc = self.assertRaises(
            exception.ProcessFailed, process.execute, sys.executable, '-c',
            'while True: pass', limits=process.Limits(cpu_time=1),
            timeout=60)
        self.assertEqual(-9, exc.exit_code)


def _pid_and_args(*args):
    return [os.getpid()] + list(args)


def _raises():
    raise exception.PreallocError('refused: /x')


def _stop_self():
    os.kill(os.getpid(), signal.SIGSTOP)
    return 'resumed'


def _sleep_long():
    time.sleep(3600)


class CallInChildTestCase(base.BaseTestCase):

    def test_result_from_another_process(self):
        reply, status = process.call_in_child(_pid_and_args, 'a', 2,
                                              deadline=60)
        self.assertEqual(0, status)
        pid, *args = reply['result']
        self.assertNotEqual(os.getpid(), pid)
        self.assertEqual(['a', 2], args)

    def test_error_named_with_its_message(self):
        reply, status = process.call_in_child(_raises, deadline=60)
        self.assertEqual('PreallocError', reply['error'])
        self.assertIn('refused: /x', reply['message'])
        self.assertIn('Traceback', reply['traceback'])
        self.assertNotEqual(0, status)

    def test_answer_too_long_is_no_answer(self):
        reply, _status = process.call_in_child(lambda: 'x' * 5000,
                                               max_answer=4096, deadline=60)
        self.assertIsNone(reply)
        reply, _status = process.call_in_child(lambda: 'x' * 4000,
                                               max_answer=4096, deadline=60)
        self.assertEqual('x' * 4000, reply['result'])

    def test_deadline_is_required(self):
        self.assertRaises(TypeError, process.call_in_child, _raises)
        for bad in (None, 0, -1):
            self.assertRaises(ValueError, process.call_in_child, _raises,
                              deadline=bad)

    def _record_forks(self):
        """The pids of the children os.fork makes from now on (a list)."""
        pids = []
        real_fork = os.fork

        def fork():
            pid = real_fork()
            if pid:
                pids.append(pid)
            return pid

        self.useFixture(fixtures.MonkeyPatch('os.fork', fork))
        return pids

    def _assert_killed_and_reaped(self, func, what, deadline=1):
        pids = self._record_forks()
        started = time.monotonic()
        exc = self.assertRaises(exception.ProcessTimeout,
                                process.call_in_child, func,
                                deadline=deadline, what=what)
        took = time.monotonic() - started
        self.assertIn(what, exc.format_message())
        self.assertIn('within %s s' % deadline, exc.format_message())
        self.assertLess(took, deadline + process.KILL_WAIT)
        self.assertGreaterEqual(took, deadline)
        # Killed and reaped: no such child left, not even a zombie.
        self.assertEqual(1, len(pids))
        self.assertRaises(ChildProcessError, os.waitpid, pids[0],
                          os.WNOHANG)
        self.assertFalse(os.path.exists('/proc/%d' % pids[0]))

    def test_stopped_child_is_killed_at_the_deadline(self):
        # What the nova user does to a child that dropped to it.
        self._assert_killed_and_reaped(_stop_self, 'the stopped step')

    def test_silent_child_is_killed_at_the_deadline(self):
        self._assert_killed_and_reaped(_sleep_long, 'the slow step')

    def test_interrupted_wait_kills_and_reaps(self):
        pids = self._record_forks()

        def interrupt(*_args):
            raise KeyboardInterrupt()

        old = signal.signal(signal.SIGALRM, interrupt)
        self.addCleanup(signal.signal, signal.SIGALRM, old)
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        self.addCleanup(signal.setitimer, signal.ITIMER_REAL, 0)
        self.assertRaises(KeyboardInterrupt, process.call_in_child,
                          _stop_self, deadline=60)
        self.assertRaises(ChildProcessError, os.waitpid, pids[0],
                          os.WNOHANG)


class OnlyRunnerTestCase(base.BaseTestCase):
    """process.py is the only module of the package that starts a process;
    the privileged daemon's modules (privsep/) start none at all.
    """

    OS_RUNNERS = ('system', 'popen', 'fork', 'forkpty', 'posix_spawn',
                  'posix_spawnp', 'execv', 'execve', 'execvp', 'execvpe',
                  'execl', 'execle', 'execlp', 'execlpe', 'spawnv',
                  'spawnve', 'spawnvp', 'spawnvpe', 'spawnl', 'spawnle',
                  'spawnlp', 'spawnlpe')
    MODULES = ('subprocess', 'pty', 'multiprocessing',
               'asyncio.subprocess')

    def runners(self, tree):
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [a.name for a in node.names
                          if a.name in self.MODULES]
            elif isinstance(node, ast.ImportFrom):
                if node.module in self.MODULES:
                    found.append(node.module)
            elif isinstance(node, ast.Attribute) and isinstance(
                    node.value, ast.Name):
                name = '%s.%s' % (node.value.id, node.attr)
                if name == 'processutils.execute' or (
                        node.value.id == 'os' and
                        node.attr in self.OS_RUNNERS):
                    found.append(name)
        return found

    def test_no_other_runner(self):
        found, checked = {}, 0
        for rel, tree in pb_fixtures.package_trees():
            checked += 1
            runners = self.runners(tree)
            if runners and rel != os.path.join('system', 'process.py'):
                found[rel] = runners
        self.assertGreater(checked, 30)
        self.assertEqual({}, found)

    def test_the_walker_sees_runners(self):
        # Control for the test above: each kind of runner is seen.
        tree = ast.parse('import subprocess\n'
                         'from multiprocessing import Process\n'
                         'processutils.execute("x")\n'
                         'os.execv("/bin/x", [])\n'
                         'os.system("x")\n')
        self.assertEqual(['subprocess', 'multiprocessing',
                          'processutils.execute', 'os.execv', 'os.system'],
                         self.runners(tree))
