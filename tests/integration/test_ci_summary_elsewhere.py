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

""".ci/summary.py with a run counted elsewhere (ENV=CODE:counts=P,F,S: the
second platform's run-tests, tools/run-tests' PREALLOC_PLATFORM2): its
counts are added to the closing line and decide the exit status.
"""

import os
import subprocess
import sys

from tests import base

TOP = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


class CountedElsewhereTestCase(base.TestCase):

    def _summary(self, *tiers):
        # A directory with no .stestr: only the counted run is summed.
        return subprocess.run(
            [sys.executable, os.path.join(TOP, '.ci', 'summary.py')]
            + list(tiers), cwd=self.instances_path, capture_output=True,
            text=True, timeout=120)

    def test_counts_added(self):
        proc = self._summary('platform2=0:counts=12,0,3')
        self.assertEqual('12 passed, 0 failed, 3 skipped',
                         proc.stdout.splitlines()[-1])
        self.assertEqual(0, proc.returncode, proc.stderr)

    def test_its_failures_counted_once(self):
        # Its failed tests are the tier's failure: not one more for its
        # exit code.
        proc = self._summary('platform2=1:counts=12,2,3')
        self.assertEqual('12 passed, 2 failed, 3 skipped',
                         proc.stdout.splitlines()[-1])
        self.assertEqual(1, proc.returncode)

    def test_failed_with_no_closing_line(self):
        proc = self._summary('platform2=1:none')
        self.assertEqual('0 passed, 1 failed, 0 skipped',
                         proc.stdout.splitlines()[-1])
        self.assertEqual(1, proc.returncode)
