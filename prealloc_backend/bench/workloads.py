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
prealloc_backend.bench.variants, measures one repetition of one row in
``measure()`` and says which engine it used. The engine (engine.Bench)
repeats and interleaves.

Adding a workload (an in-guest one, say): subclass Workload and decorate it
with ``@register``, or expose the class under the entry point group
``prealloc_backend.bench_workloads``; load_extensions() registers those
before a run.
"""

import importlib.metadata
import random

from oslo_log import log as logging
from oslo_utils import units

from prealloc_backend.bench import engine
from prealloc_backend.bench import tools
from prealloc_backend.bench import variants as vs
from prealloc_backend import policy

LOG = logging.getLogger(__name__)
CONF = vs.CONF

ENTRY_POINT_GROUP = 'prealloc_backend.bench_workloads'
REGISTRY = {}

# Variants of the qcow2 write workloads (1, 2) and of the creation table.
WRITE_VARIANTS = (vs.RAW_REF, vs.NOVA_NONE, vs.NOVA_SPACE, vs.PLUGIN_NONE,
                  vs.PLUGIN_METADATA, vs.PLUGIN_SPACE, vs.PLUGIN_FULL)
KiB4 = 4 * units.Ki


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


def cache_text(disk):
    """What the qcow2 metadata cache of the disk is, as QEMU gets it."""
    if disk.fmt != 'qcow2':
        return '-'
    if disk.cache_size:
        return 'cache-size %s' % engine.fmt_bytes(disk.cache_size)
    return 'QEMU default'


def disk_facts(disk):
    return {'cluster': (engine.fmt_bytes(disk.cluster_size)
                        if disk.cluster_size else '-'),
            'aio': disk.aio, 'cache': cache_text(disk), 'format': disk.fmt}


class Workload:
    """One kind of measurement. Subclasses set the class attributes."""

    name = None
    title = None
    unit = None
    higher_is_better = True
    # Extra per-sample figures to show as columns: [(key, header, kind)],
    # kind 'bytes', 'seconds' or 'number'.
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

    def result(self, bench, cases, error=None, seconds=None):
        rows = []
        for case in cases:
            row = {'variant': case.variant.key, 'label': case.variant.label,
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
                'engine': self.engine_text(bench),
                'setup': self.describe(bench), 'error': error,
                'seconds': seconds, 'extra_columns': list(self.extra_columns),
                'fact_columns': list(self.fact_columns), 'cases': rows}


class _FirstWrites(Workload):
    """Shared by the two qcow2 write workloads: a fresh disk per sample."""

    extra_columns = (('allocated', 'allocated', 'bytes'),
                     ('create_seconds', 'created in', 'seconds'))
    fact_columns = (('cluster', 'cluster'), ('aio', 'io'))

    def describe_disk(self, bench):
        cfg = bench.config
        return ('%s qcow2 overlays (the raw reference: a %s fallocated '
                'file) of a raw backing file holding %s of data; a fresh '
                'disk per repetition' % (
                    engine.fmt_bytes(cfg.write_disk),
                    engine.fmt_bytes(cfg.write_disk),
                    engine.fmt_bytes(cfg.write_base)))

    def setup(self, bench):
        bench.base(bench.config.write_base)

    def cases(self, bench):
        return [engine.Case(v, skip=bench.cannot_reserve(
            v, bench.config.write_disk)) for v in WRITE_VARIANTS]

    def measure(self, bench, case, rep):
        cfg = bench.config
        disk = vs.make_disk(case.variant, bench.workdir,
                            bench.base(cfg.write_base), cfg.write_disk)
        try:
            case.facts.update(disk_facts(disk))
            allocated = disk.allocated
            opts = tools.image_opts(disk.path, disk.fmt, disk.aio,
                                    disk.cache_size)
            value = self.write(bench, opts)
        finally:
            disk.remove()
        return engine.Sample(value, {'allocated': allocated,
                                     'create_seconds': disk.create_seconds})

    def write(self, bench, opts):
        raise NotImplementedError()


@register
class SequentialFirstWrites(_FirstWrites):
    name = 'seq-write'
    title = 'Sequential first writes, 64 KiB, queue depth 16'
    unit = 'MiB/s'

    def engine_text(self, bench):
        cfg = bench.config
        return ('qemu-img %s bench -w -s %d -d %d over the first %s, '
                'cache.direct=on (cache=none), io as libvirt is told; wall '
                'clock from start to exit (open and final flush included)'
                % (tools.version(), cfg.seq_block, cfg.depth,
                   engine.fmt_bytes(cfg.seq_bytes)))

    def describe(self, bench):
        return self.describe_disk(bench)

    def write(self, bench, opts):
        cfg = bench.config
        seconds = tools.bench(opts, count=cfg.seq_bytes // cfg.seq_block,
                              size=cfg.seq_block, depth=cfg.depth)
        return cfg.seq_bytes / units.Mi / seconds


@register
class NewClusterWrites(_FirstWrites):
    name = 'new-cluster-write'
    title = '4 KiB writes, each into a new cluster, queue depth 16'
    unit = 'IOPS'

    def step(self, bench):
        """Distance between writes: the largest cluster of any variant."""
        opts = CONF.prealloc_backend
        plugin = policy.cluster_size(opts.qcow2_cluster_size,
                                     bench.config.write_disk,
                                     opts.qcow2_extended_l2)
        return max(policy.MIN_CLUSTER, plugin)

    def count(self, bench):
        cfg = bench.config
        return min(cfg.new_cluster_writes, cfg.write_base // self.step(bench))

    def engine_text(self, bench):
        return ('qemu-img %s bench -w -s 4096 -S %d -d %d, %d writes, '
                'cache.direct=on (cache=none), io as libvirt is told; wall '
                'clock from start to exit (open and final flush included)'
                % (tools.version(), self.step(bench), bench.config.depth,
                   self.count(bench)))

    def describe(self, bench):
        return self.describe_disk(bench) + (
            '; every write lands in a cluster not written before, over '
            'backing data')

    def write(self, bench, opts):
        count = self.count(bench)
        seconds = tools.bench(opts, count=count, size=KiB4,
                              depth=bench.config.depth,
                              step=self.step(bench))
        return count / seconds


@register
class RandomReads(Workload):
    name = 'random-read'
    title = 'Random 4 KiB reads over a 1 TiB thin disk (L2 cache)'
    unit = 'reads/s'
    VARIANTS = (vs.RAW_SPARSE, vs.NOVA_NONE, vs.PLUGIN_NONE,
                vs.PLUGIN_METADATA)
    fact_columns = (('cluster', 'cluster'), ('cache', 'metadata cache'),
                    ('l2_coverage', 'L2 covers'))

    def __init__(self):
        self._disks = {}
        self._step = None

    def engine_text(self, bench):
        return ('qemu-io %s reading a script of %d reads at seeded random '
                '4 KiB-aligned offsets (a new seed per repetition, the same '
                'for every variant), one at a time, cache.direct=on; the '
                'time of a run that only opens the disk is subtracted'
                % (tools.version(tools.QEMU_IO), bench.config.random_reads))

    def describe(self, bench):
        return ('%s disks, thin (qcow2: overlays of a %s data backing file, '
                'nova default layout vs the plugin\'s cluster size and '
                '<metadata_cache>, given to QEMU as cache-size as libvirt '
                'does); first one 4 KiB write every %s so that every L2 '
                'table exists, as a guest filesystem touches its whole disk'
                % (engine.fmt_bytes(bench.config.random_disk),
                   engine.fmt_bytes(bench.config.small_base),
                   engine.fmt_bytes(self._step) if self._step else '?'))

    def cases(self, bench):
        cfg = bench.config
        base = bench.base(cfg.small_base)
        cases = []
        for variant in self.VARIANTS:
            case = engine.Case(variant, group=engine.fmt_bytes(
                cfg.random_disk))
            case.skip = bench.cannot_reserve(variant, cfg.random_disk)
            if case.skip is None:
                try:
                    disk = vs.make_disk(variant, bench.workdir, base,
                                        cfg.random_disk)
                except engine.CASE_ERRORS as exc:
                    case.error = str(exc)
                else:
                    self._disks[variant.key] = disk
                    case.facts.update(disk_facts(disk))
                    case.facts['l2_coverage'] = self._coverage(disk)
            cases.append(case)
        self._step = self._populate_step()
        for case in cases:
            disk = self._disks.get(case.variant.key)
            if disk is None or case.error:
                continue
            try:
                self._populate(bench, disk)
            except engine.CASE_ERRORS as exc:
                case.error = str(exc)
        return cases

    @staticmethod
    def _layout(disk):
        info = tools.info(disk.path)
        data = info.get('format-specific', {}).get('data', {})
        return info['virtual-size'], info['cluster-size'], bool(
            data.get('extended-l2', False))

    def _coverage(self, disk):
        """Virtual bytes the disk's L2 cache maps, as QEMU sizes it."""
        if disk.fmt != 'qcow2':
            return '-'
        size, cluster, extended = self._layout(disk)
        if disk.cache_size:
            # QEMU gives the refcount cache its minimum, the rest to L2.
            cache = disk.cache_size - (policy.MIN_REFCOUNT_CACHE_CLUSTERS *
                                       cluster)
        else:
            cache = policy.QEMU_DEFAULT_L2_CACHE
        covered = min(policy.l2_coverage(cluster, extended, cache), size)
        return '%s (%d%%)' % (engine.fmt_bytes(covered),
                              round(100 * covered / size))

    def _populate_step(self):
        """Virtual bytes one L2 table maps, smallest over the disks."""
        steps = []
        for disk in self._disks.values():
            if disk.fmt == 'qcow2':
                _size, cluster, extended = self._layout(disk)
                steps.append(cluster // policy.l2_entry_bytes(extended) *
                             cluster)
        return min(steps) if steps else units.Gi

    def _populate(self, bench, disk):
        size = bench.config.random_disk
        # Preparation, not measured: cache=unsafe.
        opts = tools.image_opts(disk.path, disk.fmt, 'threads',
                                disk.cache_size, direct=False, flush=False)
        tools.bench(opts, count=size // self._step, size=KiB4,
                    step=self._step)

    def measure(self, bench, case, rep):
        cfg = bench.config
        disk = self._disks[case.variant.key]
        rng = random.Random(rep + 1)
        blocks = cfg.random_disk // KiB4
        script = tools.io_script(
            (rng.randrange(blocks) * KiB4, KiB4)
            for _ in range(cfg.random_reads))
        opts = tools.image_opts(disk.path, disk.fmt, disk.aio,
                                disk.cache_size)
        return engine.Sample(cfg.random_reads / tools.qemu_io(opts, script))

    def teardown(self, bench):
        for disk in self._disks.values():
            disk.remove()
        self._disks.clear()


@register
class Creation(Workload):
    name = 'create'
    title = 'Creation time and physical size per mode'
    unit = 's'
    higher_is_better = False
    VARIANTS = (vs.RAW_REF, vs.NOVA_NONE, vs.NOVA_SPACE, vs.PLUGIN_NONE,
                vs.PLUGIN_METADATA, vs.PLUGIN_SPACE)
    extra_columns = (('allocated', 'physical size', 'bytes'),)
    fact_columns = (('cluster', 'cluster'),)

    def engine_text(self, bench):
        return ('wall clock of Image.cache() (the plugin\'s or nova\'s, the '
                'call nova-compute makes), base image already in the image '
                'cache; physical size = allocated blocks (st_blocks) after')

    def describe(self, bench):
        return ('qcow2 overlays of a %s data backing file, as the root disk '
                'of a flavor of that size; the raw reference is one '
                'fallocate(2) call'
                % engine.fmt_bytes(bench.config.small_base))

    def cases(self, bench):
        bench.base(bench.config.small_base)
        cases = []
        for size in bench.config.create_sizes:
            group = engine.fmt_bytes(size)
            for variant in self.VARIANTS:
                cases.append(engine.Case(
                    variant, group=group, params={'size': size},
                    skip=bench.cannot_reserve(variant, size)))
            cases.append(engine.Case(
                vs.PLUGIN_FULL, group=group, params={'size': size},
                skip=('not measured: full writes %s of zeros; its cost is '
                      'in the "created in" column of workload 1'
                      % engine.fmt_bytes(size))))
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
    VARIANTS = (vs.RAW_REF, vs.NOVA_NONE, vs.NOVA_SPACE, vs.PLUGIN_NONE,
                vs.PLUGIN_SPACE, vs.PLUGIN_FULL)
    BLOCK = 64 * units.Ki
    extra_columns = (('allocated', 'allocated before', 'bytes'),
                     ('extents_before', 'extents before', 'number'),
                     ('write_mib_s', 'write MiB/s', 'number'))

    def engine_text(self, bench):
        return ('qemu-io %s writing every 64 KiB block once in a seeded '
                'random order, one at a time, cache.direct=on; then '
                'filefrag (FIEMAP)' % tools.version(tools.QEMU_IO))

    def describe(self, bench):
        return ('%s raw disks (images_type=raw: a copy of a %s data base '
                'image, grown; plugin metadata does nothing to raw disks, '
                'so it is not shown) on %s' % (
                    engine.fmt_bytes(bench.config.extents_disk),
                    engine.fmt_bytes(bench.config.small_base),
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
            script = tools.io_script(((offset, self.BLOCK)
                                      for offset in order), op='write')
            seconds = tools.qemu_io(
                tools.image_opts(disk.path, 'raw', disk.aio), script)
            extents = tools.filefrag(disk.path)
        finally:
            disk.remove()
        return engine.Sample(extents, {
            'allocated': allocated, 'extents_before': before,
            'write_mib_s': cfg.extents_disk / units.Mi / seconds})
