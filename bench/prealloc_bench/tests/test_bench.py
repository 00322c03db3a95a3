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

"""``prealloc-bench``: its statistics, targets, report and tools.

The statistics (pairing by repetition, median and [min-max]) and the
targets are checked on hand-made results: no test here asserts a timing or
a measured ratio, those depend on the host. The tools run the real
qemu-img and qemu-io on small files; the disks are made through the
plugin's and nova's real backends. The real command run end to end (a
child process: it parses nova's global configuration) is in
tests/integration/test_bench_command.py; loop-mounted filesystems are in
tests/privileged/test_bench_small_fs.py.
"""

import argparse
import dataclasses
import errno
import io
import json
import os
import subprocess
import sys
from unittest import mock

import fixtures
from oslo_utils import units

from prealloc_backend.planner import qcow2_layout
from prealloc_bench import cmd as cmd_bench
from prealloc_bench import engine
from prealloc_bench import plot
from prealloc_bench import report
from prealloc_bench import tools
from prealloc_bench import variants
from prealloc_bench import workloads
from tests import base
from tests import fixtures as pb_fixtures

DEFAULT = engine.DEFAULT_GROUP


def case(variant, samples, group=DEFAULT, skip=None, error=None):
    """A result row as Workload.result() makes it, samples by repetition
    (None: no figure in that repetition).
    """
    v = variants.by_key(variant)
    row = {'variant': variant, 'label': v.label, 'family': v.family,
           'mode': v.mode, 'cluster_asked': v.cluster, 'group': group,
           'skip': skip, 'error': error, 'facts': {}, 'extra': {},
           'samples': list(samples)}
    row.update(engine.summary(row['samples']))
    return row


def workload(name, cases, unit='IOPS', higher=True, kind='write',
             references=('raw-fallocated', 'raw-zero-written', 'nova-none',
                         'nova-space'), default_groups=(DEFAULT,)):
    return {'name': name, 'title': name.title(), 'unit': unit,
            'higher_is_better': higher, 'engine': 'qemu-img bench',
            'setup': 'disks', 'error': None, 'seconds': 1.0,
            'references': list(references), 'kind': kind,
            'default_groups': list(default_groups),
            'extra_columns': [], 'fact_columns': [], 'cases': cases}


def result(workload_list, run='default'):
    return {'schema': engine.SCHEMA_VERSION, 'run': run,
            'argv': ['--dir', '/d'],
            'config': {'reps': 3, 'seq_bytes': 2 * units.Gi,
                       'write_disk': 2 * units.Gi},
            'date': '2026-11-23T00:00:00+00:00',
            'host': {'hostname': 'h', 'kernel': '6.1', 'cpus': 2,
                     'nova': '34.0.0', 'prealloc_backend': '1.0',
                     'qemu_img': '7.2', 'directory': '/d',
                     'filesystem': 'ext4', 'free_bytes': units.Gi,
                     'aio': 'native', 'cache': 'none'},
            'privsep': 'in-process', 'workloads': workload_list,
            'seconds': 12.0}


WARM = '1 TiB, warm'
COLD = '1 TiB, cold'
BEYOND = engine.BEYOND_GROUP


def reads(cases, disk_size=units.Ti):
    """The random-read workload's result: warm and cold groups."""
    w = workload('random-read', cases, unit='reads/s', kind=None,
                 references=('raw-sparse', 'nova-none'))
    w.update(disk_size=disk_size, warm_group=WARM, cold_group=COLD)
    return w


class StatsTestCase(base.TestCase):

    def test_summary_leaves_out_missing_repetitions(self):
        self.assertEqual({'median': 2, 'min': 1, 'max': 5, 'n': 3},
                         engine.summary([5, None, 1, 2]))
        self.assertEqual(2.5, engine.summary([4, 1, 2, 3])['median'])
        self.assertEqual({'median': None, 'min': None, 'max': None, 'n': 0},
                         engine.summary([None, None]))

    def test_ratios_are_paired_by_repetition(self):
        # The median of the paired ratios (2.0), not the ratio of the
        # medians (20 / 15): repetition 2 was slow for the variant and fast
        # for the reference, and must not be compared with another one.
        self.assertEqual([2.0, 0.5, 2.0],
                         engine.paired_ratios([10, 20, 30], [5, 40, 15]))
        # A repetition missing on either side (or a zero reference) pairs
        # with nothing.
        self.assertEqual([2.0], engine.paired_ratios([10, None, 30, 8],
                                                     [5, 40, None, 0]))

    def test_case_keeps_samples_by_repetition(self):
        row = engine.Case(variants.RAW_FALLOCATED)
        row.add(0, engine.Sample(1.0, {'allocated': 7}))
        row.add(2, engine.Sample(3.0, {'allocated': 9}))
        row._pad(3)
        self.assertEqual([1.0, None, 3.0, None], row.samples)
        self.assertEqual([7, None, 9], row.extra['allocated'])

    def test_rotated_starts_one_later_each_repetition(self):
        self.assertEqual(['a', 'b', 'c'], engine.rotated(['a', 'b', 'c'], 0))
        self.assertEqual(['b', 'c', 'a'], engine.rotated(['a', 'b', 'c'], 1))
        self.assertEqual(['a', 'b', 'c'], engine.rotated(['a', 'b', 'c'], 3))
        self.assertEqual([], engine.rotated([], 2))

    def test_fmt(self):
        self.assertEqual('1234', report.fmt_number(1234.4))
        self.assertEqual('0.123', report.fmt_number(0.1234))
        self.assertEqual('3', report.fmt_number(3.0))
        self.assertEqual('20 [10-30]', report.fmt_spread(
            engine.summary([10, 30, 20])))
        self.assertEqual('20', report.fmt_spread(engine.summary([20])))


class RatioTestCase(base.TestCase):

    def test_paired_ratios_within_group(self):
        w = workload('create', [
            case('nova-none', [1.0, 2.0, 4.0], '10 GiB'),
            case('plugin-metadata', [3.0, 2.0, 2.0], '10 GiB'),
            case('plugin-metadata', [6.0, 6.0, 6.0], '1 TiB')],
            unit='s', higher=False, kind=None, references=('nova-none',))
        report.add_ratios(w)
        paired = w['cases'][1]['ratios']['nova-none']
        self.assertEqual([3.0, 1.0, 0.5], paired['samples'])
        self.assertEqual((1.0, 0.5, 3.0, 3),
                         (paired['median'], paired['min'], paired['max'],
                          paired['n']))
        # No reference at 1 TiB: no ratio to one of another size.
        self.assertEqual({}, w['cases'][2]['ratios'])
        # A reference has no ratio to itself.
        self.assertEqual({}, w['cases'][0]['ratios'])

    def test_skipped_reference_gives_no_ratio(self):
        w = workload('seq-write', [
            case('raw-fallocated', [None] * 3, skip='cannot be reserved'),
            case('plugin-space', [10.0] * 3)])
        report.add_ratios(w)
        self.assertEqual({}, w['cases'][1]['ratios'])


def writes(name, none=0.97, full=0.97, metadata=0.95, space=0.95,
           groups=None):
    """A first-write workload whose plugin rows are the given multiples of
    their references in every repetition.
    """
    rows = [case('raw-fallocated', [100.0, 200.0, 100.0]),
            case('raw-zero-written', [100.0, 100.0, 200.0]),
            case('nova-none', [50.0, 50.0, 100.0]),
            case('plugin-none', [50.0 * none, 50.0 * none, 100.0 * none]),
            case('plugin-metadata', [100.0 * metadata, 200.0 * metadata,
                                     100.0 * metadata]),
            case('plugin-space', [100.0 * space, 200.0 * space,
                                  100.0 * space]),
            case('plugin-full', [100.0 * full, 100.0 * full, 200.0 * full])]
    for group, factor in (groups or {}).items():
        rows += [case('raw-fallocated', [100.0] * 3, group),
                 case('plugin-metadata@%s' % group.split()[0],
                      [100.0 * factor] * 3, group),
                 case('plugin-space@%s' % group.split()[0],
                      [100.0 * factor] * 3, group)]
    default_groups = [DEFAULT] + list(groups or {})
    return workload(name, rows, default_groups=default_groups)


def _target_of(target):
    return target['met'], target['decided']


class TargetTestCase(base.TestCase):

    def judged(self, workload_list):
        out = report.finalize(result(workload_list))['targets']
        return {t['name']: t for t in out}

    def test_every_target_of_the_issue(self):
        targets = self.judged([
            writes('seq-write', metadata=0.96, space=0.94),
            writes('new-cluster-write', none=0.5, full=0.9,
                   groups={'512K asked': 0.85}),
            writes('dense-4k-qd16', none=0.94),
            reads([
                case('raw-sparse', [1000.0, 2000.0, 1000.0], WARM),
                case('plugin-metadata', [950.0, 1700.0, 850.0], WARM),
                case('plugin-space', [None] * 3, WARM,
                     skip='cannot be reserved here: needs 1 TiB'),
                # The cold pass is shown, never judged.
                case('raw-sparse', [1000.0, 2000.0, 1000.0], COLD),
                case('plugin-metadata', [100.0, 100.0, 100.0], COLD)]),
            workload('create', [
                case('plugin-metadata', [1.0, 1.5, 2.5], '1 TiB')],
                unit='s', higher=False, kind=None,
                references=('nova-none',)),
        ])
        t = targets['64K sequential first writes: plugin metadata / raw '
                    'fallocated']
        self.assertEqual((True, '>=', 0.95), (t['met'], t['op'],
                                              t['target']))
        self.assertAlmostEqual(0.96, t['value'])
        self.assertFalse(targets['64K sequential first writes: plugin '
                                 'space / raw fallocated']['met'])
        # "at every default cluster size": the default group and a group
        # the plan picks by default at some size.
        self.assertTrue(targets['4K new-cluster writes (default layout): '
                                'plugin metadata / raw fallocated']['met'])
        t = targets['4K new-cluster writes (512K asked): plugin space / raw '
                    'fallocated']
        self.assertFalse(t['met'])
        self.assertAlmostEqual(0.85, t['value'])
        # none and full on every write pattern.
        self.assertTrue(targets['seq-write: plugin none / stock nova '
                                '(none)']['met'])
        self.assertFalse(targets['new-cluster-write: plugin none / stock '
                                 'nova (none)']['met'])
        self.assertFalse(targets['dense-4k-qd16: plugin none / stock nova '
                                 '(none)']['met'])
        self.assertFalse(targets['new-cluster-write: plugin full / raw '
                                 'zero-written']['met'])
        self.assertTrue(targets['seq-write: plugin full / raw '
                                'zero-written']['met'])
        # Paired: 0.95, 0.85, 0.85 -> 0.85 (the ratio of the medians would
        # be 950 / 1000 = 0.95, met).
        t = targets['random 4K reads over written data, 1 TiB, warm '
                    'metadata cache: plugin metadata / raw']
        self.assertAlmostEqual(0.85, t['value'])
        self.assertFalse(t['met'])
        self.assertEqual((0.85, 0.95, 3), (round(t['min'], 3),
                                           round(t['max'], 3), t['n']))
        # 0.85, 0.85, 0.95 against 0.9: missed on the median, undecided.
        self.assertIs(False, t['decided'])
        t = targets['random 4K reads over written data, 1 TiB, warm '
                    'metadata cache: plugin space / raw']
        self.assertIsNone(t['met'])
        self.assertIsNone(t['decided'])
        self.assertIsNone(t['value'])
        self.assertIn('plugin-space skipped: cannot be reserved', t['why'])
        t = targets['creating a 1 TiB metadata disk: seconds (median)']
        self.assertEqual((1.5, '<=', 2.0, True),
                         (t['value'], t['op'], t['target'], t['met']))
        # An upper bound: 1.0, 1.5, 2.5 s against <= 2.0: met, undecided.
        self.assertIs(False, t['decided'])

    def test_median_interval(self):
        # Distribution-free: (x(k), x(n+1-k)) holds the median with
        # probability 1 - 2 P(Binomial(n, 1/2) < k), at least 0.75 here.
        self.assertIsNone(report.median_interval([1.0, 2.0]))
        self.assertIsNone(report.median_interval([1.0, None, 2.0]))
        self.assertEqual((1.0, 3.0), report.median_interval([3.0, 1.0, 2.0]))
        five = [5.0, 1.0, 4.0, 2.0, 3.0]
        # (x2, x4) of 5 holds it with 0.625 only.
        self.assertEqual((1.0, 5.0), report.median_interval(five))
        self.assertEqual((2.0, 4.0), report.median_interval(five, 0.6))
        self.assertEqual((2.0, 6.0), report.median_interval(
            [7.0, 1.0, 6.0, 2.0, 5.0, 3.0, 4.0]))
        self.assertEqual((3.0, 8.0), report.median_interval(
            [float(v) for v in range(1, 11)]))

    def test_seven_repetitions_decide_past_one_outlier(self):
        # 0.90 once, 0.96-1.00 six times against 0.95: (x2, x6) of 7 lies
        # above the bound, where (min, max) would not.
        target = report._target('t', '>=', 0.95, value=0.97, spread={
            'min': 0.9, 'max': 1.0, 'n': 7,
            'samples': [0.9, 0.96, 0.97, 0.97, 0.98, 0.99, 1.0]})
        self.assertEqual((True, True), _target_of(target))
        target = report._target('t', '>=', 0.95, value=0.97, spread={
            'min': 0.9, 'max': 1.0, 'n': 3, 'samples': [0.9, 0.97, 1.0]})
        self.assertEqual((True, False), _target_of(target))

    def test_a_target_the_repetitions_straddle_is_undecided(self):
        # Against raw fallocated (100, 200, 100): metadata's paired ratios
        # 0.90, 0.97, 1.00 meet 0.95 on the median with one repetition
        # below it (undecided); space's 0.96 in every repetition does not.
        wl = writes('seq-write', space=0.96)
        wl['cases'] = [c for c in wl['cases']
                       if c['variant'] != 'plugin-metadata']
        wl['cases'].append(case('plugin-metadata', [90.0, 194.0, 100.0]))
        out = report.finalize(result([wl]))['targets']
        judged = {t['name']: t for t in out}
        t = judged['64K sequential first writes: plugin metadata / raw '
                   'fallocated']
        self.assertEqual((True, False), (t['met'], t['decided']))
        t = judged['64K sequential first writes: plugin space / raw '
                   'fallocated']
        self.assertEqual((True, True), (t['met'], t['decided']))
        lines = report.target_lines(out)
        self.assertIn('  [met?   ] 64K sequential first writes: plugin '
                      'metadata / raw fallocated: 0.970 [0.900-1.000] '
                      '(>= 0.95)', lines)
        self.assertIn('  [met    ] 64K sequential first writes: plugin '
                      'space / raw fallocated: 0.960 [0.960-0.960] '
                      '(>= 0.95)', lines)
        self.assertIn('  3 met, 1 met?, 5 n/a', lines)
        self.assertTrue(any(line.startswith('  ?: the 75% confidence '
                                            'interval of the median spans')
                            for line in lines))
        # One repetition decides nothing either way: no '?'.
        one = _target_of(report._target('x', '>=', 0.95, value=0.9,
                                         spread={'min': 0.9, 'max': 0.9,
                                                 'n': 1}))
        self.assertEqual((False, None), one)

    def test_unmeasured_targets_say_why(self):
        targets = self.judged([writes('seq-write')])
        t = targets['creating a 1 TiB metadata disk: seconds (median)']
        self.assertIsNone(t['met'])
        self.assertEqual('workload create not run', t['why'])
        t = targets['4K new-cluster writes (default layout): plugin '
                    'metadata / raw fallocated']
        self.assertEqual('workload new-cluster-write not run', t['why'])

    def test_creation_bound_missed(self):
        targets = self.judged([workload('create', [
            case('plugin-metadata', [2.1, 2.5, 1.9], '1 TiB')],
            unit='s', higher=False, kind=None)])
        self.assertFalse(targets['creating a 1 TiB metadata disk: seconds '
                                 '(median)']['met'])

    def test_reads_not_on_1_tib_are_not_judged(self):
        targets = self.judged([reads([
            case('raw-sparse', [1.0] * 3, WARM),
            case('plugin-metadata', [1.0] * 3, WARM)],
            disk_size=64 * units.Gi)])
        t = targets['random 4K reads over written data, 1 TiB, warm '
                    'metadata cache: plugin metadata / raw']
        self.assertIsNone(t['met'])
        self.assertEqual('the read disks are 64 GiB, not 1 TiB', t['why'])

    def test_beyond_the_backing_file_is_judged_too(self):
        over = writes('seq-write', none=0.97, full=0.97, metadata=0.96,
                      space=0.96)
        beyond = writes('seq-write', none=0.5, full=0.9, metadata=0.8,
                        space=0.97)
        for row in beyond['cases']:
            row['group'] = BEYOND
        over['cases'] += beyond['cases']
        targets = self.judged([over])
        # The same targets, each named for where the writes land.
        for name, met, value in (
                ('64K sequential first writes: plugin metadata / raw '
                 'fallocated', True, 0.96),
                ('64K sequential first writes, beyond the backing file: '
                 'plugin metadata / raw fallocated', False, 0.8),
                ('64K sequential first writes, beyond the backing file: '
                 'plugin space / raw fallocated', True, 0.97),
                ('seq-write: plugin full / raw zero-written', True, 0.97),
                ('seq-write, beyond the backing file: plugin full / raw '
                 'zero-written', False, 0.9),
                ('seq-write: plugin none / stock nova (none)', True, 0.97),
                ('seq-write, beyond the backing file: plugin none / stock '
                 'nova (none)', False, 0.5)):
            self.assertEqual(met, targets[name]['met'], name)
            self.assertAlmostEqual(value, targets[name]['value'])
        # A run without the beyond rows has no beyond targets (not n/a
        # lines for rows it never meant to measure).
        self.assertNotIn(
            'seq-write, beyond the backing file: plugin full / raw '
            'zero-written', self.judged([writes('seq-write')]))

    def test_json_targets_have_the_issue_fields(self):
        data = report.finalize(result([writes('seq-write')]))
        text = json.dumps(data)
        for target in json.loads(text)['targets']:
            self.assertLessEqual({'name', 'value', 'target', 'met'},
                                 set(target))

    def test_target_lines(self):
        lines = report.target_lines(report.finalize(result([
            writes('seq-write', space=0.9)]))['targets'])
        self.assertIn('  [MISSED ] 64K sequential first writes: plugin space '
                      '/ raw fallocated: 0.900 [0.900-0.900] (>= 0.95)',
                      lines)
        self.assertIn('  [n/a    ] creating a 1 TiB metadata disk: seconds '
                      '(median): workload create not run', lines)
        self.assertEqual('  3 met, 1 MISSED, 5 n/a', lines[-1])


class TableTestCase(base.TestCase):

    def test_table_pads_and_aligns(self):
        lines = report.table(['variant', 'MiB/s'],
                             [['raw fallocated', '745'],
                              ['plugin space', '1052 [1002-1102]']],
                             indent='')
        self.assertEqual(['variant                    MiB/s',
                          '--------------  ----------------',
                          'raw fallocated               745',
                          'plugin space    1052 [1002-1102]'], lines)

    def test_workload_lines(self):
        w = writes('seq-write', groups={'256K asked': 0.5})
        w['cases'].append(case('plugin-full@256K', [None] * 3,
                               '256K asked', skip='cannot be reserved'))
        w['cases'].append(case('nova-space', [None] * 3,
                               error='qemu-img: boom'))
        report.add_ratios(w)
        text = '\n'.join(report.workload_lines(w, 1))
        self.assertIn('1. Seq-Write [seq-write]', text)
        lines = text.splitlines()
        header = [line for line in lines
                  if line.strip().startswith('variant')][0]
        self.assertEqual(['variant', 'IOPS', 'median', '[min-max]', 'x',
                          'raw', 'fallocated', 'x', 'raw', 'zero-written',
                          'x', 'nova', 'none'], header.split())
        metadata = [line for line in lines
                    if line.strip().startswith('plugin metadata ')][0]
        # Figures [min-max], then the paired ratios.
        # Paired: 95/100, 190/200, 95/100 against raw fallocated;
        # 95/100, 190/100, 95/200 against raw zero-written.
        self.assertEqual(['plugin', 'metadata', '95', '[95-190]',
                          '0.95', '[0.95-0.95]', '0.95', '[0.47-1.90]',
                          '1.90', '[0.95-3.80]'], metadata.split())
        self.assertIn('   256K asked:', lines)
        self.assertIn('   not shown: plugin full (256K asked): cannot be '
                      'reserved', text)
        self.assertIn('   failed: nova space: qemu-img: boom', text)

    def test_seed_table(self):
        w = writes('seq-write')
        for row in w['cases']:
            row['extra'] = {
                'create_seconds': engine.summary([0.5, 0.25, 0.75]),
                'allocated': engine.summary([units.Gi] * 3)}
        lines = report.seed_lines(result([w]))
        self.assertIn('seed 003 row', lines[1])
        metadata = [line for line in lines
                    if line.strip().startswith('plugin metadata')][0]
        # 2 GiB at a median of 95 MiB/s: 21.6 s.
        self.assertEqual(['plugin', 'metadata', 'metadata', 'qcow2',
                          'metadata', '0.500', 's', '1', 'GiB', '21.6', 's',
                          '95', '[95-190]'], metadata.split())

    def test_render_is_complete(self):
        text = report.render(report.finalize(result([writes('seq-write')])))
        self.assertIn('prealloc-bench (default run, 3 repetitions, '
                      'variants interleaved)', text)
        self.assertIn('command: prealloc-bench --dir /d', text)
        self.assertIn('every disk opened with cache=none (cache.direct=on) '
                      'and aio=native, whatever its variant', text)
        self.assertIn('The seeds\' tables', text)
        self.assertIn('Targets (median of the paired ratios', text)


class ToolsTestCase(base.TestCase):

    def test_image_opts(self):
        self.assertEqual(
            'driver=qcow2,file.driver=file,file.filename=/a,,b/disk,'
            'file.aio=native,cache.direct=on,cache.no-flush=off,'
            'cache-size=1048576',
            tools.image_opts('/a,b/disk', 'qcow2', 'native', units.Mi))
        # Preparation runs cache=unsafe, where QEMU has no native AIO.
        self.assertEqual(
            'driver=raw,file.driver=file,file.filename=/d,file.aio=threads,'
            'cache.direct=off,cache.no-flush=on',
            tools.image_opts('/d', 'raw', 'native', cache_size=units.Mi,
                             direct=False, flush=False))

    def test_bench_cmd(self):
        self.assertEqual(
            ['qemu-img', 'bench', '--image-opts', '-c', '8', '-d', '1',
             '-s', '4096', '-o', '0', '-S', '65536', '--flush-interval=4',
             '-w', '--pattern=90', 'OPTS'],
            tools.bench_cmd('OPTS', 8, 4096, depth=1, step=65536,
                            flush_interval=4))

    def test_parse_bench(self):
        out = ('Sending 1000 write requests, 4096 bytes each, 16 in '
               'parallel (starting at offset 0, step size 65536)\n'
               'Run completed in 0.180 seconds.\n')
        self.assertEqual(0.18, tools.parse_bench(['x'], out))
        self.assertRaises(tools.ToolError, tools.parse_bench, ['x'], 'huh')

    def test_parse_io_sums_the_reported_times(self):
        out = ('qemu-io> 4096,1,0:00:00.00,143251844.857,50000.000\n'
               'qemu-io> 4096,1,0:00:00.00,143251844.857,25000.000\n')
        self.assertAlmostEqual(0.00006,
                               sum(tools.request_seconds(['x'], out, 2)))
        # A request without its report is an error, not a faster run.
        self.assertRaises(tools.ToolError, tools.request_seconds, ['x'],
                          out, 3)

    def test_real_runs(self):
        path = os.path.join(self.instances_path, 'disk.raw')
        with open(path, 'wb') as f:
            f.truncate(64 * units.Mi)
        opts = tools.image_opts(path, 'raw', 'native')
        # 256 writes of 64 KiB at queue depth 1 with a flush after each,
        # timed whatever their length (no floor).
        seconds = tools.bench_timed(opts, count=256, size=65536, depth=1,
                                    flush_interval=1,
                                    min_seconds=0.0).seconds
        self.assertGreaterEqual(seconds, 0.0)
        with open(path, 'rb') as f:
            self.assertEqual(bytes([90]) * 65536, f.read(65536))
        # Two reads under a floor they cannot reach: refused, not reported.
        exc = self.assertRaises(tools.TooShort, tools.qemu_io_timed, opts,
                                [(0, 4096), (units.Mi, 4096)],
                                min_seconds=3600.0)
        self.assertIn('too short to time honestly', str(exc))
        self.assertIn('under 3600.00 s', str(exc))
        # The same reads without a floor are timed.
        self.assertGreater(tools.qemu_io_timed(
            opts, [(0, 4096), (units.Mi, 4096)], min_seconds=0.0).seconds, 0)
        tools.qemu_io_prepare(opts, [(units.Mi, 4096)])
        with open(path, 'rb') as f:
            f.seek(units.Mi)
            self.assertEqual(b'\x5a' * 4096, f.read(4096))
        # A request past the end fails the run, not silently.
        self.assertRaises(tools.ToolError, tools.qemu_io_prepare, opts,
                          [(128 * units.Mi, 4096)])
        self.assertGreaterEqual(tools.filefrag(path), 1)

    def test_check_direct_io(self):
        self.assertIsNone(tools.check_direct_io(self.instances_path, 512))
        self.assertEqual([], os.listdir(self.instances_path))

    def test_check_direct_io_opens_no_planted_name(self):
        # The old fixed name, planted as a symlink to another file: the
        # probe neither writes through it nor removes it.
        target = os.path.join(self.useFixture(fixtures.TempDir()).path,
                              'target')
        with open(target, 'wb') as f:
            f.write(b'x' * 8192)
        planted = os.path.join(self.instances_path, '.bench-direct-probe')
        os.symlink(target, planted)
        self.assertIsNone(tools.check_direct_io(self.instances_path, 512))
        with open(target, 'rb') as f:
            self.assertEqual(b'x' * 8192, f.read())
        self.assertEqual(['.bench-direct-probe'],
                         os.listdir(self.instances_path))
        self.assertEqual(target, os.readlink(planted))


class VariantsTestCase(base.TestCase):
    """Disks made through the plugin's and nova's real backends."""

    def setUp(self):
        super().setUp()
        self.b = engine.Bench(self.instances_path, engine.QUICK)
        self.b.__enter__()
        self.addCleanup(self.b.__exit__, None, None, None)
        self.base = self.b.base(units.Mi)

    def make(self, variant, size=64 * units.Mi, images_type='qcow2'):
        disk = variants.make_disk(variant, self.b.workdir, self.base, size,
                                  images_type)
        self.addCleanup(disk.remove)
        return disk

    def test_base_is_random_data(self):
        with open(self.base, 'rb') as f:
            data = f.read()
        self.assertEqual(units.Mi, len(data))
        # Random bytes: no 4 KiB block repeats another.
        blocks = {data[i:i + 4096] for i in range(0, len(data), 4096)}
        self.assertEqual(256, len(blocks))

    def test_plugin_overlay_takes_its_layout_from_the_plan(self):
        disk = self.make(variants.PLUGIN_SPACE)
        planned = variants.plan(variants.PLUGIN_SPACE, 64 * units.Mi,
                                self.b.fs_facts())
        info = pb_fixtures.qemu_img_info(disk.path)
        self.assertEqual(self.base, info['backing-filename'])
        self.assertEqual(planned.cluster_size, disk.cluster_size)
        self.assertTrue(disk.extended_l2)
        self.assertGreaterEqual(disk.allocated, 64 * units.Mi)
        self.assertEqual(planned.needed_bytes,
                         self.b.needed_bytes(variants.PLUGIN_SPACE,
                                             64 * units.Mi))
        # Whatever nova would tell libvirt, QEMU opens every variant alike.
        self.assertIn('file.aio=native,cache.direct=on', disk.opts())
        # 128K clusters, 4K subclusters: the guest XML's <blockio>, which
        # the in-guest workload gives its guest.
        self.assertEqual((512, 4096), disk.block_sizes)

    def test_opt_in_cluster_size(self):
        asked = variants.PLUGIN_METADATA.with_cluster('512K')
        self.assertEqual('plugin-metadata@512K', asked.key)
        self.assertEqual(asked, variants.by_key('plugin-metadata@512K'))
        disk = self.make(asked)
        self.assertEqual(512 * units.Ki, disk.cluster_size)

    def test_nova_in_tree_space(self):
        disk = self.make(variants.NOVA_SPACE)
        info = pb_fixtures.qemu_img_info(disk.path)
        self.assertFalse(info['format-specific']['data'].get('extended-l2'))
        self.assertEqual(64 * units.Ki, disk.cluster_size)
        # fallocate -n: blocks past the end of a small qcow2 file.
        self.assertLess(os.path.getsize(disk.path), units.Mi)
        self.assertGreaterEqual(disk.allocated, 64 * units.Mi)
        self.assertIsNone(disk.cache_size)
        self.assertIsNone(disk.block_sizes)

    def test_raw_references(self):
        # 64 MiB of data blocks; ext4 counts its extent-tree blocks in
        # st_blocks too (a file in more than 4 extents: 4 KiB more).
        fallocated = self.make(variants.RAW_FALLOCATED)
        self.assertGreaterEqual(fallocated.allocated, 64 * units.Mi)
        self.assertLess(fallocated.allocated, 65 * units.Mi)
        zero = self.make(variants.RAW_ZERO)
        self.assertGreaterEqual(zero.allocated, 64 * units.Mi)
        self.assertLess(zero.allocated, 65 * units.Mi)
        # Written, not unwritten extents: filefrag -v flags none.
        out = subprocess.run(['filefrag', '-v', zero.path],
                             capture_output=True, text=True).stdout
        self.assertNotIn('unwritten', out)
        out = subprocess.run(['filefrag', '-v', fallocated.path],
                             capture_output=True, text=True).stdout
        self.assertIn('unwritten', out)
        sparse = self.make(variants.RAW_SPARSE)
        self.assertEqual(0, sparse.allocated)
        self.assertEqual(64 * units.Mi, os.path.getsize(sparse.path))

    def test_overrides_are_cleared(self):
        with variants.overrides([('prealloc_backend', 'mode', 'full'),
                                 (None, 'preallocate_images', 'space')]):
            self.assertEqual('full', variants.CONF.prealloc_backend.mode)
        self.assertIsNone(variants.CONF.prealloc_backend.mode)
        self.assertEqual('none', variants.CONF.preallocate_images)


class FakeWorkload(workloads.Workload):
    """Records the order of its measurements; one variant always fails."""

    name = 'fake'
    title = 'Fake'
    unit = 'ops'
    references = ('raw-fallocated',)
    VARIANTS = (variants.RAW_FALLOCATED, variants.NOVA_NONE,
                variants.PLUGIN_SPACE)

    def __init__(self):
        self.calls = []

    def engine_text(self, bench):
        return 'none'

    def describe(self, bench):
        return 'nothing'

    def cases(self, bench):
        return [engine.Case(v) for v in self.VARIANTS] + [
            engine.Case(variants.PLUGIN_FULL, skip='no room')]

    def measure(self, bench, case, rep):
        self.calls.append((case.variant.key, rep))
        if case.variant is variants.NOVA_NONE:
            raise tools.ToolError(['qemu-img'], 'exit code 1: boom')
        return engine.Sample(10.0 * (rep + 1), {'allocated': rep})


class EngineTestCase(base.TestCase):

    def run_fake(self, reps=3):
        config = dataclasses.replace(engine.QUICK, reps=reps)
        fake = FakeWorkload()
        with engine.Bench(self.instances_path, config) as bench:
            workdir = bench.workdir
            out = bench.run_workload(fake)
        self.assertFalse(os.path.exists(workdir))
        return fake, out

    def test_round_robin_and_failures(self):
        fake, out = self.run_fake()
        # Each repetition visits every variant, starting one later; a case
        # that failed is not retried; a skipped one never measured.
        self.assertEqual([('raw-fallocated', 0), ('nova-none', 0),
                          ('plugin-space', 0),
                          ('plugin-space', 1), ('raw-fallocated', 1),
                          ('plugin-space', 2), ('raw-fallocated', 2)],
                         fake.calls)
        rows = {row['variant']: row for row in out['cases']}
        self.assertEqual([10.0, 20.0, 30.0], rows['raw-fallocated'][
            'samples'])
        self.assertEqual(20.0, rows['raw-fallocated']['median'])
        self.assertEqual(1, rows['raw-fallocated']['extra']['allocated'][
            'median'])
        # Rows keep one slot per repetition, so that pairing lines up.
        self.assertEqual([None, None, None], rows['nova-none']['samples'])
        self.assertEqual([None, None, None], rows['plugin-full']['samples'])
        self.assertIn('boom', rows['nova-none']['error'])
        self.assertEqual('no room', rows['plugin-full']['skip'])
        self.assertTrue(report.has_errors(result([out])))
        report.add_ratios(out)
        self.assertEqual([1.0, 1.0, 1.0], rows['plugin-space']['ratios'][
            'raw-fallocated']['samples'])

    def test_a_run_too_short_to_time_is_not_shown(self):
        fake = FakeWorkload()
        real_measure = fake.measure

        def measure(bench, case, rep):
            if case.variant is variants.PLUGIN_SPACE and rep == 1:
                raise tools.TooShort(['qemu-img'], 'the timed run took '
                                     '0.0100 s, under 0.05 s')
            return real_measure(bench, case, rep)

        fake.measure = measure
        config = dataclasses.replace(engine.QUICK, reps=3)
        with engine.Bench(self.instances_path, config) as bench:
            out = bench.run_workload(fake)
        rows = {row['variant']: row for row in out['cases']}
        space = rows['plugin-space']
        # Its other repetitions are dropped too: no figure from a row with
        # a run that could not be timed.
        self.assertEqual([None, None, None], space['samples'])
        self.assertIsNone(space['median'])
        self.assertIsNone(space['error'])
        self.assertEqual('not shown: the timed run took 0.0100 s, under '
                         '0.05 s', space['skip'])
        self.assertNotIn(('plugin-space', 2), fake.calls)

    def test_registry(self):
        self.assertEqual(['seq-write', 'new-cluster-write', 'dense-4k-qd1',
                          'dense-4k-qd16', 'write-512', 'flush-4k',
                          'random-read', 'create', 'extents'],
                         list(workloads.REGISTRY)[:9])
        self.addCleanup(workloads.REGISTRY.pop, 'fake', None)
        workloads.register(FakeWorkload)
        self.assertIsInstance(workloads.instances()[-1], FakeWorkload)


class WorkloadPlanTestCase(base.TestCase):
    """The workloads' cases, from the plan, without measuring anything."""

    def _bench(self, config=engine.DEFAULT):
        bench = engine.Bench(self.instances_path, config)
        bench.__enter__()
        self.addCleanup(bench.__exit__, None, None, None)
        return bench

    def test_every_cluster_size_the_policy_can_choose(self):
        bench = self._bench()
        w = workloads.NewClusterWrites()
        groups = {}
        for row in w.cases(bench):
            groups.setdefault(row.group, []).append(row.variant.key)
        # The default layout beside nova and every reference, over the
        # backing data and beyond it...
        rows = {v.key for v in workloads.WRITE_VARIANTS + w.extra_variants}
        self.assertIn('raw-sparse', rows)
        self.assertEqual(rows, set(groups.pop(DEFAULT)))
        self.assertEqual(rows, set(groups.pop(BEYOND)))
        # ... then every other size an operator can ask for, with raw
        # fallocated measured in the same repetitions.
        default = variants.plan(variants.PLUGIN_METADATA,
                                bench.config.write_disk,
                                bench.fs_facts()).cluster_size
        self.assertEqual({'%s asked' % name for name, value in
                          qcow2_layout.CLUSTER_SIZES.items()
                          if value != default}, set(groups))
        for group, keys in groups.items():
            name = group.split()[0]
            self.assertEqual(['raw-fallocated', 'plugin-metadata@' + name,
                              'plugin-space@' + name], keys)
        self.assertEqual([DEFAULT, BEYOND], w.default_groups(bench)[:2])

    def test_new_cluster_step_covers_the_cluster(self):
        bench = self._bench()
        w = workloads.NewClusterWrites()
        default = workloads.default_cluster(bench, bench.config.write_disk)
        self.assertEqual(max(default, 64 * units.Ki),
                         w.step(bench, DEFAULT))
        self.assertEqual(2 * units.Mi, w.step(bench, '2M asked'))
        # Every write over backing data.
        self.assertLessEqual(w.count(bench, '2M asked') * 2 * units.Mi,
                             bench.config.write_base)

    def test_a_quick_run_times_the_summary_s_writes(self):
        # 2048 writes over 256 MiB took 0.02-0.04 s on the fast rows, under
        # the 0.05 s floor: the summary of a quick run lost them. Its
        # new-cluster writes have their own 1 GiB disks, 8192 writes.
        w = workloads.NewClusterWrites()
        quick = self._bench(engine.QUICK)
        step = w.step(quick, DEFAULT)
        self.assertEqual((units.Gi, units.Gi, 8192),
                         (w.group_disk_size(quick, DEFAULT),
                          w.group_base_size(quick, DEFAULT),
                          w.count(quick, DEFAULT)))
        self.assertLessEqual(8192 * step, w.group_base_size(quick, DEFAULT))
        self.assertIn('"default layout": 1 GiB disks over 1 GiB of random '
                      'data, so that 8192 writes', w.describe(quick))
        # Its other groups and the other first writes keep 256 MiB: each
        # preallocated 1 GiB disk costs time.
        self.assertEqual((260 * units.Mi, 4 * units.Mi, 2048),
                         (w.group_disk_size(quick, BEYOND),
                          w.group_base_size(quick, BEYOND),
                          w.count(quick, BEYOND)))
        self.assertEqual((256 * units.Mi, 4096),
                         (w.group_disk_size(quick, '64K asked'),
                          w.count(quick, '64K asked')))
        seq = workloads.SequentialFirstWrites()
        self.assertEqual(256 * units.Mi, seq.group_disk_size(quick, DEFAULT))
        # The default run as before: 16384 writes over its 2 GiB.
        default = self._bench()
        self.assertEqual((2 * units.Gi, 16384),
                         (w.group_disk_size(default, DEFAULT),
                          w.count(default, DEFAULT)))
        self.assertNotIn('so that', w.describe(default))

    def test_too_few_writes_are_not_timed(self):
        config = dataclasses.replace(engine.QUICK, write_base=64 * units.Mi,
                                     write_disk=64 * units.Mi,
                                     new_cluster_disk=None)
        cases = workloads.NewClusterWrites().cases(self._bench(config))
        skipped = [row for row in cases if row.group == '2M asked']
        self.assertTrue(skipped)
        for row in skipped:
            self.assertIn('not measured in this run: 32 writes 2 MiB apart '
                          'over 64 MiB of backing data are too few to time',
                          row.skip)


class CommandTestCase(base.TestCase):

    def parse(self, argv):
        parser = argparse.ArgumentParser()
        cmd_bench.add_arguments(parser)
        return parser.parse_args(argv)

    def test_plot_without_matplotlib_fails_before_running(self):
        # Simulates an environment without matplotlib (it may be
        # installed here): None in sys.modules makes its import fail.
        modules = mock.patch.dict(sys.modules, {'matplotlib': None})
        modules.start()
        self.addCleanup(modules.stop)
        self.assertIn('--plot needs matplotlib', plot.missing())
        err = io.StringIO()
        self.useFixture(fixtures.MonkeyPatch('sys.stderr', err))
        with mock.patch.object(engine.Bench, 'run') as run:
            rc = cmd_bench.main(['--quick', '--dir', self.instances_path,
                                 '--plot',
                                 os.path.join(self.instances_path, 'x.png')])
        self.assertEqual(2, rc)
        run.assert_not_called()
        self.assertIn('pip install matplotlib', err.getvalue())

    def test_write_size(self):
        self.assertEqual(512 * units.Mi,
                         self.parse(['--write-size', '512M']).write_size)
        self.assertEqual(4 * units.Gi,
                         self.parse(['--write-size', '4GiB']).write_size)
        err = io.StringIO()
        self.useFixture(fixtures.MonkeyPatch('sys.stderr', err))
        self.assertRaises(SystemExit, self.parse, ['--write-size', '100K'])
        self.assertIn('whole number of MiB', err.getvalue())

    def test_bad_only_and_reps_fail_before_running(self):
        err = io.StringIO()
        self.useFixture(fixtures.MonkeyPatch('sys.stderr', err))
        # Bench.run is replaced only to prove it is never reached.
        with mock.patch.object(engine.Bench, 'run') as run:
            self.assertEqual(2, cmd_bench.run(self.parse(
                ['--dir', self.instances_path, '--only', 'seq-write,nope'])))
            self.assertEqual(2, cmd_bench.run(self.parse(
                ['--dir', self.instances_path, '--reps', '0'])))
        run.assert_not_called()
        self.assertIn('unknown workload(s) nope', err.getvalue())
        self.assertIn('--reps must be at least 1', err.getvalue())

    def test_plot_renders_png(self):
        if plot.missing():
            self.skipTest('matplotlib is not installed')
        path = os.path.join(self.instances_path, 'bench.png')
        plot.render(report.finalize(result([writes('seq-write')])), path)
        with open(path, 'rb') as f:
            self.assertEqual(b'\x89PNG\r\n\x1a\n', f.read(8))

    def test_directory_that_cannot_do_direct_io(self):
        # No filesystem without O_DIRECT can be mounted here (even tmpfs
        # has it since Linux 6.6): the open(2) answer is simulated.
        real_open = os.open

        def fake_open(path, flags, *args, **kwargs):
            if flags & os.O_DIRECT:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            return real_open(path, flags, *args, **kwargs)

        with mock.patch('os.open', fake_open):
            reason = cmd_bench._preflight(self.instances_path)
        self.assertIn('cannot be measured with cache=none (O_DIRECT open '
                      'failed: [Errno 22] Invalid argument)', reason)
        self.assertIn('choose another --dir', reason)
