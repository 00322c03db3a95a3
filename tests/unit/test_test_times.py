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

"""tools/test_times.py: the recorded durations run-tests gives stestr, run
as run-tests runs it (a process of the machine's Python), read back by
stestr's own repository and scheduler.
"""

import os
import subprocess
import sys

from stestr.repository import file as stestr_file
from stestr import scheduler

from tests import base

TOP = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPT = os.path.join(TOP, 'tools', 'test_times.py')

TIMES = '''# a comment
10.0 tests.a.A.test_long
9.0 tests.a.A.test_long_too
6.0 tests.b.B.test_middle
5.0 tests.b.B.test_short(a scenario)
'''


class TestTimesTestCase(base.TestCase):

    def setUp(self):
        super().setUp()
        self.top = os.path.join(self.instances_path, 'top')
        os.mkdir(self.top)
        self.times = os.path.join(self.instances_path, 'times.txt')
        with open(self.times, 'w') as f:
            f.write(TIMES)

    def tool(self, *args, check=True):
        return subprocess.run([sys.executable, SCRIPT] + list(args),
                              capture_output=True, text=True, check=check)

    def test_stestr_deals_by_the_seeded_times(self):
        self.tool('seed', self.times, self.top)
        repo = stestr_file.RepositoryFactory().open(self.top)
        ids = ['tests.a.A.test_long', 'tests.a.A.test_long_too',
               'tests.b.B.test_middle', 'tests.b.B.test_short(a scenario)',
               'tests.c.C.test_new']
        self.assertEqual({'tests.a.A.test_long': 10.0,
                          'tests.a.A.test_long_too': 9.0,
                          'tests.b.B.test_middle': 6.0,
                          'tests.b.B.test_short(a scenario)': 5.0},
                         repo.get_test_times(ids)['known'])
        # No run yet: the tiers' first run is 0 (run-tests' run ids).
        self.assertEqual(0, repo.count())
        # The longest first, each to the worker with the least: 10+5 and
        # 9+6 (in turn by name: 10+6 and 9+5); the new one after them.
        parts = scheduler.partition_tests(ids, 2, repo, None)
        self.assertEqual(
            [{'tests.a.A.test_long', 'tests.b.B.test_short(a scenario)'},
             {'tests.a.A.test_long_too', 'tests.b.B.test_middle'}],
            sorted((set(p) - {'tests.c.C.test_new'} for p in parts),
                   key=sorted))
        self.assertEqual(1, sum('tests.c.C.test_new' in p for p in parts))

    def test_saved_as_read(self):
        # What a whole run's repository also holds: short tests and the
        # cloud tier's Tempest tests, left out.
        with open(self.times, 'a') as f:
            f.write('0.5 tests.a.A.test_quick\n'
                    '30.0 tempest.api.compute.T.test_x\n')
        self.tool('seed', self.times, self.top)
        saved = self.tool('save', self.top).stdout
        self.assertEqual(
            TIMES.split('\n', 1)[1],
            ''.join(line + '\n' for line in saved.splitlines()
                    if not line.startswith('#')))

    def test_existing_repository_left_alone(self):
        os.mkdir(os.path.join(self.top, '.stestr'))
        marker = os.path.join(self.top, '.stestr', 'next-stream')
        with open(marker, 'w') as f:
            f.write('7\n')
        result = self.tool('seed', self.times, self.top, check=False)
        self.assertNotEqual(0, result.returncode)
        with open(marker) as f:
            self.assertEqual('7\n', f.read())

    def test_bad_line_named(self):
        with open(self.times, 'a') as f:
            f.write('tests.a.A.test_no_seconds\n')
        result = self.tool('seed', self.times, self.top, check=False)
        self.assertNotEqual(0, result.returncode)
        self.assertIn(':6:', result.stderr)
        self.assertIn('tests.a.A.test_no_seconds', result.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.top, '.stestr')))
