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

"""What the benchmark says it measures: writes beyond the backing file,
cold and warm reads, the CPU time per request, the privsep switch and a
stopped run.

No assertion here depends on a timing or on the speed of the machine: the
runs that are timed take ``min_seconds=0`` (Config.min_seconds), and the
CPU figures are checked against what the measured process says of itself.
"""

import dataclasses
import json
import os
import signal
import subprocess
import sys
from unittest import mock

from oslo_utils import units

import nova.privsep
import prealloc_backend.privsep
from prealloc_backend.system import stopping
from prealloc_bench import cmd as cmd_bench
from prealloc_bench import engine
from prealloc_bench import report
from prealloc_bench import tools
from prealloc_bench import variants
from prealloc_bench import workloads
from tests import base

DEFAULT = engine.DEFAULT_GROUP
BEYOND = engine.BEYOND_GROUP
WRITE_WORKLOADS = (workloads.SequentialFirstWrites, workloads.NewClusterWrites,
                   workloads.DenseWritesQD1, workloads.DenseWritesQD16,
                   workloads.SmallWrites, workloads.FlushedWrites)
# A run small enough for a unit test: every timed run is timed (no floor).
TINY = dataclasses.replace(
    engine.QUICK, reps=1, write_disk=8 * units.Mi, write_base=8 * units.Mi,
    seq_bytes=8 * units.Mi, new_cluster_writes=64, dense_writes=64,
    small_writes=64, dense_disk=4 * units.Mi, flush_writes=32,
    small_base=2 * units.Mi, read_disk=4 * units.Gi, read_points=64,
    extents_disk=2 * units.Mi, cluster_sweep=(), min_seconds=0.0,
    new_cluster_disk=None)


def _qemu_img_info(path):
    out = subprocess.run(['qemu-img', 'info', '--output=json', '-U', path],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


class BenchCase(base.TestCase):

    def bench(self, config=TINY, **kwargs):
        bench = engine.Bench(self.instances_path, config, **kwargs)
        bench.__enter__()
        self.addCleanup(bench.__exit__, None, None, None)
        return bench


class BeyondTheBackingFileTestCase(BenchCase):
    """Every workload that writes over backing data also writes beyond
    it, as separate rows.
    """

    def test_every_write_workload_has_the_rows(self):
        bench = self.bench(engine.DEFAULT)
        cfg = bench.config
        self.assertEqual({cls.name for cls in WRITE_WORKLOADS},
                         set(cfg.beyond_eof))
        for cls in WRITE_WORKLOADS:
            w = cls()
            groups = dict(w.groups(bench))
            # The same rows as over the backing data, references included.
            self.assertEqual(groups[DEFAULT], groups[BEYOND], w.name)
            self.assertIn(BEYOND, w.default_groups(bench))
            # The writes start at the end of the backing file, in a disk
            # that much larger: the same writes, none over backing data.
            self.assertEqual(0, w.offset(bench, DEFAULT))
            offset = w.offset(bench, BEYOND)
            self.assertEqual(cfg.small_base, offset)
            self.assertEqual(cfg.small_base,
                             w.group_base_size(bench, BEYOND))
            self.assertEqual(offset + w.disk_size(bench),
                             w.group_disk_size(bench, BEYOND))
            self.assertEqual(w.count(bench, DEFAULT), w.count(bench, BEYOND))
            step = w.step(bench, BEYOND) or w.block
            self.assertLessEqual(
                offset + w.count(bench, BEYOND) * step,
                w.group_disk_size(bench, BEYOND), w.name)
            self.assertIn('-o %d' % offset, w.pattern_text(bench, BEYOND))
            self.assertNotIn('-o', w.pattern_text(bench, DEFAULT))
            self.assertIn(BEYOND, w.describe(bench))

    def test_new_cluster_writes_against_a_sparse_raw_file(self):
        # Mode metadata's data clusters are thin: its physical limit is a
        # raw file whose blocks its first writes allocate, a row of its own
        # over the backing data and beyond it, with the ratio to it.
        # The fewest writes timed, 128 KiB apart.
        size = workloads.MIN_NEW_CLUSTER_WRITES * 128 * units.Ki
        bench = self.bench(dataclasses.replace(
            TINY, beyond_eof=(workloads.NewClusterWrites.name,),
            write_disk=size, write_base=size,
            new_cluster_writes=workloads.MIN_NEW_CLUSTER_WRITES))
        out = bench.run_workload(workloads.NewClusterWrites())
        report.add_ratios(out)
        rows = {(c['variant'], c['group']): c for c in out['cases']}
        for group in (DEFAULT, BEYOND):
            sparse = rows[('raw-sparse', group)]
            self.assertIsNone(sparse['error'], sparse)
            self.assertEqual(0, sparse['extra']['allocated']['median'])
            self.assertIn('raw-sparse',
                          rows[('plugin-metadata', group)]['ratios'])
        text = '\n'.join(report.workload_lines(out, 1))
        self.assertIn('x raw sparse', text)

    def test_a_run_can_leave_them_out(self):
        bench = self.bench(dataclasses.replace(engine.DEFAULT,
                                               beyond_eof=()))
        w = workloads.DenseWritesQD1()
        self.assertEqual([DEFAULT], [g for g, _v in w.groups(bench)])
        self.assertNotIn(BEYOND, {c.group for c in w.cases(bench)})

    def test_writes_land_past_the_end_of_the_backing_file(self):
        # qemu-img bench really runs; what it is given is looked at on its
        # way (the overlay's backing file and size, the offset).
        bench = self.bench()
        seen = []
        real = tools.bench_timed

        def spy(opts, count, size, depth=16, offset=0, step=None, **kw):
            path = dict(item.split('=', 1) for item in opts.split(',')
                        if '=' in item)['file.filename']
            info = _qemu_img_info(path)
            backing = info.get('backing-filename')
            seen.append((offset, count * max(step or size, size),
                         info['virtual-size'],
                         os.path.getsize(backing) if backing else None))
            return real(opts, count, size, depth=depth, offset=offset,
                        step=step, **kw)

        w = workloads.DenseWritesQD16()
        case = engine.Case(variants.PLUGIN_METADATA, group=BEYOND)
        with mock.patch.object(tools, 'bench_timed', spy):
            sample = w.measure(bench, case, 0)
            over = w.measure(bench, engine.Case(variants.PLUGIN_METADATA,
                                                group=DEFAULT), 0)
        (offset, span, size, backing), (offset0, _s, _z, backing0) = seen
        self.assertEqual(TINY.small_base, backing)
        self.assertGreaterEqual(offset, backing)
        self.assertLessEqual(offset + span, size)
        # Over the backing data: from 0, over a backing file as large as
        # the disk.
        self.assertEqual((0, TINY.dense_disk), (offset0, backing0))
        for s in (sample, over):
            self.assertGreater(s.value, 0)
            self.assertGreater(s.extra['cpu_per_io'], 0)


class ReadsTestCase(BenchCase):
    """The random reads: a cold and a warm figure from one process."""

    def test_cold_and_warm_rows(self):
        bench = self.bench()
        w = workloads.RandomReads()
        out = bench.run_workload(w)
        groups = [out['cold_group'], out['warm_group']]
        self.assertIn('cold: first pass in a fresh QEMU', groups[0])
        self.assertIn('warm: second pass over the same points', groups[1])
        self.assertEqual(4 * units.Gi, out['disk_size'])
        rows = {(c['variant'], c['group']): c for c in out['cases']}
        points = w.points(bench)
        for variant in workloads.RandomReads.VARIANTS:
            cold = rows[(variant.key, groups[0])]
            warm = rows[(variant.key, groups[1])]
            for row in (cold, warm):
                self.assertIsNone(row['error'], row)
                self.assertIsNone(row['skip'], row)
                self.assertEqual(1, row['n'])
            # One process gave both figures: the same CPU per read.
            self.assertEqual(cold['extra']['cpu_per_io']['samples'],
                             warm['extra']['cpu_per_io']['samples'])
            self.assertGreater(warm['extra']['cpu_per_io']['median'], 0)
        metadata = rows[('plugin-metadata', groups[1])]['facts']
        # 128 KiB clusters with extended_l2: 16-byte entries, an L2 table
        # of one cluster maps 8192 clusters: 1 GiB.
        self.assertEqual('128 KiB (maps 1 GiB)', metadata['l2_entry'])
        self.assertEqual(str(len({p // units.Gi for p in points})),
                         metadata['l2_tables'])
        self.assertEqual('4 GiB (100%)', metadata['l2_coverage'])
        nova = rows[('nova-none', groups[0])]['facts']
        self.assertEqual('64 KiB (maps 512 MiB)', nova['l2_entry'])
        self.assertEqual(str(len({p // (512 * units.Mi) for p in points})),
                         nova['l2_tables'])
        self.assertEqual('-', rows[('raw-sparse', groups[0])]['facts'][
            'l2_entry'])
        report.add_ratios(out)
        self.assertIn('raw-sparse', rows[('plugin-metadata', groups[0])][
            'ratios'])
        text = '\n'.join(report.workload_lines(out, 1))
        self.assertIn('L2 cache entry', text)
        self.assertIn('CPU per read (both passes)', text)

    def test_passes_are_timed_apart_in_one_process(self):
        path = os.path.join(self.instances_path, 'disk.raw')
        with open(path, 'wb') as f:
            f.truncate(4 * units.Mi)
        opts = tools.image_opts(path, 'raw', 'native')
        requests = [(0, 4096), (units.Mi, 4096)]
        (first, second), cpu = tools.qemu_io_passes(
            opts, [requests, requests[:1]], min_seconds=0.0)
        self.assertGreater(first, 0)
        self.assertGreater(second, 0)
        self.assertGreater(cpu, 0)
        # Each pass sums its own requests' times.
        self.assertEqual([3.0, 4.0, 0], tools.pass_seconds([1.0, 2.0, 4.0],
                                                           [2, 1, 0]))
        # Each pass is held to the floor on its own.
        self.assertRaises(tools.TooShort, tools.qemu_io_passes, opts,
                          [requests, requests], min_seconds=3600.0)


class CpuTestCase(base.TestCase):

    def test_cpu_is_the_commands_own(self):
        # The child burns CPU until its own clock says 0.2 s, and prints
        # it: what the kernel accounts for the process is at least that.
        # This process, waiting meanwhile, uses next to none.
        code = ('import time\n'
                'while time.process_time() < 0.2:\n'
                '    pass\n'
                'print(time.process_time())\n')
        out, cpu = tools.run_counted([sys.executable, '-c', code])
        self.assertGreaterEqual(cpu, float(out))
        self.assertGreaterEqual(float(out), 0.2)

    def test_cpu_column(self):
        self.assertEqual('12.5 us', report.fmt_kind(12.5e-6, 'micros'))
        self.assertEqual('-', report.fmt_kind(None, 'micros'))
        for cls in WRITE_WORKLOADS + (workloads.Extents,):
            self.assertIn('cpu_per_io',
                          [key for key, _h, _k in cls.extra_columns])


class Leader(workloads.Workload):
    """Two rows per variant, the second measured with the first."""

    name = 'leader'
    title = 'Leader'
    unit = 'ops'
    references = ('raw-fallocated',)
    fail = None

    def __init__(self):
        self.measured = []

    def engine_text(self, bench):
        return 'none'

    def describe(self, bench):
        return 'nothing'

    def cases(self, bench):
        out = []
        for variant in (variants.RAW_FALLOCATED, variants.PLUGIN_SPACE):
            lead = engine.Case(variant, group='warm')
            out += [engine.Case(variant, group='cold').follow(lead), lead]
        return out

    def measure(self, bench, case, rep):
        self.measured.append((case.variant.key, case.group))
        if self.fail and case.variant is variants.PLUGIN_SPACE:
            raise self.fail
        (follower,) = case.followers
        return engine.Sample(2.0, {'cpu_per_io': 1e-5}, followers=[
            (follower, engine.Sample(1.0, {'cpu_per_io': 1e-5}))])


class EngineTestCase(BenchCase):

    def run_leader(self, fail=None):
        w = Leader()
        w.fail = fail
        out = self.bench(dataclasses.replace(TINY, reps=2)).run_workload(w)
        return w, {(c['variant'], c['group']): c for c in out['cases']}

    def test_followers_get_their_leaders_samples(self):
        w, rows = self.run_leader()
        # Only leaders are measured.
        self.assertEqual({('raw-fallocated', 'warm'),
                          ('plugin-space', 'warm')}, set(w.measured))
        self.assertEqual(4, len(w.measured))
        self.assertEqual([1.0, 1.0], rows[('plugin-space', 'cold')][
            'samples'])
        self.assertEqual([2.0, 2.0], rows[('plugin-space', 'warm')][
            'samples'])

    def test_a_leaders_skip_and_error_are_its_followers(self):
        _w, rows = self.run_leader(tools.TooShort(['qemu-io'], 'too short'))
        for group in ('cold', 'warm'):
            row = rows[('plugin-space', group)]
            self.assertEqual('not shown: too short', row['skip'])
            self.assertEqual([None, None], row['samples'])
        _w, rows = self.run_leader(tools.ToolError(['qemu-io'], 'boom'))
        for group in ('cold', 'warm'):
            self.assertEqual('qemu-io: boom',
                             rows[('plugin-space', group)]['error'])

    def test_a_stopped_run_reports_what_it_did(self):
        class Stopped(Leader):
            name = 'stopped'

            def measure(self, bench, case, rep):
                raise KeyboardInterrupt()

        bench = self.bench()
        result = bench.run([Leader(), Stopped(), Leader()])
        self.assertEqual(['leader'], [w['name'] for w in result['workloads']])
        self.assertEqual('stopped during workload stopped (2 of 3): it and '
                         'the workloads after it are not in this report',
                         result['interrupted'])
        report.finalize(result)
        self.assertTrue(report.has_errors(result))
        self.assertIn('INTERRUPTED: stopped during workload stopped',
                      report.render(result))

    def test_a_signal_stops_the_run_between_two_cases(self):
        # The first SIGTERM inside stopping.on_signals (the command's): the
        # case running ends, the next one is not measured, the run
        # reports the workloads before.
        class Signalled(Leader):
            name = 'signalled'

            def measure(self, bench, case, rep):
                if not self.measured:
                    os.kill(os.getpid(), signal.SIGTERM)
                return super().measure(bench, case, rep)

        bench = self.bench()
        signalled = Signalled()
        with stopping.on_signals():
            result = bench.run([Leader(), signalled, Leader()])
        self.assertEqual(1, len(signalled.measured))
        self.assertEqual(['leader'], [w['name'] for w in result['workloads']])
        self.assertEqual('stopped during workload signalled (2 of 3): it '
                         'and the workloads after it are not in this '
                         'report', result['interrupted'])

    def test_a_signal_before_the_first_workload(self):
        bench = self.bench()
        leader = Leader()
        with stopping.on_signals():
            os.kill(os.getpid(), signal.SIGINT)
            result = bench.run([leader])
        self.assertEqual([], leader.measured)
        self.assertEqual([], result['workloads'])
        self.assertEqual('unknown', result['host']['qemu_img'])
        self.assertIn('stopped before the first workload',
                      result['interrupted'])
        report.finalize(result)
        self.assertIn('INTERRUPTED: stopped before the first workload',
                      report.render(result))

    def test_a_tool_is_not_started_once_stopped(self):
        with stopping.on_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            self.assertRaises(stopping.Stopped, tools.run, ['true'])


class PrivsepTestCase(base.TestCase):
    """Only the bench's entry point runs privsep in-process, for its run."""

    CONTEXTS = (prealloc_backend.privsep.ctx, nova.privsep.sys_admin_pctxt)

    def client_mode(self):
        return [ctx.client_mode for ctx in self.CONTEXTS]

    def setUp(self):
        super().setUp()
        # As nova-compute has them (base.TestCase runs them in-process).
        for ctx in self.CONTEXTS:
            ctx.set_client_mode(True)
            self.addCleanup(ctx.set_client_mode, False)

    def test_bench_leaves_privsep_alone_unless_asked(self):
        with engine.Bench(self.instances_path, TINY) as bench:
            self.assertEqual([True, True], self.client_mode())
            result = bench.run([])
        self.assertIn('privsep daemons (client mode on)', result['privsep'])
        with engine.Bench(self.instances_path, TINY,
                          privsep_in_process=True) as bench:
            self.assertEqual([False, False], self.client_mode())
            result = bench.run([])
        self.assertIn('in-process', result['privsep'])
        self.assertEqual([True, True], self.client_mode())

    def test_importing_the_bench_changes_nothing(self):
        code = ('import nova.privsep, prealloc_backend.privsep\n'
                'from prealloc_bench import engine, workloads\n'
                'from prealloc_bench import cmd\n'
                'print(prealloc_backend.privsep.ctx.client_mode,\n'
                '      nova.privsep.sys_admin_pctxt.client_mode)\n')
        out = subprocess.run([sys.executable, '-c', code], check=True,
                             capture_output=True, text=True).stdout
        self.assertEqual('True True', out.strip())

    def test_the_command_runs_privsep_in_process(self):
        seen = []

        def run(bench, chosen):
            seen.append(self.client_mode())
            return {'schema': engine.SCHEMA_VERSION, 'run': 'quick',
                    'argv': [], 'config': {'reps': 1}, 'date': 'now',
                    'host': bench.host(), 'privsep': engine.privsep_text(),
                    'workloads': [], 'seconds': 0.0}

        parser = __import__('argparse').ArgumentParser()
        cmd_bench.add_arguments(parser)
        args = parser.parse_args(['--quick', '--only', 'create', '--dir',
                                  self.instances_path])
        with mock.patch.object(engine.Bench, 'run', run), \
                mock.patch('sys.stdout') as stdout:
            self.assertEqual(0, cmd_bench.run(args))
        self.assertEqual([[False, False]], seen)
        self.assertEqual([True, True], self.client_mode())
        self.assertIn('privsep: in-process',
                      ''.join(c.args[0] for c in stdout.write.mock_calls))
