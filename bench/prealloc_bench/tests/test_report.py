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

"""bench/prealloc_bench/report.py: ratios, number formats, tables and
the JSON file (targets and whole reports are in
prealloc_bench/tests/test_bench.py).
"""

import json
import os

from oslo_utils import units

from prealloc_bench import engine
from prealloc_bench import report
from prealloc_bench import variants
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


def row(variant, samples, created, allocated, group='default layout'):
    v = variants.by_key(variant)
    out = {'variant': variant, 'label': v.label, 'group': group,
           'skip': None, 'error': None, 'facts': {}, 'samples': samples,
           'extra': {'create_seconds': engine.summary([created]),
                     'allocated': engine.summary([allocated])}}
    out.update(engine.summary(samples))
    return out


def run(kind='quick'):
    """A run with the 4 KiB new-cluster writes: the plugin's modes at 10x,
    2x, 1x and 1x nova's overlay's IOPS; raw fallocated at 5x.
    """
    cases = [row('nova-none', [100.0], 0.25, 200 * units.Ki),
             row('raw-fallocated', [500.0], 0.01, 256 * units.Mi),
             row('plugin-none', [100.0], 0.25, 200 * units.Ki),
             row('plugin-metadata', [1000.0], 0.5, 2 * units.Mi),
             row('plugin-space', [200.0], 0.5, 256 * units.Mi)]
    workload = {'name': 'new-cluster-write', 'title': 'NC', 'unit': 'IOPS',
                'higher_is_better': True, 'engine': 'e', 'setup': 's',
                'error': None, 'references': ['raw-fallocated', 'nova-none'],
                'kind': 'write', 'default_groups': ['default layout'],
                'extra_columns': [], 'fact_columns': [], 'cases': cases}
    return {'run': kind, 'argv': ['--quick'],
            'config': {'reps': 1, 'write_disk': 256 * units.Mi},
            'date': 'd', 'privsep': 'p', 'seconds': 1.0,
            'host': {'hostname': 'h', 'kernel': 'k', 'cpus': 2, 'nova': 'n',
                     'prealloc_backend': 'p', 'qemu_img': 'q',
                     'directory': '/d', 'filesystem': 'ext4',
                     'free_bytes': units.Gi},
            'workloads': [workload]}


class SummaryTestCase(base.TestCase):

    def test_summary_rows(self):
        rows = report.summary_rows(report.finalize(run()))
        self.assertEqual(
            [('none', 1.0, 0.2, 0.25, 200 * units.Ki),
             ('metadata', 10.0, 2.0, 0.5, 2 * units.Mi),
             ('space', 2.0, 0.4, 0.5, 256 * units.Mi),
             ('full', None, None, None, None)],
            [(r['mode'], r['x_nova'], r['x_raw'], r['created'],
              r['reserved']) for r in rows])
        self.assertEqual([], report.summary_rows({'workloads': []}))

    def test_the_report_starts_with_the_summary(self):
        text = report.render(report.finalize(run('default')))
        lines = text.splitlines()
        start = lines.index(
            'Summary: 4 KiB first writes, each into a new cluster, of 256 '
            'MiB disks (the plugin\'s modes):')
        self.assertLess(start, lines.index('1. NC [new-cluster-write]'))
        table = lines[start + 1:start + 7]
        self.assertEqual(['mode', 'x', 'nova', 'overlay', 'x', 'raw',
                          'fallocated', 'created', 'in', 'reserved'],
                         table[0].split())
        self.assertEqual(['metadata', '10.00', '2.00', '0.500', 's', '2',
                          'MiB'], table[3].split())
        self.assertEqual(['full', '-', '-', '-', '-'], table[5].split())
        self.assertIn('above 1 is faster', lines[start + 7])
        # Each missing figure says why.
        self.assertEqual('  -: plugin-full not in this run', lines[start + 8])
        self.assertEqual('', lines[start + 9])
        for line in table:
            self.assertLessEqual(len(line), 79)
        # A quick run's summary has its own disks.
        result = run('quick')
        result['config']['new_cluster_disk'] = units.Gi
        self.assertIn('Summary: 4 KiB first writes, each into a new '
                      'cluster, of 1 GiB disks', report.render(result))

    def test_summary_says_why_a_figure_is_missing(self):
        result = run()
        cases = result['workloads'][0]['cases']
        cases[3].update(median=None, skip='not shown: too short')
        cases[1].update(median=None, error='boom')
        lines = report.summary_lines(report.finalize(result))
        self.assertEqual(['  -: plugin metadata skipped: not shown: too '
                          'short', '  -: plugin-full not in this run',
                          '  -: raw fallocated failed: boom'], lines[-3:])
        self.assertEqual(['metadata', '-', '-', '-', '-'],
                         lines[4].split())

    def test_a_quick_run_judges_no_target(self):
        result = report.finalize(run('quick'))
        self.assertEqual([], result['targets'])
        text = report.render(result)
        self.assertNotIn('MISSED', text)
        self.assertNotIn('[met', text)
        self.assertIn('Targets: not judged: a --quick run is indicative '
                      'only', text)
        self.assertIn('prealloc-bench --dir DIR', text)
        # The default run judges them, as before.
        result = report.finalize(run('default'))
        self.assertTrue(result['targets'])
        self.assertIn('Targets (median of the paired ratios',
                      report.render(result))
