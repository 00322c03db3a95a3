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

""".ci/summary.py, the closing line of tools/run-tests, on a real stestr
repository made by a real stestr run of a small test package.
"""

import os
import subprocess
import sys
import textwrap

from tests import base

TOP = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

SAMPLE = textwrap.dedent('''\
    import logging

    import fixtures
    import testtools


    class Sample(testtools.TestCase):
        def setUp(self):
            super().setUp()
            self.useFixture(fixtures.FakeLogger())

        def test_passes(self):
            pass

        def test_skipped(self):
            self.skipTest('not here')

        def test_fails(self):
            logging.getLogger('sample').warning('a log line, not the cause')
            self.assertEqual(1, 2, 'the cause of the failure')

        def test_errors(self):
            raise RuntimeError('an error in the test')

        def test_long_line(self):
            self.assertEqual(b'', b'x' * 100000)


    class Broken(testtools.TestCase):
        @classmethod
        def setUpClass(cls):
            raise RuntimeError('the class could not be set up')

        def test_never_runs(self):
            pass
    ''')


CRASH = textwrap.dedent('''\
    import os

    import testtools


    # test_a before test_b: one worker (a 1-CPU machine) runs them in
    # that order, so the passing test runs before the worker goes down.
    class Crash(testtools.TestCase):
        def test_a_passes(self):
            pass

        def test_b_crashes(self):
            os._exit(3)
    ''')


MANY = textwrap.dedent('''\
    import testtools


    class Many(testtools.TestCase):
        pass


    for n in range(%d):
        setattr(Many, 'test_%%02d' %% n,
                lambda self, n=n: self.fail('failure %%d' %% n))
    ''')


class SummaryTestCase(base.TestCase):

    def _run(self, *tiers, many=0, sample=SAMPLE):
        """Run the ``sample`` tests (and ``many`` more failing ones) with
        stestr, then summary.py with ``tiers`` (ENV=EXIT_CODE:RUN_ID), in
        a directory of its own whose .tox/py3 is this tier's virtualenv
        (summary.py takes its stestr and subunit tools from there).
        """
        top = self.instances_path
        os.makedirs(os.path.join(top, 'sample'))
        with open(os.path.join(top, 'sample', '__init__.py'), 'w'):
            pass
        with open(os.path.join(top, 'sample', 'test_sample.py'), 'w') as f:
            f.write(sample)
        if many:
            with open(os.path.join(top, 'sample', 'test_many.py'),
                      'w') as f:
                f.write(MANY % many)
        with open(os.path.join(top, '.stestr.conf'), 'w') as f:
            f.write('[DEFAULT]\ntest_path=./sample\ntop_dir=./\n')
        os.makedirs(os.path.join(top, '.tox'))
        os.symlink(sys.prefix, os.path.join(top, '.tox', 'py3'))
        bin_dir = os.path.dirname(sys.executable)
        run = subprocess.run([os.path.join(bin_dir, 'stestr'), 'run'],
                             cwd=top, capture_output=True, text=True,
                             timeout=120)
        self.assertEqual(1, run.returncode, run.stdout[-2000:])
        return subprocess.run(
            [sys.executable, os.path.join(TOP, '.ci', 'summary.py')]
            + list(tiers), cwd=top, capture_output=True, text=True,
            timeout=120)

    def test_failed_tests_named_before_the_closing_line(self):
        proc = self._run('pep8=0:none', 'py3=1:0')
        self.assertEqual(1, proc.returncode, proc.stderr)
        lines = proc.stdout.splitlines()
        self.assertEqual('1 passed, 4 failed, 1 skipped', lines[-1])
        out = '\n'.join(lines[:-1])
        named = sorted(line for line in lines if 'FAILED in tier' in line)
        self.assertEqual(
            ['summary: sample.test_sample.Sample.test_errors FAILED in '
             'tier py3:',
             'summary: sample.test_sample.Sample.test_fails FAILED in '
             'tier py3:',
             'summary: sample.test_sample.Sample.test_long_line FAILED in '
             'tier py3:',
             'summary: setUpClass (sample.test_sample.Broken) FAILED in '
             'tier py3:'], named)
        # Each with the end of its own traceback, not its log.
        self.assertIn('1 != 2: the cause of the failure', out)
        self.assertIn('RuntimeError: an error in the test', out)
        self.assertIn('RuntimeError: the class could not be set up', out)
        self.assertNotIn('a log line', out)
        self.assertNotIn('test_passes', out)
        self.assertNotIn('test_skipped', out)
        # The line of 100000 characters is cut.
        self.assertLess(max(len(line) for line in lines), 400)
        self.assertIn('characters cut]', out)
        # The traceback lines come right after the test that raised them.
        fails = lines.index('summary: sample.test_sample.Sample.test_fails '
                            'FAILED in tier py3:')
        nxt = next((i for i in range(fails + 1, len(lines))
                    if not lines[i].startswith('    ')), len(lines))
        self.assertIn('the cause of the failure',
                      '\n'.join(lines[fails:nxt]))

    def test_tier_named_by_its_run_id(self):
        proc = self._run('pep8=0:none', 'docs=0:none', 'functional=1:0')
        self.assertIn('Sample.test_fails FAILED in tier functional:',
                      proc.stdout)

    def test_run_no_tier_claims(self):
        """A run id no ENV=CODE:RUN_ID names is still counted and named."""
        proc = self._run('pep8=0:none')
        self.assertEqual(1, proc.returncode, proc.stderr)
        self.assertEqual('1 passed, 4 failed, 1 skipped',
                         proc.stdout.splitlines()[-1])
        self.assertIn('Sample.test_fails FAILED in tier run 0:',
                      proc.stdout)

    def test_tier_failed_outside_its_tests(self):
        """pep8 (no stestr run) failed, then py3's tests: both counted."""
        proc = self._run('pep8=1:none', 'py3=1:0')
        self.assertEqual(1, proc.returncode)
        self.assertEqual('1 passed, 5 failed, 1 skipped',
                         proc.stdout.splitlines()[-1])
        self.assertIn('tox env pep8 failed (exit code 1) with no failing '
                      'test recorded', proc.stderr)

    def test_many_failures(self):
        """Past the first 10, names only; past 50, a count."""
        proc = self._run('py3=1:0', many=60)
        lines = proc.stdout.splitlines()
        self.assertEqual('1 passed, 64 failed, 1 skipped', lines[-1])
        named = [line for line in lines if 'FAILED in tier' in line]
        self.assertEqual(50, len(named))
        self.assertEqual(10, len([line for line in named
                                  if line.endswith(':')]))
        self.assertEqual(10, len([line for line in lines
                                  if 'Traceback' in line]))
        self.assertEqual('summary: 14 more failed in tier py3: its log '
                         'names them', lines[-2])

    def test_crashed_test_named(self):
        """A test that took its worker down has no traceback: it is named
        with what its report holds.
        """
        proc = self._run('py3=1:0', sample=CRASH)
        self.assertEqual(1, proc.returncode, proc.stderr)
        lines = proc.stdout.splitlines()
        self.assertEqual('1 passed, 1 failed, 0 skipped', lines[-1])
        self.assertEqual(['summary: sample.test_sample.Crash.test_b_crashes '
                          'FAILED in tier py3:'],
                         [line for line in lines if 'FAILED' in line])
        self.assertNotIn('Traceback', proc.stdout)
