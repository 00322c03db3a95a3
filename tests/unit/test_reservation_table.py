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

"""tools/reservation_table.py: the cloud tier's table of the reservation
after each step (the plugin's Tempest tests record it), run as the cloud
tier runs it: the machine's Python on a file of JSON lines.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

from tests import base

TOP = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPT = os.path.join(TOP, 'tools', 'reservation_table.py')
GiB = 1024 ** 3


def row(test, step, host, allocated, walk=None, at_policy=1.0):
    return {'test': test, 'walk': walk, 'step': step, 'host': host,
            'qemu': '10.0.13', 'host_mode': 'space', 'virtual': GiB,
            'allocated': allocated, 'unwritten': allocated - 4 * 1024 ** 2,
            'report_mode': 'space', 'report_allocated': allocated,
            'report_at_policy': at_policy}


class TestReservationTable(base.TestCase):

    def run_table(self, lines):
        with tempfile.NamedTemporaryFile('w', suffix='.jsonl',
                                         delete=False) as f:
            f.write(''.join(lines))
        self.addCleanup(os.unlink, f.name)
        return subprocess.run([sys.executable, SCRIPT, f.name],
                              capture_output=True, text=True, timeout=60)

    def body(self, out):
        """The table's rows (between its second and last rules), cut at
        the rules' columns.
        """
        lines = out.splitlines()
        rules = [i for i, line in enumerate(lines) if line.startswith('===')]
        self.assertEqual(3, len(rules), out)
        spans = [m.span() for m in re.finditer('=+', lines[rules[0]])]
        return [[line[a:b].strip() for a, b in spans]
                for line in lines[rules[1] + 1:rules[2]]]

    def test_steps_grouped_by_test_in_their_order(self):
        walk = 'PreallocReservationWalkTest.test_reservation_kept_from_x'
        trim = 'PreallocGuestTrimTest.test_guest_trim_on_the_first_host'
        lines = [json.dumps(r) + '\n' for r in (
            row(walk, 'create', 'h1', GiB + 1, walk='h1'),
            row(trim, 'guest TRIM', 'h2', GiB + 2),
            row(walk, 'stop/start', 'h1', GiB + 3, walk='h1'),
            row(walk, 'resize', 'h2', GiB - 1, walk='h1', at_policy=0.0))]
        proc = self.run_table(lines)
        self.assertEqual(0, proc.returncode, proc.stderr)
        body = self.body(proc.stdout)
        self.assertEqual(
            [['ReservationWalk (from h1)', 'create', 'h1 (10.0.13)', 'space',
              'space', '1024', '1024', '1020', 'yes', 'yes'],
             ['ReservationWalk (from h1)', 'stop/start', 'h1 (10.0.13)',
              'space', 'space', '1024', '1024', '1020', 'yes', 'yes'],
             # One byte short of the virtual size: not reserved.
             ['ReservationWalk (from h1)', 'resize', 'h2 (10.0.13)', 'space',
              'space', '1024', '1023', '1019', 'no', 'no'],
             ['GuestTrim', 'guest TRIM', 'h2 (10.0.13)', 'space', 'space',
              '1024', '1024', '1020', 'yes', 'yes']], body)

    def test_all_blocks_whatever_the_mode(self):
        thin = row('PreallocGuestTrimTest.test_x', 'guest TRIM', 'h1',
                   4 * 1024 ** 2 + 8192)
        thin['report_mode'] = 'metadata'
        full = row('PreallocAdoptTest.test_x', 'adoption', 'h1', GiB)
        full['report_mode'] = 'metadata'
        unknown = row('PreallocGuestTrimTest.test_x', 'guest TRIM', 'h1',
                      GiB)
        unknown['allocated'] = None
        proc = self.run_table([json.dumps(r) + '\n'
                               for r in (thin, full, unknown)])
        self.assertEqual(0, proc.returncode, proc.stderr)
        self.assertEqual(['no', '?', 'yes'],
                         [r[8] for r in self.body(proc.stdout)])

    def test_bad_line_named(self):
        proc = self.run_table(['{"test": "x"}\n', 'not json\n'])
        self.assertNotEqual(0, proc.returncode)
        self.assertIn(':2: not a JSON line', proc.stderr)
        self.assertIn("'not json'", proc.stderr)

    def test_empty_record(self):
        proc = self.run_table([])
        self.assertEqual(0, proc.returncode, proc.stderr)
        self.assertIn('no reservation recorded in', proc.stdout)
