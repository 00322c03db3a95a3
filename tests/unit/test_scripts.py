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

"""The shell scripts of tools/ and .ci/ (and tox.ini's commands): every
``timeout`` also kills (--kill-after), and tools/common.sh's run_stoppable
(tools/quickstart's bench) stops its command on the first SIGINT or
SIGTERM the script gets (issue 36).
"""

import os
import re
import signal
import subprocess
import sys
import time

from tests import base

TOP = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

# ``timeout`` run as a command (not shutdown_timeout = 0, --timeout 600):
# the word, then its options and its duration.
TIMEOUT = re.compile(r'(?<![-\w.$/])timeout((?:\s+-\S+)*)\s+\d')


def _scripts():
    paths = [os.path.join(TOP, 'tox.ini')]
    for folder in ('tools', '.ci'):
        for name in sorted(os.listdir(os.path.join(TOP, folder))):
            path = os.path.join(TOP, folder, name)
            if os.path.isfile(path):
                paths.append(path)
    return paths


class TimeoutTestCase(base.TestCase):

    def test_every_timeout_kills(self):
        # A command that ignores or outlives SIGTERM (virsh stuck on a
        # socket, stestr's workers) must not outlive its limit.
        found = 0
        for path in _scripts():
            with open(path) as f:
                text = f.read()
            for match in TIMEOUT.finditer(text):
                found += 1
                line = text.count('\n', 0, match.start()) + 1
                self.assertRegex(
                    match.group(1), r'--kill-after=\d+|-k\s*\d',
                    '%s:%d: %s' % (os.path.relpath(path, TOP), line,
                                   match.group(0)))
        # The pattern finds them (tox.ini alone has several).
        self.assertGreater(found, 10)

    def test_the_pattern(self):
        for text in ('timeout 20 virsh', '$(timeout 20 virsh',
                     'x && timeout --kill-after=5 20 virsh',
                     '  timeout -k 5 20 x'):
            self.assertTrue(TIMEOUT.search(text), text)
        for text in ('shutdown_timeout = 0', '--timeout 600 --chdir',
                     'build_timeout = 300', 'OS_TEST_TIMEOUT=300'):
            self.assertFalse(TIMEOUT.search(text), text)


# Stands for the bench: records the signals it gets, ends on SIGTERM (once
# $GO exists, where the test sets it: run_stoppable's traps stay set until
# it ends).
CHILD = r'''
import os, signal, sys, time
got = []


def term(signum, frame):
    got.append(signum)
    print('term', file=sys.stderr, flush=True)


signal.signal(signal.SIGTERM, term)
print('ready', file=sys.stderr, flush=True)
deadline = time.monotonic() + 10
while not got and time.monotonic() < deadline:
    time.sleep(0.01)
go = os.environ.get('GO')
while go and not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.01)
print('got %s' % got)
sys.exit(1)
'''

SCRIPT = r'''
PROG=test
. "$TOP/tools/common.sh"
run_stoppable "$OUT" "$PYTHON" -c "$CHILD"
echo "status=$RUN_STATUS stopped=$RUN_STOPPED"
'''


class RunStoppableTestCase(base.TestCase):

    def run_script(self, *signals):
        out = os.path.join(self.instances_path, 'out')
        go = os.path.join(self.instances_path, 'go')
        env = dict(os.environ, TOP=TOP, OUT=out, PYTHON=sys.executable,
                   CHILD=CHILD, GO=go)
        proc = subprocess.Popen(['bash', '-c', SCRIPT], env=env,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        self.addCleanup(proc.communicate)
        self.assertEqual('ready\n', proc.stderr.readline())
        started = time.monotonic()
        # To the script only, as `kill` or a supervisor would send it.
        for i, signum in enumerate(signals):
            proc.send_signal(signum)
            if i == 0:
                # The next signal only once the script's trap ran (it
                # decides, then stops the child): a fixed sleep let a
                # starved box hold both pending, and bash runs pending
                # traps in signal-number order. The child ends only
                # after the last one was sent, so each lands while the
                # traps are set.
                self.assertEqual('term\n', proc.stderr.readline())
        open(go, 'w').close()
        stdout, stderr = proc.communicate(timeout=20)
        self.assertLess(time.monotonic() - started, 5, stderr)
        self.assertEqual(0, proc.returncode, stderr)
        with open(out) as f:
            return stdout, f.read()

    def test_sigterm(self):
        stdout, child = self.run_script(signal.SIGTERM)
        self.assertEqual('status=1 stopped=143\n', stdout)
        self.assertEqual('got [15]\n', child)

    def test_sigint_is_sent_on_as_sigterm(self):
        stdout, child = self.run_script(signal.SIGINT)
        self.assertEqual('status=1 stopped=130\n', stdout)
        self.assertEqual('got [15]\n', child)

    def test_the_first_signal_decides(self):
        stdout, _child = self.run_script(signal.SIGTERM, signal.SIGINT)
        self.assertEqual('status=1 stopped=143\n', stdout)

    def test_no_signal(self):
        out = os.path.join(self.instances_path, 'out')
        env = dict(os.environ, TOP=TOP, OUT=out, PYTHON=sys.executable,
                   CHILD='print("hello")')
        proc = subprocess.run(['bash', '-c', SCRIPT], env=env,
                              capture_output=True, text=True, timeout=20)
        self.assertEqual('status=0 stopped=\n', proc.stdout, proc.stderr)
        with open(out) as f:
            self.assertEqual('hello\n', f.read())

    def test_the_whole_tree_is_stopped(self):
        # As tox does: the command dies on SIGTERM but leaves what it
        # started (here a sleep in its own session, as GNU timeout's
        # command is in its own group) running; run-tests' tiers must not
        # outlive a stop.
        out = os.path.join(self.instances_path, 'out')
        pidfile = os.path.join(self.instances_path, 'grandchild')
        child = ('import subprocess, sys, time\n'
                 'p = subprocess.Popen(["sleep", "60"], '
                 'start_new_session=True)\n'
                 'open(%r, "w").write(str(p.pid))\n'
                 'print("ready", file=sys.stderr, flush=True)\n'
                 'time.sleep(60)\n' % pidfile)
        env = dict(os.environ, TOP=TOP, OUT=out, PYTHON=sys.executable,
                   CHILD=child)
        proc = subprocess.Popen(['bash', '-c', SCRIPT], env=env,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        self.addCleanup(proc.communicate)
        self.assertEqual('ready\n', proc.stderr.readline())
        with open(pidfile) as f:
            grandchild = int(f.read())
        self.addCleanup(_kill_quietly, grandchild)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=20)
        self.assertTrue(stdout.endswith(' stopped=143\n'), (stdout, stderr))
        deadline = time.monotonic() + 5
        while _running(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse(_running(grandchild),
                         'the command\'s own child outlived the stop')


def _running(pid):
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


def _kill_quietly(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
