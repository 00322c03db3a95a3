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

"""prealloc_backend/bench/report.py: ratios, number formats, tables and
the JSON file (targets and whole reports are in tests/unit/test_bench.py).
"""

import json
import os

from prealloc_backend.bench import report
from tests import base


def case(variant, samples, group='g'):
    return {'variant': variant, 'group': group, 'samples': samples}


class ReportTestCase(base.TestCase):

    def test_ratio(self):
        self.assertEqual(0.5, report.ratio(1, 2))
        self.assertIsNone(report.ratio(None, 2))
        self.assertIsNone(report.ratio(1, 0))
        self.assertIsNone(report.ratio(1, None))

    def test_add_ratios_pairs_within_a_group(self):
        workload = {'references': ['ref'], 'cases': [
            case('ref', [2, 4]), case('x', [1, 8]),
            case('ref', [10, 10], group='h'), case('x', [5, None], 'h')]}
        report.add_ratios(workload)
        ref, x, _ref_h, x_h = workload['cases']
        self.assertEqual({}, ref['ratios'])
        self.assertEqual([0.5, 2.0], x['ratios']['ref']['samples'])
        self.assertEqual(1.25, x['ratios']['ref']['median'])
        self.assertEqual([0.5], x_h['ratios']['ref']['samples'])
        self.assertIs(x_h, report.find(workload, 'x', 'h'))
        self.assertIsNone(report.find(workload, 'y'))

    def test_formats(self):
        for value, text in ((None, '-'), (12345.6, '12346'), (7.0, '7'),
                            (12.34, '12.3'), (1.234, '1.23'),
                            (0.01234, '0.012'), (0.0000123, '0.00001')):
            self.assertEqual(text, report.fmt_number(value), value)
        self.assertEqual('2.50 s', report.fmt_kind(2.5, 'seconds'))
        self.assertEqual('1 KiB', report.fmt_kind(1024, 'bytes'))
        self.assertEqual('745 [712-760]', report.fmt_spread(
            {'median': 745, 'min': 712, 'max': 760, 'n': 3}))
        self.assertEqual('745', report.fmt_spread(
            {'median': 745, 'min': 745, 'max': 745, 'n': 1}))
        self.assertEqual('-', report.fmt_spread({'median': None}))
        self.assertEqual('0.97', report.fmt_ratio(0.9712))

    def test_table(self):
        self.assertEqual(['  name     v', '  ------  --', '  a        1',
                          '  longer  22'],
                         report.table(['name', 'v'], [['a', '1'],
                                                      ['longer', '22']]))

    def test_errors_and_json(self):
        good = {'workloads': [{'error': None, 'cases': [{'error': None}]}]}
        self.assertFalse(report.has_errors(good))
        bad = {'workloads': [{'error': None, 'cases': [{'error': 'x'}]}]}
        self.assertTrue(report.has_errors(bad))
        path = os.path.join(self.instances_path, 'r.json')
        report.write_json(bad, path)
        with open(path) as f:
            self.assertEqual(bad, json.load(f))
