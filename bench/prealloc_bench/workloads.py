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

"""The workloads, and the registry that lists them in run order.

Each workload names its variants (rows), makes their disks through
prealloc_bench.variants, measures one repetition of one row in
``measure()`` and says which engine it used. The engine (engine.Bench)
repeats and interleaves.

Every first-write workload writes into fresh disks (a new disk per sample)
whose backing file holds random data, opened by QEMU the same way for every
variant (variants.AIO, variants.CACHE). Rows are grouped: the plugin's
default layout beside nova and raw, writing over the backing data; for the
workloads of Config.beyond_eof the same rows again, writing beyond the end
of a smaller backing file (a disk larger than its image: most of a real
disk, where a first write has nothing to copy); then, for the workloads of
Config.cluster_sweep, each opt-in cluster size beside raw fallocated,
measured in the same repetitions. Next to each figure, the CPU time of the
QEMU process per request (tools.Timed).

Adding a workload (an in-guest one, say): subclass Workload and decorate it
with ``@register``, or expose the class under the entry point group
``prealloc_backend.bench_workloads``; load_extensions() registers those
before a run.

Workloads run as the user the benchmark runs as, in the Bench's scratch
directory (as root only where nobody else can change it: engine.Bench).
"""

import importlib.metadata
import random

from oslo_log import log as logging
from oslo_utils import units

from prealloc_backend.planner import qcow2_layout
from prealloc_backend import sizes
from prealloc_bench import engine
from prealloc_bench import tools
from prealloc_bench import variants as vs

LOG = logging.getLogger(__name__)
CONF = vs.CONF

ENTRY_POINT_GROUP = 'prealloc_backend.bench_workloads'
REGISTRY = {}

# Variants of every first-write workload, at the plugin's default layout.
WRITE_VARIANTS = (vs.RAW_FALLOCATED, vs.RAW_ZERO, vs.NOVA_NONE,
                  vs.NOVA_SPACE, vs.PLUGIN_NONE, vs.PLUGIN_METADATA,
                  vs.PLUGIN_SPACE, vs.PLUGIN_FULL)
# Plugin variants measured again at every opt-in cluster size, beside the
# raw fallocated reference (workloads named in Config.cluster_sweep).
SWEEP_VARIANTS = (vs.PLUGIN_METADATA, vs.PLUGIN_SPACE)
DEFAULT_GROUP = engine.DEFAULT_GROUP
BEYOND_GROUP = engine.BEYOND_GROUP
# Extra column: CPU seconds of the QEMU process per request.
CPU_COLUMN = ('cpu_per_io', 'CPU per I/O', 'micros')
KiB4 = 4 * units.Ki
# Fewest 4 KiB new-cluster writes timed: a raw file takes them in tens of
# milliseconds.
MIN_NEW_CLUSTER_WRITES = 512


def register(cls):
    """Class decorator: add a Workload subclass to the run (in order)."""
    REGISTRY[cls.name] = cls
    return cls


def load_extensions():
    """Register the workloads other packages expose as entry points."""
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            cls = entry.load()
        except Exception as exc:  # an extension must not stop the run
            LOG.warning('Bench workload %(name)s not loaded: %(err)s',
                        {'name': entry.name, 'err': exc})
            continue
        if isinstance(cls, type) and issubclass(cls, Workload):
            register(cls)


def instances():
    return [cls() for cls in REGISTRY.values()]


def default_cluster(bench, size):
    """Cluster size diskplan.make_plan gives a plugin overlay of ``size``
    bytes with the default options (None: nova's own choice).
    """
    return bench.default_cluster(size)


def opt_in_clusters(bench, size):
    """Names of the cluster sizes an operator can ask for, other than the
    one the plan gives by default: [('256K', 262144), ...].
    """
    default = default_cluster(bench, size) or qcow2_layout.MIN_CLUSTER
    return [(name, value) for name, value in qcow2_layout.CLUSTER_SIZES.items()
            if value != default]


def sweep_group(name):
    return '%s asked' % name


def cache_text(disk):
    """What the qcow2 metadata cache of the disk is, as QEMU gets it."""
    if disk.fmt != 'qcow2':
        return '-'
    if disk.cache_size:
        return 'cache-size %s' % sizes.human(disk.cache_size)
    return 'QEMU default'


def cluster_text(disk):
    if not disk.cluster_size:
        return '-'
    return sizes.human(disk.cluster_size) + (
        ' ext-L2' if disk.extended_l2 else '')


def disk_facts(disk):
    return {'cluster': cluster_text(disk), 'cache': cache_text(disk),
            'format': disk.fmt}


class Workload:
    """One kind of measurement. Subclasses set the class attributes."""

    name = None
    title = None
    unit = None
    higher_is_better = True
    # Extra per-sample figures to show as columns: [(key, header, kind)],
    # kind 'bytes', 'seconds', 'micros' (seconds shown in microseconds) or
    # 'number'.
    extra_columns = ()
    fact_columns = ()

    def engine_text(self, bench):
        raise NotImplementedError()

    def describe(self, bench):
        """What is measured, in a sentence."""
        raise NotImplementedError()

    def setup(self, bench):
        pass

    def cases(self, bench):
        raise NotImplementedError()

    def measure(self, bench, case, rep):
        raise NotImplementedError()

    def teardown(self, bench):
        pass

    # Reference rows ratios are taken against, in this order.
    references = ()
    # 'write': a first-write pattern (the none and full targets apply).
    kind = None

    def default_groups(self, bench):
        """Groups whose plugin rows have a layout the plan gives by
        default (the targets that hold "at every default cluster size").
        """
        return [DEFAULT_GROUP]

    def result_fields(self, bench):
        """More keys of the workload's result (what its targets need)."""
        return {}

    def result(self, bench, cases, error=None, seconds=None):
        rows = []
        for case in cases:
            row = {'variant': case.variant.key, 'label': case.variant.label,
                   'cluster_asked': case.variant.cluster,
                   'family': case.variant.family, 'mode': case.variant.mode,
                   'group': case.group, 'skip': case.skip,
                   'error': case.error, 'samples': case.samples,
                   'facts': case.facts,
                   'extra': {name: dict(engine.summary(values),
                                        samples=values)
                             for name, values in case.extra.items()}}
            row.update(engine.summary(case.samples))
            rows.append(row)
        return {'name': self.name, 'title': self.title, 'unit': self.unit,
                'higher_is_better': self.higher_is_better,
                'references': list(self.references), 'kind': self.kind,
                'default_groups': self.default_groups(bench),
                'engine': self.engine_text(bench),
                'setup': self.describe(bench), 'error': error,
                'seconds': seconds, 'extra_columns': list(self.extra_columns),
                'fact_columns': list(self.fact_columns), 'cases': rows,
                **self.result_fields(bench)}


class _FirstWrites(Workload):
    """qemu-img bench writes into a fresh disk per sample."""

    kind = 'write'
    unit = 'IOPS'
    block = KiB4
    depth = 16
    flush = False
    # Also the raw sparse file (the seeds' "sparse raw" row).
    extra_variants = ()
    references = ('raw-fallocated', 'raw-zero-written', 'nova-none',
                  'nova-space')
    extra_columns = (('allocated', 'allocated before', 'bytes'),
                     ('create_seconds', 'created in', 'seconds'),
                     CPU_COLUMN)
    fact_columns = (('cluster', 'cluster'), ('cache', 'metadata cache'))

    def count(self, bench, group):
        raise NotImplementedError()

    def disk_size(self, bench):
        """Virtual size of the disks, and data in their backing file."""
        return bench.config.write_disk

    def beyond(self, bench):
        """Whether this run also writes beyond the backing file."""
        return self.name in bench.config.beyond_eof

    def offset(self, bench, group):
        """Where the writes start: 0 over the backing data; beyond it,
        the end of the (smaller) backing file of that group.
        """
        return bench.config.small_base if group == BEYOND_GROUP else 0

    def group_disk_size(self, bench, group):
        """Virtual size of the group's disks: beyond the backing file, the
        same writes start at its end, so the disk is that much larger.
        """
        return self.offset(bench, group) + self.disk_size(bench)

    def group_base_size(self, bench, group):
        if group == BEYOND_GROUP:
            return bench.config.small_base
        return self.base_size(bench)

    def step(self, bench, group):
        return None

    def written(self, bench, group):
        """Bytes the writes touch (space they can take in a thin disk)."""
        step = self.step(bench, group) or self.block
        return self.count(bench, group) * max(step, KiB4)

    def describe(self, bench):
        text = ('fresh %s disks per sample: qcow2 overlays of a raw backing '
                'file of %s random data, raw files for the raw rows' % (
                    sizes.human(self.disk_size(bench)),
                    sizes.human(self.base_size(bench))))
        if self.beyond(bench):
            offset = self.offset(bench, BEYOND_GROUP)
            text += ('; "%s": the same writes from offset %s of %s disks '
                     'whose backing file holds %s, so every write lands '
                     'past its end (nothing to copy: most of a real disk)'
                     % (BEYOND_GROUP, sizes.human(offset),
                        sizes.human(self.group_disk_size(
                            bench, BEYOND_GROUP)),
                        sizes.human(self.group_base_size(
                            bench, BEYOND_GROUP))))
        return text

    def base_size(self, bench):
        if self.disk_size(bench) == bench.config.write_disk:
            return bench.config.write_base
        return self.disk_size(bench)

    def pattern_text(self, bench, group):
        step = self.step(bench, group)
        text = '-s %d -d %d -c %d' % (self.block, self.depth,
                                      self.count(bench, group))
        if step:
            text += ' -S %d' % step
        if self.offset(bench, group):
            text += ' -o %d' % self.offset(bench, group)
        if self.flush:
            text += ' --flush-interval=%d' % bench.config.flush_interval
        return text

    def engine_text(self, bench):
        text = ('qemu-img %s bench -w %s, --image-opts with file.aio=%s and '
                'cache.direct=on (cache=%s) for every variant; qemu-img\'s '
                'own timer (requests only, no process start or open)' % (
                    tools.version(), self.pattern_text(bench, DEFAULT_GROUP),
                    vs.AIO, vs.CACHE))
        if self.beyond(bench):
            text += '; beyond the backing file: -o %d' % self.offset(
                bench, BEYOND_GROUP)
        return text + ('; CPU per I/O: user + system seconds of the '
                       'qemu-img process (its whole run) / requests')

    def unmeasurable(self, bench):
        """Why this workload cannot be measured honestly here, or None."""
        return None

    def setup(self, bench):
        for group, _variants in self.groups(bench):
            bench.base(self.group_base_size(bench, group))

    def default_groups(self, bench):
        cfg = bench.config
        defaults = {default_cluster(bench, size) for size in
                    (cfg.write_disk, cfg.read_disk) + tuple(cfg.create_sizes)}
        out = [DEFAULT_GROUP]
        for group, _variants in self.groups(bench)[1:]:
            if group == BEYOND_GROUP:
                out.append(group)
            elif qcow2_layout.CLUSTER_SIZES[group.split()[0]] in defaults:
                out.append(group)
        return out

    def groups(self, bench):
        """[(group, variants)]: the default layout over the backing data,
        beyond it (Config.beyond_eof), then opt-in sizes.
        """
        size = self.disk_size(bench)
        groups = [(DEFAULT_GROUP, WRITE_VARIANTS + self.extra_variants)]
        if self.beyond(bench):
            groups.append((BEYOND_GROUP,
                           WRITE_VARIANTS + self.extra_variants))
        if self.name in bench.config.cluster_sweep:
            for name, _value in opt_in_clusters(bench, size):
                groups.append((sweep_group(name), (vs.RAW_FALLOCATED,) +
                               tuple(v.with_cluster(name)
                                     for v in SWEEP_VARIANTS)))
        return groups

    def too_few(self, bench, group):
        """Why the group's writes are too few to time, or None."""
        return None

    def cases(self, bench):
        why = self.unmeasurable(bench)
        cases = []
        for group, variants in self.groups(bench):
            for variant in variants:
                skip = (why or self.too_few(bench, group) or
                        bench.cannot_reserve(
                            variant, self.group_disk_size(bench, group),
                            written=self.written(bench, group)))
                cases.append(engine.Case(variant, group=group, skip=skip))
        return cases

    def measure(self, bench, case, rep):
        cfg = bench.config
        group = case.group
        disk = vs.make_disk(case.variant, bench.workdir,
                            bench.base(self.group_base_size(bench, group)),
                            self.group_disk_size(bench, group))
        count = self.count(bench, group)
        try:
            case.facts.update(disk_facts(disk))
            allocated = disk.allocated
            timed = tools.bench_timed(
                disk.opts(), count=count, size=self.block, depth=self.depth,
                offset=self.offset(bench, group), step=self.step(bench, group),
                flush_interval=(cfg.flush_interval if self.flush else None),
                min_seconds=cfg.min_seconds)
        finally:
            disk.remove()
        return engine.Sample(self.value(bench, group, timed.seconds),
                             {'allocated': allocated,
                              'create_seconds': disk.create_seconds,
                              'cpu_per_io': timed.cpu_seconds / count})

    def value(self, bench, group, seconds):
        return self.count(bench, group) / seconds


@register
class SequentialFirstWrites(_FirstWrites):
    name = 'seq-write'
    title = 'Sequential first writes, 64 KiB, queue depth 16'
    unit = 'MiB/s'
    block = 64 * units.Ki
    extra_variants = (vs.RAW_SPARSE,)

    def count(self, bench, group):
        cfg = bench.config
        return min(cfg.seq_bytes, cfg.write_disk) // self.block

    def value(self, bench, group, seconds):
        return self.count(bench, group) * self.block / units.Mi / seconds


@register
class NewClusterWrites(_FirstWrites):
    name = 'new-cluster-write'
    title = '4 KiB writes, each into a new cluster, queue depth 16'
    # The raw sparse file: the physical limit of a disk whose blocks are
    # allocated by its first writes (mode metadata's data clusters).
    extra_variants = (vs.RAW_SPARSE,)
    references = _FirstWrites.references + ('raw-sparse',)

    def _cluster(self, bench, group):
        if group in (DEFAULT_GROUP, BEYOND_GROUP):
            return default_cluster(bench, self.group_disk_size(bench, group))
        return qcow2_layout.CLUSTER_SIZES[group.split()[0]]

    def step(self, bench, group):
        """Distance between writes: the largest cluster of the group's
        variants (nova's overlays and the minimum: 64 KiB).
        """
        return max(qcow2_layout.MIN_CLUSTER, self._cluster(bench, group) or 0)

    def _summary_disk(self, bench, group):
        """Config.new_cluster_disk for the default layout's disks (the
        report's summary) where set (a quick run's), else None.
        """
        if group == DEFAULT_GROUP:
            return bench.config.new_cluster_disk
        return None

    def group_disk_size(self, bench, group):
        return (self._summary_disk(bench, group) or
                super().group_disk_size(bench, group))

    def group_base_size(self, bench, group):
        return (self._summary_disk(bench, group) or
                super().group_base_size(bench, group))

    def count(self, bench, group):
        """As many writes as fit over the backing data (beyond it: in the
        same span of the disk), at most Config.new_cluster_writes.
        """
        span = self.group_disk_size(bench, group) - self.offset(bench, group)
        if group != BEYOND_GROUP:
            span = min(self.group_base_size(bench, group), span)
        return min(bench.config.new_cluster_writes,
                   span // self.step(bench, group))

    def too_few(self, bench, group):
        count = self.count(bench, group)
        if count < MIN_NEW_CLUSTER_WRITES:
            return ('not measured in this run: %d writes %s apart over %s '
                    'of backing data are too few to time (at least %d); '
                    'the default run measures them' % (
                        count, sizes.human(self.step(bench, group)),
                        sizes.human(self.group_base_size(bench, group)),
                        MIN_NEW_CLUSTER_WRITES))
        return None

    def engine_text(self, bench):
        return super().engine_text(bench) + (
            '; opt-in sizes: -S their cluster size, -c as many writes as '
            'fit over the backing data')

    def describe(self, bench):
        text = super().describe(bench)
        size = self._summary_disk(bench, DEFAULT_GROUP)
        if size:
            text += ('; "%s": %s disks over %s of random data, so that %d '
                     'writes time the fastest rows' % (
                         DEFAULT_GROUP, sizes.human(size), sizes.human(size),
                         self.count(bench, DEFAULT_GROUP)))
        return text + '; every write lands in a cluster not written before'


@register
class DenseWritesQD1(_FirstWrites):
    name = 'dense-4k-qd1'
    title = 'Dense sequential 4 KiB first writes, queue depth 1'
    depth = 1

    def count(self, bench, group):
        return bench.config.dense_writes

    def disk_size(self, bench):
        return bench.config.dense_disk


@register
class DenseWritesQD16(DenseWritesQD1):
    name = 'dense-4k-qd16'
    title = 'Dense sequential 4 KiB first writes, queue depth 16'
    depth = 16


@register
class SmallWrites(_FirstWrites):
    name = 'write-512'
    title = 'Dense sequential 512-byte first writes, queue depth 16'
    block = 512

    def count(self, bench, group):
        return bench.config.small_writes

    def disk_size(self, bench):
        return bench.config.dense_disk

    def unmeasurable(self, bench):
        reason = tools.check_direct_io(bench.workdir, self.block)
        if reason:
            return ('not measured: %s; QEMU would turn every 512-byte '
                    'write into a read-modify-write of its own, for every '
                    'variant alike' % reason)
        return None


@register
class FlushedWrites(_FirstWrites):
    name = 'flush-4k'
    title = 'Dense sequential 4 KiB first writes, queue depth 1, a flush ' \
            'every N writes'
    depth = 1
    flush = True

    def count(self, bench, group):
        return bench.config.flush_writes

    def disk_size(self, bench):
        return bench.config.dense_disk


@register
class RandomReads(Workload):
    """Random reads over written points of a large disk, cold and warm.

    One qemu-io process per row and repetition reads every point twice,
    each pass in its own seeded order. The first pass starts with QEMU's
    qcow2 metadata cache empty (a fresh process), so each L2 table the
    points fall in is read from the file on its first touch: the cold
    figure, what a guest sees right after it starts. The second pass
    finds in the cache every table the cache can hold: the warm figure,
    the steady state a guest lives in, which the targets judge.
    """

    name = 'random-read'
    title = 'Random 4 KiB reads over written data, 1 TiB disks, queue ' \
            'depth 1, cold and warm metadata cache'
    unit = 'reads/s'
    VARIANTS = (vs.RAW_SPARSE, vs.NOVA_NONE, vs.PLUGIN_NONE,
                vs.PLUGIN_METADATA, vs.PLUGIN_SPACE)
    references = ('raw-sparse', 'nova-none')
    extra_columns = (('cpu_per_io', 'CPU per read (both passes)',
                      'micros'),)
    fact_columns = (('cluster', 'cluster'), ('cache', 'metadata cache'),
                    ('l2_entry', 'L2 cache entry'),
                    ('l2_coverage', 'L2 cache covers'),
                    ('l2_tables', 'L2 tables read'))

    def __init__(self):
        self._disks = {}
        self._points = []

    @staticmethod
    def cold_group(bench):
        return ('%s, cold: first pass in a fresh QEMU, each L2 table read '
                'on its first touch' % sizes.human(
                    bench.config.read_disk))

    @staticmethod
    def warm_group(bench):
        return ('%s, warm: second pass over the same points, same QEMU'
                % sizes.human(bench.config.read_disk))

    def result_fields(self, bench):
        return {'disk_size': bench.config.read_disk,
                'cold_group': self.cold_group(bench),
                'warm_group': self.warm_group(bench)}

    def engine_text(self, bench):
        return ('qemu-io %s, one read at a time (-C), file.aio=%s, '
                'cache.direct=on for every variant; one process reads '
                'every point twice (cold pass, then warm pass); each '
                'figure is the sum of the times qemu-io reports for the '
                'reads of its pass (no process start, no command parsing); '
                'CPU per read: user + system seconds of the qemu-io process '
                '(both passes, start and open included) / reads; L2 cache '
                'entry: QEMU\'s l2-cache-entry-size, one cluster (neither '
                'libvirt nor the plugin sets it)'
                % (tools.version(tools.QEMU_IO), vs.AIO))

    def describe(self, bench):
        cfg = bench.config
        return ('%s disks (qcow2: overlays of a %s random-data backing '
                'file; raw: a sparse file), each first written at %d seeded '
                'random 4 KiB-aligned points (untimed); every repetition '
                'reads all %d points twice, each pass in its own seeded '
                'order, the same for every variant: no read lands on a hole '
                'or an unallocated cluster' % (
                    sizes.human(cfg.read_disk),
                    sizes.human(cfg.small_base),
                    cfg.read_points, cfg.read_points))

    def variants(self, bench):
        out = list(self.VARIANTS)
        if self.name in bench.config.cluster_sweep:
            for name, _value in opt_in_clusters(bench, bench.config.read_disk):
                out.append(vs.PLUGIN_METADATA.with_cluster(name))
        return out

    def points(self, bench):
        """The seeded 4 KiB-aligned points every variant is written and
        read at, sorted.
        """
        cfg = bench.config
        rng = random.Random(0)
        blocks = cfg.read_disk // KiB4
        return sorted({rng.randrange(blocks) * KiB4
                       for _ in range(cfg.read_points)})

    def cases(self, bench):
        cfg = bench.config
        base = bench.base(cfg.small_base)
        self._points = self.points(bench)
        # What one 4 KiB write can copy at most: a 64 KiB cluster (nova's
        # layout) or subcluster (2 MiB clusters with extended_l2).
        written = len(self._points) * qcow2_layout.MIN_CLUSTER
        cold_cases, warm_cases = [], []
        for variant in self.variants(bench):
            warm = engine.Case(variant, group=self.warm_group(bench))
            cold = engine.Case(variant, group=self.cold_group(bench))
            cold.follow(warm)
            cold_cases.append(cold)
            warm_cases.append(warm)
            warm.skip = cold.skip = bench.cannot_reserve(
                variant, cfg.read_disk, written=written)
            if warm.skip:
                continue
            try:
                disk = vs.make_disk(variant, bench.workdir, base,
                                    cfg.read_disk)
                self._disks[variant.key] = disk
                facts = dict(disk_facts(disk), **self.l2_facts(disk))
                warm.facts.update(facts)
                cold.facts.update(facts)
                # Preparation, not measured: cache=unsafe.
                tools.qemu_io_prepare(
                    disk.opts(direct=False, flush=False),
                    ((offset, KiB4) for offset in self._points))
            except engine.CASE_ERRORS as exc:
                warm.error = cold.error = str(exc)
        return cold_cases + warm_cases

    def l2_facts(self, disk):
        """The L2 cache entry of the disk (QEMU's l2-cache-entry-size: one
        cluster, unset by libvirt and the plugin) and the virtual bytes it
        maps, what the whole L2 cache covers, and how many L2 tables the
        points fall in: the tables the cold pass reads.
        """
        if disk.fmt != 'qcow2':
            return {'l2_entry': '-', 'l2_coverage': '-', 'l2_tables': '-'}
        info = tools.info(disk.path, 'qcow2')
        size, cluster = info['virtual-size'], info['cluster-size']
        extended = bool(disk.extended_l2)
        span = qcow2_layout.l2_coverage(cluster, extended, cluster)
        if disk.cache_size:
            # QEMU gives the refcount cache its minimum, the rest to L2.
            cache = disk.cache_size - (
                qcow2_layout.MIN_REFCOUNT_CACHE_CLUSTERS * cluster)
        else:
            cache = qcow2_layout.QEMU_DEFAULT_L2_CACHE
        covered = min(qcow2_layout.l2_coverage(cluster, extended, cache), size)
        tables = len({point // span for point in self._points})
        return {'l2_entry': '%s (maps %s)' % (sizes.human(cluster),
                                              sizes.human(span)),
                'l2_coverage': '%s (%d%%)' % (sizes.human(covered),
                                              round(100 * covered / size)),
                'l2_tables': str(tables)}

    def measure(self, bench, case, rep):
        disk = self._disks[case.variant.key]
        cold_order = list(self._points)
        random.Random(rep + 1).shuffle(cold_order)
        warm_order = list(self._points)
        random.Random(-(rep + 1)).shuffle(warm_order)
        (cold, warm), cpu = tools.qemu_io_passes(
            disk.opts(), [((offset, KiB4) for offset in cold_order),
                          ((offset, KiB4) for offset in warm_order)],
            min_seconds=bench.config.min_seconds)
        count = len(self._points)
        extra = {'cpu_per_io': cpu / (2 * count)}
        (follower,) = case.followers
        return engine.Sample(count / warm, dict(extra), followers=[
            (follower, engine.Sample(count / cold, dict(extra)))])

    def teardown(self, bench):
        for disk in self._disks.values():
            disk.remove()
        self._disks.clear()


@register
class Creation(Workload):
    name = 'create'
    title = 'Creation time and physical size'
    unit = 's'
    higher_is_better = False
    VARIANTS = (vs.RAW_FALLOCATED, vs.NOVA_NONE, vs.NOVA_SPACE,
                vs.PLUGIN_NONE, vs.PLUGIN_METADATA, vs.PLUGIN_SPACE)
    references = ('nova-none',)
    extra_columns = (('allocated', 'physical size', 'bytes'),)
    fact_columns = (('cluster', 'cluster'),)

    def engine_text(self, bench):
        return ('wall clock of Image.cache() (the plugin\'s or nova\'s, the '
                'call nova-compute makes, its qemu-img runs included), base '
                'image already in the image cache; physical size = '
                'allocated blocks (st_blocks) after: for none and metadata '
                'that is the qcow2 metadata')

    def describe(self, bench):
        return ('qcow2 overlays of a %s random-data backing file, as the '
                'root disk of a flavor of that size; the raw reference is '
                'one fallocate(2) call'
                % sizes.human(bench.config.small_base))

    def cases(self, bench):
        bench.base(bench.config.small_base)
        sweep = self.name in bench.config.cluster_sweep
        cases = []
        for size in bench.config.create_sizes:
            group = sizes.human(size)
            variants = list(self.VARIANTS)
            if sweep:
                variants += [vs.PLUGIN_METADATA.with_cluster(name)
                             for name, _v in opt_in_clusters(bench, size)]
            for variant in variants:
                cases.append(engine.Case(
                    variant, group=group, params={'size': size},
                    skip=bench.cannot_reserve(variant, size)))
            cases.append(engine.Case(
                vs.PLUGIN_FULL, group=group, params={'size': size},
                skip=('not measured: full writes %s of zeros; its creation '
                      'time at %s is in the seeds\' table'
                      % (sizes.human(size),
                         sizes.human(bench.config.write_disk)))))
        return cases

    def measure(self, bench, case, rep):
        disk = vs.make_disk(case.variant, bench.workdir,
                            bench.base(bench.config.small_base),
                            case.params['size'])
        try:
            case.facts.update(disk_facts(disk))
            allocated = disk.allocated
        finally:
            disk.remove()
        return engine.Sample(disk.create_seconds, {'allocated': allocated})


@register
class Extents(Workload):
    name = 'extents'
    title = 'Extents of a raw disk after writing it'
    unit = 'extents'
    higher_is_better = False
    VARIANTS = (vs.RAW_FALLOCATED, vs.NOVA_NONE, vs.NOVA_SPACE,
                vs.PLUGIN_NONE, vs.PLUGIN_SPACE, vs.PLUGIN_FULL)
    references = ('raw-fallocated',)
    BLOCK = 64 * units.Ki
    extra_columns = (('allocated', 'allocated before', 'bytes'),
                     ('extents_before', 'extents before', 'number'),
                     ('write_mib_s', 'write MiB/s', 'number'),
                     ('cpu_per_io', 'CPU per write', 'micros'))

    def engine_text(self, bench):
        return ('qemu-io %s writing every 64 KiB block once in a seeded '
                'random order, one at a time, file.aio=%s, cache.direct=on '
                '(MiB/s: the sum of qemu-io\'s per-request times; CPU per '
                'write: user + system seconds of the qemu-io process / '
                'writes); then filefrag (FIEMAP)'
                % (tools.version(tools.QEMU_IO), vs.AIO))

    def describe(self, bench):
        return ('%s raw disks (images_type=raw: a copy of a %s random-data '
                'base image, grown; plugin metadata does nothing to raw '
                'disks, so it is not shown) on %s' % (
                    sizes.human(bench.config.extents_disk),
                    sizes.human(bench.config.small_base),
                    bench.fs_type))

    def cases(self, bench):
        bench.base(bench.config.small_base)
        return [engine.Case(v, skip=bench.cannot_reserve(
            v, bench.config.extents_disk, 'raw')) for v in self.VARIANTS]

    def measure(self, bench, case, rep):
        cfg = bench.config
        disk = vs.make_disk(case.variant, bench.workdir,
                            bench.base(cfg.small_base), cfg.extents_disk,
                            images_type='raw')
        try:
            case.facts.update(disk_facts(disk))
            allocated = disk.allocated
            before = tools.filefrag(disk.path)
            order = list(range(0, cfg.extents_disk, self.BLOCK))
            random.Random(rep + 1).shuffle(order)
            timed = tools.qemu_io_timed(
                disk.opts(), ((offset, self.BLOCK) for offset in order),
                op='write', min_seconds=cfg.min_seconds)
            extents = tools.filefrag(disk.path)
        finally:
            disk.remove()
        return engine.Sample(extents, {
            'allocated': allocated, 'extents_before': before,
            'write_mib_s': cfg.extents_disk / units.Mi / timed.seconds,
            'cpu_per_io': timed.cpu_seconds / len(order)})
