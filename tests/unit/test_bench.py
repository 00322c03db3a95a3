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

"""``prealloc-backend bench``: the command, its engine, its report.

The end-to-end test runs the real command (``--quick``) in a child process
on a temporary directory, as an operator would, and reads its JSON: it
parses nova's global configuration, so it cannot share a test process.
The other tests make real disks through the plugin's and nova's backends
with real qemu-img, or check the report's arithmetic and formatting on
hand-made results. No test asserts a timing or a measured ratio: those
depend on the host.
"""

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

from prealloc_backend.bench import engine
from prealloc_backend.bench import plot
from prealloc_backend.bench import report
from prealloc_backend.bench import tools
from prealloc_backend.bench import variants
from prealloc_backend.bench import workloads
from prealloc_backend.cmd import bench as cmd_bench
from prealloc_backend.cmd import main as cmd_main
from tests import base
from tests import fixtures as pb_fixtures


def case(variant, median, group='', n=3, skip=None, error=None,
         spread=0.1):
    """A result row as Workload.result() makes it."""
    row = {'variant': variant, 'label': variants.BY_KEY[variant].label,
           'family': variants.BY_KEY[variant].family,
           'mode': variants.BY_KEY[variant].mode, 'group': group,
           'skip': skip, 'error': error, 'facts': {}, 'extra': {},
           'samples': [] if median is None else [median] * n}
    if median is None:
        row.update(median=None, min=None, max=None, n=0)
    else:
        row.update(median=median, min=median * (1 - spread),
                   max=median * (1 + spread), n=n)
    return row


def workload(name, cases, unit='MiB/s', higher=True):
    return {'name': name, 'title': name.title(), 'unit': unit,
            'higher_is_better': higher, 'engine': 'qemu-img bench',
            'setup': 'disks', 'error': None, 'seconds': 1.0,
            'extra_columns': [], 'fact_columns': [], 'cases': cases}


def result(workload_list):
    return {'schema': engine.SCHEMA_VERSION, 'run': 'default',
            'config': {'reps': 3}, 'date': '2024-01-01T00:00:00+00:00',
            'host': {'hostname': 'h', 'kernel': '6.1', 'cpus': 2,
                     'nova': '34.0.0', 'prealloc_backend': '1.0',
                     'qemu_img': '7.2', 'directory': '/d',
                     'filesystem': 'ext4', 'free_bytes': units.Gi},
            'privsep': 'in-process', 'workloads': workload_list,
            'seconds': 12.0}


class StatsTestCase(base.TestCase):

    def test_summary(self):
        self.assertEqual({'median': 2, 'min': 1, 'max': 5, 'n': 3},
                         engine.summary([5, 1, 2]))
        self.assertEqual(2.5, engine.summary([4, 1, 2, 3])['median'])
        self.assertEqual({'median': None, 'min': None, 'max': None, 'n': 0},
                         engine.summary([]))

    def test_rotated_starts_one_later_each_repetition(self):
        self.assertEqual(['a', 'b', 'c'], engine.rotated(['a', 'b', 'c'], 0))
        self.assertEqual(['b', 'c', 'a'], engine.rotated(['a', 'b', 'c'], 1))
        self.assertEqual(['a', 'b', 'c'], engine.rotated(['a', 'b', 'c'], 3))
        self.assertEqual([], engine.rotated([], 2))

    def test_fmt_bytes(self):
        self.assertEqual('1 TiB', engine.fmt_bytes(units.Ti))
        self.assertEqual('10 GiB', engine.fmt_bytes(10 * units.Gi))
        self.assertEqual('1.5 GiB', engine.fmt_bytes(3 * units.Gi // 2))
        self.assertEqual('196 KiB', engine.fmt_bytes(196 * units.Ki))
        self.assertEqual('0 B', engine.fmt_bytes(0))
        self.assertEqual('-', engine.fmt_bytes(None))

    def test_fmt_number(self):
        self.assertEqual('1234', report.fmt_number(1234.4))
        self.assertEqual('12.3', report.fmt_number(12.34))
        self.assertEqual('1.23', report.fmt_number(1.234))
        self.assertEqual('0.123', report.fmt_number(0.1234))
        self.assertEqual('0.00012', report.fmt_number(0.00012))
        self.assertEqual('3', report.fmt_number(3.0))
        self.assertEqual('-', report.fmt_number(None))


class RatioTestCase(base.TestCase):

    def test_ratios_to_raw_and_nova_within_group(self):
        w = workload('create', [
            case('raw', 1.0, '10 GiB'), case('nova-none', 2.0, '10 GiB'),
            case('nova-space', 4.0, '10 GiB'),
            case('plugin-space', 3.0, '10 GiB'),
            case('nova-none', 8.0, '1 TiB'),
            case('plugin-space', 2.0, '1 TiB')], unit='s', higher=False)
        report.add_ratios(w)
        space_10g, space_1t = w['cases'][3], w['cases'][5]
        self.assertEqual({'raw': 3.0, 'nova-none': 1.5, 'nova-space': 0.75},
                         space_10g['ratios'])
        # No raw or nova-space row at 1 TiB: no ratio to them, not one
        # taken from another size.
        self.assertEqual({'nova-none': 0.25}, space_1t['ratios'])

    def test_ratio_of_missing_or_zero(self):
        self.assertIsNone(report.ratio(None, 2.0))
        self.assertIsNone(report.ratio(2.0, 0))
        self.assertIsNone(report.ratio(2.0, None))
        self.assertEqual(0.5, report.ratio(1.0, 2.0))

    def test_skipped_reference_gives_no_ratio(self):
        w = workload('seq-write', [
            case('raw', None, skip='cannot be reserved here'),
            case('plugin-space', 10.0)])
        report.add_ratios(w)
        self.assertEqual({}, w['cases'][1]['ratios'])


class TargetTestCase(base.TestCase):

    def judged(self, workload_list):
        return {t['id']: t for t in
                report.finalize(result(workload_list))['targets']}

    def test_targets_met_missed_and_unmeasured(self):
        targets = self.judged([
            workload('seq-write', [case('raw', 100.0),
                                   case('nova-space', 40.0),
                                   case('plugin-space', 97.0)]),
            workload('new-cluster-write', [case('raw', 100.0),
                                           case('nova-space', 30.0),
                                           case('plugin-space', 70.0)]),
            workload('create', [
                case('plugin-metadata', 0.5, '10 GiB'),
                case('plugin-metadata', 1.5, '1 TiB'),
                case('plugin-space', 0.5, '10 GiB'),
                case('plugin-space', None, '1 TiB',
                     skip='cannot be reserved here: needs 1 TiB')],
                unit='s', higher=False),
        ])
        self.assertTrue(targets['seq-write-vs-raw']['met'])
        self.assertAlmostEqual(0.97, targets['seq-write-vs-raw']['value'])
        self.assertTrue(targets['seq-write-vs-nova']['met'])   # 2.43
        self.assertFalse(targets['new-cluster-vs-raw']['met'])  # 0.7
        self.assertFalse(targets['new-cluster-vs-nova']['met'])  # 2.33
        self.assertTrue(targets['create-scaling-metadata']['met'])  # 3.0
        self.assertAlmostEqual(3.0,
                               targets['create-scaling-metadata']['value'])
        space = targets['create-scaling-space']
        self.assertIsNone(space['met'])
        self.assertIn('plugin-space at 1 TiB skipped: cannot be reserved',
                      space['why'])
        self.assertIsNone(targets['random-read-layout']['met'])
        self.assertIn('random-read not run',
                      targets['random-read-layout']['why'])

    def test_upper_bound_target_missed(self):
        targets = self.judged([workload('create', [
            case('plugin-metadata', 0.1, '10 GiB'),
            case('plugin-metadata', 0.6, '1 TiB')], unit='s', higher=False)])
        self.assertFalse(targets['create-scaling-metadata']['met'])

    def test_target_lines(self):
        targets = report.finalize(result([
            workload('seq-write', [case('raw', 100.0),
                                   case('nova-space', 50.0),
                                   case('plugin-space', 90.0)])]))['targets']
        lines = report.target_lines(targets)
        self.assertIn('  [MISSED] qcow2 overlay, sequential first writes: '
                      'plugin space / raw: 0.900 (>= 0.95)', lines)
        self.assertIn('  [MISSED] qcow2 overlay, sequential first writes: '
                      'plugin space / nova in-tree space: 1.800 (>= 2.4)',
                      lines)
        self.assertTrue(any(line.startswith('  [n/a   ] 1 TiB random reads')
                            for line in lines))


class TableTestCase(base.TestCase):

    def test_table_pads_and_aligns(self):
        lines = report.table(['variant', 'MiB/s'],
                             [['raw fallocated', '745'],
                              ['plugin space', '1052 (1002-1102)']],
                             indent='')
        self.assertEqual(['variant                    MiB/s',
                          '--------------  ----------------',
                          'raw fallocated               745',
                          'plugin space    1052 (1002-1102)'], lines)

    def test_workload_lines(self):
        w = workload('seq-write', [
            case('raw', 800.0, n=3, spread=0.05),
            case('nova-space', 400.0),
            case('plugin-space', 760.0),
            case('plugin-full', None, skip='cannot be reserved here: '
                                           'needs 1 GiB, 10 MiB free'),
            case('plugin-none', None, error='qemu-img: boom')])
        w['fact_columns'] = [['cluster', 'cluster']]
        w['extra_columns'] = [['allocated', 'allocated', 'bytes']]
        w['cases'][0]['facts'] = {'cluster': '-'}
        w['cases'][2]['facts'] = {'cluster': '64 KiB'}
        w['cases'][2]['extra'] = {'allocated': {'median': units.Gi}}
        report.add_ratios(w)
        text = '\n'.join(report.workload_lines(w, 1))
        self.assertIn('1. Seq-Write [seq-write]', text)
        header = [line for line in text.splitlines()
                  if line.strip().startswith('variant')][0]
        self.assertEqual(['variant', 'cluster', 'allocated', 'MiB/s',
                          'median', '(min-max)', 'x', 'raw', 'x', 'nova',
                          'space'], header.split())
        raw = [line for line in text.splitlines()
               if 'raw fallocated' in line][0]
        self.assertIn('800 (760-840)', raw)
        plugin = [line for line in text.splitlines()
                  if line.strip().startswith('plugin space')][0]
        self.assertEqual(['plugin', 'space', '64', 'KiB', '1', 'GiB', '760',
                          '(684-836)', '0.95', '1.90'], plugin.split())
        self.assertIn('   skipped: plugin full: cannot be reserved here: '
                      'needs 1 GiB, 10 MiB free', text)
        self.assertIn('   failed: plugin none: qemu-img: boom', text)

    def test_scaling_lines(self):
        w = workload('create', [
            case('plugin-metadata', 0.5, '10 GiB'),
            case('plugin-space', 0.4, '10 GiB'),
            case('plugin-metadata', 1.0, '1 TiB'),
            case('plugin-space', None, '1 TiB', skip='no room')],
            unit='s', higher=False)
        self.assertEqual(['   time 1 TiB / 10 GiB: plugin metadata 2.00, '
                          'plugin space -'], report.scaling_lines(w))

    def test_render_is_complete(self):
        text = report.render(report.finalize(result([
            workload('seq-write', [case('raw', 100.0),
                                   case('plugin-space', 99.0)])])))
        self.assertIn('prealloc-backend bench (default run, 3 repetitions, '
                      'interleaved)', text)
        self.assertIn('directory /d on ext4, 1 GiB free', text)
        self.assertIn('privsep: in-process', text)
        self.assertIn('Targets (issue 4', text)


class ToolsTestCase(base.TestCase):

    def test_image_opts(self):
        self.assertEqual(
            'driver=qcow2,file.driver=file,file.filename=/a,,b/disk,'
            'file.aio=native,cache.direct=on,cache.no-flush=off,'
            'cache-size=1048576',
            tools.image_opts('/a,b/disk', 'qcow2', 'native', units.Mi))
        # raw has no metadata cache; preparation runs cache=unsafe.
        self.assertEqual(
            'driver=raw,file.driver=file,file.filename=/d,file.aio=threads,'
            'cache.direct=off,cache.no-flush=on',
            tools.image_opts('/d', 'raw', cache_size=units.Mi, direct=False,
                             flush=False))

    def test_io_script(self):
        self.assertEqual('read -q 0 4096\nread -q 8192 4096\nquit\n',
                         tools.io_script([(0, 4096), (8192, 4096)]))
        self.assertEqual('write -q -P 90 65536 65536\nquit\n',
                         tools.io_script([(65536, 65536)], op='write',
                                         pattern=90))

    def test_qemu_io_and_filefrag_on_a_real_disk(self):
        path = os.path.join(self.instances_path, 'disk.raw')
        with open(path, 'wb') as f:
            f.truncate(4 * units.Mi)
        opts = tools.image_opts(path, 'raw')
        seconds = tools.qemu_io(opts, tools.io_script(
            [(0, 65536), (units.Mi, 65536)], op='write'))
        self.assertGreater(seconds, 0)
        with open(path, 'rb') as f:
            self.assertEqual(b'\x5a' * 65536, f.read(65536))
        self.assertGreaterEqual(tools.filefrag(path), 1)
        # A request past the end fails the run, not silently.
        self.assertRaises(tools.ToolError, tools.qemu_io, opts,
                          tools.io_script([(8 * units.Mi, 4096)]))

    def test_bench_runs_qemu_img_bench(self):
        path = os.path.join(self.instances_path, 'disk.raw')
        with open(path, 'wb') as f:
            f.truncate(units.Mi)
        tools.bench(tools.image_opts(path, 'raw'), count=16, size=65536)
        with open(path, 'rb') as f:
            self.assertEqual(bytes([90]) * units.Mi, f.read())

    def test_check_direct_io(self):
        self.assertIsNone(tools.check_direct_io(self.instances_path))
        self.assertEqual([], os.listdir(self.instances_path))


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

    def test_plugin_space_overlay(self):
        disk = self.make(variants.PLUGIN_SPACE)
        info = pb_fixtures.qemu_img_info(disk.path)
        self.assertEqual('qcow2', info['format'])
        self.assertTrue(info['format-specific']['data']['extended-l2'])
        self.assertEqual(self.base, info['backing-filename'])
        self.assertGreaterEqual(disk.allocated, 64 * units.Mi)
        self.assertEqual('native', disk.aio)
        # QEMU's default cache covers 64 MiB: no <metadata_cache>.
        self.assertIsNone(disk.cache_size)
        self.assertEqual(128 * units.Ki, disk.cluster_size)

    def test_nova_in_tree_space(self):
        disk = self.make(variants.NOVA_SPACE)
        info = pb_fixtures.qemu_img_info(disk.path)
        self.assertFalse(info['format-specific']['data'].get('extended-l2'))
        # fallocate -n: blocks past the end of a small qcow2 file.
        self.assertLess(os.path.getsize(disk.path), units.Mi)
        self.assertGreaterEqual(disk.allocated, 64 * units.Mi)
        self.assertIsNone(disk.cache_size)

    def test_nova_in_tree_none_and_raw_references(self):
        nova = self.make(variants.NOVA_NONE)
        self.assertLess(nova.allocated, units.Mi)
        self.assertEqual('threads', nova.aio)
        raw = self.make(variants.RAW_REF)
        self.assertEqual(64 * units.Mi, raw.allocated)
        sparse = self.make(variants.RAW_SPARSE)
        self.assertEqual(0, sparse.allocated)
        self.assertEqual(64 * units.Mi, os.path.getsize(sparse.path))

    def test_raw_images_type(self):
        thin = self.make(variants.PLUGIN_NONE, images_type='raw')
        full = self.make(variants.PLUGIN_FULL, images_type='raw')
        self.assertEqual('raw', thin.fmt)
        self.assertLess(thin.allocated, 2 * units.Mi)
        self.assertEqual(64 * units.Mi, full.allocated)
        rc, out = pb_fixtures.qemu_img_compare(self.base, full.path)
        self.assertEqual(0, rc, out)

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
    VARIANTS = (variants.RAW_REF, variants.NOVA_NONE, variants.PLUGIN_SPACE)

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
        self.assertEqual([('raw', 0), ('nova-none', 0), ('plugin-space', 0),
                          ('plugin-space', 1), ('raw', 1),
                          ('plugin-space', 2), ('raw', 2)], fake.calls)
        rows = {row['variant']: row for row in out['cases']}
        self.assertEqual([10.0, 20.0, 30.0], rows['raw']['samples'])
        self.assertEqual(20.0, rows['raw']['median'])
        self.assertEqual(1, rows['raw']['extra']['allocated']['median'])
        self.assertIn('boom', rows['nova-none']['error'])
        self.assertEqual('no room', rows['plugin-full']['skip'])
        self.assertTrue(report.has_errors(result([out])))

    def test_cannot_reserve(self):
        with engine.Bench(self.instances_path, engine.QUICK) as bench:
            why = bench.cannot_reserve(variants.RAW_REF, 64 * units.Ti)
            self.assertIn('cannot be reserved here: needs 64 TiB', why)
            self.assertIsNone(bench.cannot_reserve(variants.NOVA_NONE,
                                                   64 * units.Ti))
            self.assertIsNone(bench.cannot_reserve(variants.RAW_REF,
                                                   units.Mi))

    def test_registry(self):
        self.assertEqual(['seq-write', 'new-cluster-write', 'random-read',
                          'create', 'extents'],
                         list(workloads.REGISTRY)[:5])
        self.addCleanup(workloads.REGISTRY.pop, 'fake', None)
        workloads.register(FakeWorkload)
        self.assertIsInstance(workloads.instances()[-1], FakeWorkload)


class SkipTestCase(base.TestCase):
    """Sizes a small real filesystem cannot hold are skipped, each with a
    line saying why, and the others are still measured.
    """

    def test_creation_on_a_small_filesystem(self):
        fs = self.use_loop_fs('ext4', 256)
        config = dataclasses.replace(engine.QUICK, reps=1,
                                     create_sizes=(10 * units.Gi,),
                                     small_base=units.Mi)
        with engine.Bench(fs.path, config) as bench:
            out = bench.run_workload(workloads.Creation())
        rows = {row['variant']: row for row in out['cases']}
        for key in ('raw', 'nova-space', 'plugin-space'):
            self.assertIsNone(rows[key]['median'])
            self.assertIn('cannot be reserved here: needs 10 GiB',
                          rows[key]['skip'])
        for key in ('nova-none', 'plugin-none', 'plugin-metadata'):
            self.assertIsNone(rows[key]['skip'])
            self.assertIsNone(rows[key]['error'])
            self.assertEqual(1, len(rows[key]['samples']))
        self.assertIn('not measured: full writes 10 GiB of zeros',
                      rows['plugin-full']['skip'])
        report.add_ratios(out)
        text = '\n'.join(report.workload_lines(out, 4))
        self.assertRegex(text, r'skipped: plugin space: cannot be reserved '
                               r'here: needs 10 GiB, \d+ MiB free on %s'
                         % fs.path)
        self.assertNotIn('Traceback', text)


class CommandTestCase(base.TestCase):

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
            rc = cmd_main.main(['bench', '--quick', '--dir',
                                self.instances_path, '--plot',
                                os.path.join(self.instances_path, 'x.png')])
        self.assertEqual(2, rc)
        run.assert_not_called()
        self.assertIn('pip install matplotlib', err.getvalue())

    def test_plot_renders_png(self):
        if plot.missing():
            self.skipTest('matplotlib is not installed')
        path = os.path.join(self.instances_path, 'bench.png')
        plot.render(report.finalize(result([
            workload('seq-write', [case('raw', 100.0),
                                   case('plugin-space', 99.0)]),
            workload('create', [case('plugin-metadata', 0.5, '10 GiB'),
                                case('plugin-metadata', 1.5, '1 TiB')],
                     unit='s', higher=False)])), path)
        with open(path, 'rb') as f:
            self.assertEqual(b'\x89PNG\r\n\x1a\n', f.read(8))

    def test_directory_that_cannot_do_direct_io(self):
        # No filesystem without O_DIRECT can be mounted here (even tmpfs
        # has it since Linux 6.6): the open(2) answer is simulated.
        real_open = os.open

        def fake_open(path, flags, *args):
            if flags & os.O_DIRECT:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            return real_open(path, flags, *args)

        with mock.patch('os.open', fake_open):
            reason = cmd_bench._preflight(self.instances_path)
        self.assertIn('cannot be measured with cache=none (O_DIRECT open '
                      'failed: [Errno 22] Invalid argument)', reason)
        self.assertIn('choose another --dir', reason)


class QuickRunTestCase(base.TestCase):
    """The real command, end to end, as .ci/run runs it."""

    def test_quick_run(self):
        out_json = os.path.join(self.instances_path, 'bench.json')
        directory = os.path.join(self.instances_path, 'here')
        proc = subprocess.run(
            [sys.executable, '-m', 'prealloc_backend.cmd.main', 'bench',
             '--quick', '--dir', directory, '--json', out_json],
            capture_output=True, text=True, timeout=600)
        self.assertEqual(0, proc.returncode, proc.stderr[-3000:])
        self.assertNotIn('Traceback', proc.stderr)
        # The scratch directory is gone.
        self.assertEqual([], os.listdir(directory))
        with open(out_json) as f:
            data = json.load(f)
        self.assertEqual(engine.SCHEMA_VERSION, data['schema'])
        self.assertEqual('quick', data['run'])
        self.assertIn('in-process', data['privsep'])
        expected = {
            'seq-write': workloads.WRITE_VARIANTS,
            'new-cluster-write': workloads.WRITE_VARIANTS,
            'random-read': workloads.RandomReads.VARIANTS,
            'create': workloads.Creation.VARIANTS + (variants.PLUGIN_FULL,),
            'extents': workloads.Extents.VARIANTS,
        }
        by_name = {w['name']: w for w in data['workloads']}
        self.assertEqual(set(expected), set(by_name))
        for name, wanted in expected.items():
            w = by_name[name]
            self.assertIsNone(w['error'], name)
            self.assertTrue(w['engine'] and w['setup'])
            self.assertEqual({v.key for v in wanted},
                             {c['variant'] for c in w['cases']}, name)
            measured = 0
            for row in w['cases']:
                self.assertIsNone(row['error'], (name, row))
                if row['skip']:
                    # A skipped row says why, and has no figure.
                    self.assertGreater(len(row['skip']), 20)
                    self.assertIsNone(row['median'])
                    continue
                measured += 1
                self.assertEqual(data['config']['reps'],
                                 len(row['samples']), (name, row))
                self.assertGreater(row['median'], 0)
                self.assertLessEqual(row['min'], row['median'])
                self.assertLessEqual(row['median'], row['max'])
            self.assertGreater(measured, 0, name)
        for name in ('seq-write', 'new-cluster-write'):
            for row in by_name[name]['cases']:
                if row['median'] is not None:
                    self.assertIn('nova-space', row['ratios'])
                    self.assertIn('raw', row['ratios'])
        self.assertEqual([t['id'] for t in report.TARGETS],
                         [t['id'] for t in data['targets']])
        for target in data['targets']:
            self.assertTrue(target['met'] is not None or target['why'])
        for w in data['workloads']:
            self.assertIn(w['title'], proc.stdout)
        self.assertIn('Targets (issue 4', proc.stdout)
