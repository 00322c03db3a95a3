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

"""The benchmark session: where disks go, and how workloads are repeated.

A Bench owns a scratch directory (it plays nova's instances_path, with the
image cache in ``_base``) and nova's CONF overrides for the run. With
``privsep_in_process=True`` (what ``prealloc-bench`` asks for) it
also switches the plugin's and nova's privsep contexts to in-process for
the time of the run, and switches them back after; without it, it leaves
them as the caller has them. Nothing here changes them at import.
Every workload's cases are measured round-robin: repetition 1 of every
variant, then repetition 2 (starting one variant later), and so on, so
that a slow minute of the host spreads over all variants instead of
falling on one. Each case keeps its samples by repetition, so that the
report divides a variant's figure by its reference's of the same
repetition (paired ratios) before taking the median and [min-max] of those
ratios: a ratio of medians would compare figures taken minutes apart.

Who does what: everything runs as the user ``prealloc-bench`` runs
as, and works by path (nova's image backend and the plugin's take paths).
As root, a Bench therefore starts only in a directory nobody else can
change: the directory, every directory above it and every symlink on the
way root's, none writable by another user unless sticky
(checks/owner.refusal_as_root). Any other directory is refused with
UnsafeDirectory, naming who controls it: in nova's instances_path, run the
benchmark as the nova user.
"""

import dataclasses
import datetime
import importlib.metadata
import os
import platform
import shutil
import socket
import statistics
import sys
import tempfile
import time

from nova import exception as nova_exception
from nova import objects
import nova.privsep
from oslo_log import log as logging
from oslo_utils import units

from prealloc_backend.checks import owner
from prealloc_backend.disk import fsprobe
from prealloc_backend import exception
import prealloc_backend.privsep
from prealloc_backend import sizes
from prealloc_backend.system import stopping
from prealloc_bench import tools
from prealloc_bench import variants

LOG = logging.getLogger(__name__)
CONF = variants.CONF

SCHEMA_VERSION = 3
COMMAND = 'prealloc-bench'
# The group of a workload's rows at the plugin's default layout.
DEFAULT_GROUP = 'default layout'
# The same rows, writing beyond the end of the disk's backing file.
BEYOND_GROUP = 'default layout, beyond the backing file'


@dataclasses.dataclass(frozen=True)
class Config:
    """Sizes and counts of one kind of run."""
    name: str
    reps: int
    write_disk: int           # virtual size of the disks written first
    write_base: int           # random data in their backing file
    seq_bytes: int            # 64 KiB sequential first writes
    new_cluster_writes: int   # 4 KiB writes, each in a new cluster (most)
    dense_writes: int         # dense 4 KiB writes, QD1 and QD16
    small_writes: int         # dense 512-byte writes
    # Virtual size (and backing data) of the disks of the dense, 512-byte
    # and flushed writes, which touch only their start.
    dense_disk: int
    flush_writes: int         # 4 KiB writes with a flush every ...
    flush_interval: int       # ... this many writes
    read_disk: int            # virtual size of the disks read
    read_points: int          # 4 KiB points written, then read, per rep
    create_sizes: tuple       # virtual sizes created
    extents_disk: int         # raw disk written then counted
    # Workloads that also measure every opt-in cluster size.
    cluster_sweep: tuple = ('new-cluster-write', 'seq-write', 'create',
                            'random-read')
    # First-write workloads also measured beyond the end of the backing
    # file (a disk larger than its image: most of a real disk): every one
    # that writes over backing data.
    beyond_eof: tuple = ('seq-write', 'new-cluster-write', 'dense-4k-qd1',
                         'dense-4k-qd16', 'write-512', 'flush-4k')
    small_base: int = 16 * units.Mi  # backing data of reads and creation
    depth: int = 16
    seq_block: int = 64 * units.Ki
    # Shortest timed run reported (tools.TooShort below it).
    min_seconds: float = tools.MIN_SECONDS
    # Virtual size (and backing data) of the default layout's disks of the
    # 4 KiB new-cluster writes (the report's summary); None: write_disk
    # and write_base.
    new_cluster_disk: int | None = None


DEFAULT = Config(
    name='default', reps=3,
    write_disk=2 * units.Gi, write_base=2 * units.Gi,
    seq_bytes=2 * units.Gi, new_cluster_writes=16384,
    dense_writes=16384, small_writes=32768, dense_disk=256 * units.Mi,
    flush_writes=8192, flush_interval=16,
    read_disk=units.Ti, read_points=16384,
    create_sizes=(10 * units.Gi, 100 * units.Gi, units.Ti),
    extents_disk=128 * units.Mi)

QUICK = Config(
    name='quick', reps=1,
    write_disk=256 * units.Mi, write_base=256 * units.Mi,
    seq_bytes=256 * units.Mi, new_cluster_writes=8192,
    dense_writes=2048, small_writes=8192, dense_disk=64 * units.Mi,
    flush_writes=1024, flush_interval=16,
    read_disk=units.Ti, read_points=2048,
    create_sizes=(10 * units.Gi, units.Ti),
    extents_disk=32 * units.Mi, small_base=4 * units.Mi,
    cluster_sweep=('new-cluster-write',),
    # The summary's rows: 2048 writes 128 KiB apart (all 256 MiB holds)
    # took 0.02-0.04 s on the fast rows, under min_seconds, so a quick
    # run's summary lost them; 8192 over 1 GiB take four times that. Only
    # the default layout's: every 1 GiB disk preallocated (and discarded
    # when removed) costs time (all groups at 1 GiB: 487 s, not 38 s).
    new_cluster_disk=units.Gi)


@dataclasses.dataclass
class Sample:
    value: float
    extra: dict = dataclasses.field(default_factory=dict)
    # Samples the same measurement gives the case's followers:
    # [(Case, Sample)] (the cold pass of a warm read, say).
    followers: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Case:
    """One row of a workload's table: a variant, maybe at some size.

    ``samples[r]`` is repetition r's figure (None where it has none), so
    that rows are paired repetition by repetition. A case with a ``leader``
    is not measured on its own: its samples come with its leader's (one
    run giving two figures), and a leader's skip or error is its too.
    """
    variant: variants.Variant
    group: str = ''
    params: dict = dataclasses.field(default_factory=dict)
    skip: str | None = None
    error: str | None = None
    samples: list = dataclasses.field(default_factory=list)
    extra: dict = dataclasses.field(default_factory=dict)
    facts: dict = dataclasses.field(default_factory=dict)
    leader: 'Case | None' = dataclasses.field(default=None, repr=False)
    followers: list = dataclasses.field(default_factory=list, repr=False)

    def follow(self, leader):
        """Take this case's samples from ``leader``'s measurements."""
        self.leader = leader
        leader.followers.append(self)
        return self

    def add(self, rep, sample):
        self._pad(rep)
        self.samples[rep] = sample.value
        for name, value in sample.extra.items():
            values = self.extra.setdefault(name, [])
            values.extend([None] * (rep + 1 - len(values)))
            values[rep] = value

    def _pad(self, rep):
        self.samples.extend([None] * (rep + 1 - len(self.samples)))


def summary(samples):
    """median, min and max of samples, Nones left out (all None when
    there is no sample).
    """
    values = [s for s in samples if s is not None]
    if not values:
        return {'median': None, 'min': None, 'max': None, 'n': 0}
    return {'median': statistics.median(values), 'min': min(values),
            'max': max(values), 'n': len(values)}


def paired_ratios(samples, reference):
    """[samples[r] / reference[r]] over the repetitions where both were
    measured (and the reference is not zero): a ratio never mixes two
    repetitions.
    """
    return [value / ref for value, ref in zip(samples, reference)
            if value is not None and ref]


def rotated(items, rep):
    """items, starting ``rep`` places later (round-robin start)."""
    if not items:
        return []
    shift = rep % len(items)
    return list(items[shift:]) + list(items[:shift])


def _version(distribution):
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return 'unknown'


# Failures a case can meet without the run being wrong: reported in the
# case's line, never as a traceback. (NovaException covers the plugin's
# errors: prealloc_backend.system.process's ProcessFailed and
# ProcessTimeout, the qemu-img and allocation errors.)
CASE_ERRORS = (tools.ToolError, nova_exception.NovaException, OSError,
               RuntimeError)


def privsep_contexts():
    """The privsep contexts whose entrypoints the disks' code calls."""
    return (prealloc_backend.privsep.ctx, nova.privsep.sys_admin_pctxt)


def privsep_text():
    """How the privsep entrypoints run now, for the report."""
    if all(not ctx.client_mode for ctx in privsep_contexts()):
        return ('in-process: the plugin\'s and nova\'s privsep entrypoints '
                'ran in this process (client mode off), no daemon')
    return ('as configured: the plugin\'s and nova\'s privsep entrypoints '
            'went through their privsep daemons (client mode on)')


class UnsafeDirectory(owner.UnsafeDirectory):
    """Root asked to run the benchmark where another user could redirect
    its writes.
    """


class Bench:
    """A benchmark run in ``directory`` (a scratch directory is made and
    removed inside it). As root, ``directory`` must pass
    owner.refusal_as_root (UnsafeDirectory otherwise).
    """

    def __init__(self, directory, config, progress=None,
                 privsep_in_process=False):
        self.directory = os.path.abspath(directory)
        self.config = config
        self.progress = progress or (lambda message: None)
        self.privsep_in_process = privsep_in_process
        self.workdir = None
        self.skipped = []
        self._bases = {}
        self._default_clusters = {}
        self._cleanups = []

    # -- session ---------------------------------------------------------

    def __enter__(self):
        # By its real path: a symlink on the way, even root's, is looked up
        # once, here.
        self.directory = os.path.realpath(self.directory)
        reason = owner.refusal_as_root(self.directory, COMMAND)
        if reason:
            raise UnsafeDirectory(reason)
        os.makedirs(self.directory, exist_ok=True)
        self.workdir = tempfile.mkdtemp(prefix='prealloc-bench-',
                                        dir=self.directory)
        self._cleanups.append(lambda: shutil.rmtree(self.workdir,
                                                    ignore_errors=True))
        objects.register_all()
        settings = variants.overrides(
            variants.session_settings(self.workdir))
        settings.__enter__()
        self._cleanups.append(lambda: settings.__exit__(None, None, None))
        if self.privsep_in_process:
            # The entrypoints run in this process (as the unit tests
            # run them): they keep their own argument checks, only the
            # daemon and its socket are left out. The disks are ours, so
            # no privilege is needed; the report says so.
            for ctx in privsep_contexts():
                previous = ctx.client_mode
                ctx.set_client_mode(False)
                self._cleanups.append(
                    lambda ctx=ctx, previous=previous:
                    ctx.set_client_mode(previous))
        fsprobe.forget()
        variants.forget_nova_probe()
        self._cleanups.append(fsprobe.forget)
        self._cleanups.append(variants.forget_nova_probe)
        return self

    def __exit__(self, *exc_info):
        while self._cleanups:
            self._cleanups.pop()()

    @property
    def base_dir(self):
        return os.path.join(self.workdir, CONF.image_cache.subdirectory_name)

    def base(self, size):
        """Path of a raw base image holding ``size`` bytes of data."""
        if size not in self._bases:
            os.makedirs(self.base_dir, exist_ok=True)
            path = os.path.join(self.base_dir, 'bench-data-%d' % size)
            self._bases[size] = variants.make_base(path, size)
        return self._bases[size]

    @property
    def fs_type(self):
        return fsprobe.fs_type(self.directory)

    def free(self):
        return fsprobe.free_bytes(self.workdir)

    def reserve_margin(self):
        """Space left free whatever a workload wants: others use this
        filesystem too. 5% of what is free now, at least 64 MiB.
        """
        return max(64 * units.Mi, self.free() // 20)

    def needed_bytes(self, variant, size, images_type='qcow2'):
        """Bytes the disk takes once made: diskplan.make_plan's answer for
        the plugin's disks (the very plan the backend carries out), the
        reference's own call for the others.
        """
        if variant.family == variants.PLUGIN:
            return variants.plan(variant, size, self.fs_facts(),
                                 images_type).needed_bytes
        return variants.reference_bytes(variant, size)

    def fs_facts(self):
        return variants.fs_facts(self.workdir)

    def default_cluster(self, size):
        """Cluster size diskplan.make_plan gives a plugin overlay of ``size``
        bytes with the default options (None: nova's own choice); asked
        once per size and run.
        """
        if size not in self._default_clusters:
            self._default_clusters[size] = variants.plan(
                variants.PLUGIN_METADATA, size, self.fs_facts()).cluster_size
        return self._default_clusters[size]

    def cannot_reserve(self, variant, size, images_type='qcow2',
                       written=0):
        """None when the disk (and ``written`` bytes written into it)
        fits, else a sentence saying why not.
        """
        try:
            needed = max(self.needed_bytes(variant, size, images_type),
                         written)
        except exception.PreallocError as exc:
            return 'cannot size it: %s' % exc
        free = self.free()
        if needed + self.reserve_margin() > free:
            return ('cannot be reserved here: needs %s, %s free on %s '
                    '(keeping %s spare)' % (
                        sizes.human(needed), sizes.human(free), self.directory,
                        sizes.human(self.reserve_margin())))
        return None

    def host(self, versions=True):
        """The machine, for the report; ``versions=False``: without the
        qemu-img and qemu-io versions (they are asked to the tools).
        """
        uname = platform.uname()
        return {
            'hostname': socket.gethostname(),
            'kernel': uname.release,
            'machine': uname.machine,
            'cpus': os.cpu_count(),
            'python': platform.python_version(),
            'qemu_img': (tools.version(tools.QEMU_IMG) if versions
                         else 'unknown'),
            'qemu_io': (tools.version(tools.QEMU_IO) if versions
                        else 'unknown'),
            'aio': variants.AIO,
            'cache': variants.CACHE,
            'directory': self.directory,
            'filesystem': self.fs_type,
            'nova': _version('nova'),
            'prealloc_backend': _version('prealloc-backend'),
            'free_bytes': self.free(),
        }

    # -- workloads -------------------------------------------------------

    def run_workload(self, workload, index=0, total=1):
        """Measure every case of ``workload``; return its result dict."""
        label = '[%d/%d] %s' % (index + 1, total, workload.title)
        self.progress('%s: setting up' % label)
        LOG.info('%(label)s: setting up', {'label': label})
        started = time.monotonic()
        cases = []
        try:
            workload.setup(self)
            cases = workload.cases(self)
            # Followers are measured with their leader.
            active = [case for case in cases
                      if case.skip is None and case.leader is None]
            for rep in range(self.config.reps):
                stopping.check()
                self.progress('%s: repetition %d/%d (%.0f s)' % (
                    label, rep + 1, self.config.reps,
                    time.monotonic() - started))
                stopping.pause_point('repetition')
                for case in rotated(active, rep):
                    # Between two cases: the stop is taken here, from the
                    # loop (stopping.on_signals in the command).
                    stopping.check()
                    if case.error or case.skip:
                        continue
                    try:
                        sample = workload.measure(self, case, rep)
                        case.add(rep, sample)
                        for follower, other in sample.followers:
                            follower.add(rep, other)
                    except tools.TooShort as exc:
                        # Not a failure of the code measured: a figure
                        # this run cannot time. Not shown, with the reason.
                        for row in [case] + case.followers:
                            row.skip = 'not shown: %s' % exc.reason
                            row.samples = []
                            row.extra = {}
                    except CASE_ERRORS as exc:
                        LOG.debug('%(case)s failed', {'case': case},
                                  exc_info=True)
                        for row in [case] + case.followers:
                            row.error = str(exc)
        except CASE_ERRORS as exc:
            LOG.debug('workload %(name)s failed', {'name': workload.name},
                      exc_info=True)
            return workload.result(self, cases,
                                   error='%s' % exc,
                                   seconds=time.monotonic() - started)
        finally:
            stopping.pause_point('teardown')
            workload.teardown(self)
        for case in cases:
            # Every row as long as the run: repetition r is samples[r].
            case._pad(self.config.reps - 1)
        seconds = time.monotonic() - started
        self.progress('%s: done in %.0f s' % (label, seconds))
        return workload.result(self, cases, seconds=seconds)

    def run(self, workloads):
        """Run ``workloads`` (instances) in order; return the result."""
        started = time.monotonic()
        now = datetime.datetime.now(datetime.timezone.utc)
        result = {
            'schema': SCHEMA_VERSION,
            'command': COMMAND,
            'argv': sys.argv[1:],
            'run': self.config.name,
            'config': dataclasses.asdict(self.config),
            'date': now.isoformat(timespec='seconds'),
            'privsep': privsep_text(),
            'workloads': [],
        }
        try:
            result['host'] = self.host()
        except (stopping.Stopped, KeyboardInterrupt):
            result['host'] = self.host(versions=False)
            result['interrupted'] = ('stopped before the first workload: '
                                     'no workload is in this report')
            self.progress(result['interrupted'])
            workloads = []
        for index, workload in enumerate(workloads):
            try:
                if index:
                    stopping.pause_point('between-workloads')
                stopping.check()
                result['workloads'].append(
                    self.run_workload(workload, index, len(workloads)))
            except (stopping.Stopped, KeyboardInterrupt):
                # Ctrl-C or SIGTERM (stopping.Stopped in the command, a
                # KeyboardInterrupt where the caller left SIGINT as it is):
                # the workloads done so far are reported, nothing else.
                result['interrupted'] = (
                    'stopped during workload %s (%d of %d): it and the '
                    'workloads after it are not in this report'
                    % (workload.name, index + 1, len(workloads)))
                self.progress(result['interrupted'])
                break
        result['seconds'] = time.monotonic() - started
        return result
