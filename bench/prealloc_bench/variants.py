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

"""The disks compared, each made the way its owner makes it.

* ``plugin-<mode>``: prealloc_backend.adapter.backend.Backend(...).by_name(...)
  .cache(...), the very call nova-compute's libvirt driver makes, with
  ``[prealloc_backend] mode`` set to the mode; ``plugin-<mode>@<size>`` the
  same with an opt-in cluster size asked for (``qcow2_cluster_size``). The
  layout and the bytes a disk needs come from diskplan.make_plan, as the
  backend's own do: nothing here computes them;
* ``nova-<none|space>``: nova's in-tree nova.virt.libvirt.imagebackend
  .Backend with ``[DEFAULT] preallocate_images`` none or space (stock nova
  34: a plain 64 KiB-cluster overlay, plus ``fallocate -n`` for space);
* ``raw-fallocated``: a raw file allocated with fallocate(2);
  ``raw-zero-written``: a raw file whose every block was written (zeros,
  write(2), fsync, then dropped from the page cache), the physical limit
  on this filesystem: no extent is left unwritten, no cached page to
  invalidate; ``raw-sparse``: a bare truncate.

Every variant is measured with the same QEMU settings (AIO, CACHE below);
the plugin's ``<metadata_cache>`` (cache-size) is part of its layout and is
given to QEMU as libvirt would.

The configuration nova's and the plugin's code read is nova's CONF, set
with overrides for the time of a call and cleared after it.

Everything here runs as the user the benchmark runs as, by path, in the
Bench's scratch directory: as root only where nobody else can change that
path (engine.Bench refuses any other directory).
"""

import contextlib
import dataclasses
import os
import shutil
import time

from nova import objects
from nova.virt.libvirt import imagebackend
from oslo_log import log as logging
from oslo_utils import units
from oslo_utils import uuidutils

from prealloc_backend.adapter import backend
from prealloc_backend import conf as pb_conf
from prealloc_backend.disk import fsprobe
from prealloc_backend.planner import diskplan
from prealloc_backend.planner import modes
from prealloc_backend.system import fileops
from prealloc_backend.system import stopping
from prealloc_bench import tools

LOG = logging.getLogger(__name__)
CONF = pb_conf.CONF

RAW = 'raw'
NOVA = 'nova'
PLUGIN = 'plugin'

# The one way every disk is opened for measurement: cache=none (O_DIRECT,
# flushes honoured) and Linux native AIO, what nova gives a preallocated
# disk. The same for every variant, so that no ratio mixes AIO modes.
AIO = 'native'
CACHE = 'none'

# What libvirt's disk XML would name the disk; libvirt_info() needs it.
DISK_INFO_MAPPING = {'bus': 'virtio', 'dev': 'vda', 'type': 'disk'}
# Data of base images is written in blocks of this size.
BASE_BLOCK = units.Mi


@dataclasses.dataclass(frozen=True)
class Variant:
    key: str                  # 'plugin-space', 'plugin-space@256K'
    family: str               # RAW, NOVA or PLUGIN
    mode: str                 # raw: fallocated/zero-written/sparse
    cluster: str | None = None  # plugin: an opt-in cluster size, or None

    @property
    def label(self):
        if self.family == RAW:
            return 'raw %s' % self.mode
        text = '%s %s' % (self.family, self.mode)
        if self.cluster:
            text += ' (%s asked)' % self.cluster
        return text

    def with_cluster(self, cluster):
        """This plugin variant with an opt-in cluster size asked for."""
        assert self.family == PLUGIN
        return Variant('%s@%s' % (self.key, cluster), self.family,
                       self.mode, cluster)


RAW_FALLOCATED = Variant('raw-fallocated', RAW, 'fallocated')
RAW_ZERO = Variant('raw-zero-written', RAW, 'zero-written')
RAW_SPARSE = Variant('raw-sparse', RAW, 'sparse')
NOVA_NONE = Variant('nova-none', NOVA, 'none')
NOVA_SPACE = Variant('nova-space', NOVA, 'space')
PLUGIN_NONE = Variant('plugin-none', PLUGIN, 'none')
PLUGIN_METADATA = Variant('plugin-metadata', PLUGIN, 'metadata')
PLUGIN_SPACE = Variant('plugin-space', PLUGIN, 'space')
PLUGIN_FULL = Variant('plugin-full', PLUGIN, 'full')

ALL = (RAW_FALLOCATED, RAW_ZERO, RAW_SPARSE, NOVA_NONE, NOVA_SPACE,
       PLUGIN_NONE, PLUGIN_METADATA, PLUGIN_SPACE, PLUGIN_FULL)
BY_KEY = {v.key: v for v in ALL}


def by_key(key):
    """The Variant of ``key``, opt-in cluster variants included."""
    name, _sep, cluster = key.partition('@')
    variant = BY_KEY[name]
    return variant.with_cluster(cluster) if cluster else variant


@dataclasses.dataclass
class Disk:
    """A disk made for one measurement."""
    variant: Variant
    path: str
    fmt: str
    create_seconds: float
    cache_size: int | None       # <metadata_cache><max_size>, if any
    cluster_size: int | None
    extended_l2: bool | None
    libvirt_io: str | None       # what nova would tell libvirt (io=)
    workdir: str                 # removed with the disk
    # (logical, physical) of the guest XML's <blockio>, or None (QEMU's).
    block_sizes: tuple | None = None

    @property
    def allocated(self):
        return os.stat(self.path).st_blocks * 512

    def opts(self, direct=True, flush=True):
        """``--image-opts`` of this disk, as every variant is measured."""
        return tools.image_opts(self.path, self.fmt, AIO, self.cache_size,
                                direct=direct, flush=flush)

    def remove(self):
        shutil.rmtree(self.workdir, ignore_errors=True)


@contextlib.contextmanager
def overrides(settings):
    """Override CONF options [(group or None, name, value)] for a while."""
    done = []
    try:
        for group, name, value in settings:
            CONF.set_override(name, value, group=group)
            done.append((group, name))
        yield
    finally:
        for group, name in reversed(done):
            CONF.clear_override(name, group=group)


def session_settings(instances_path):
    """Options every disk of a run is made with."""
    return [(None, 'instances_path', instances_path),
            (None, 'use_cow_images', True),
            (None, 'preallocate_images', 'none'),
            ('prealloc_backend', 'mode', None)]


def forget_nova_probe():
    """Drop stock nova's cached fallocate probe.

    NOTE(nova): nova's Image._can_fallocate() stores its answer on the image
    class (``can_fallocate``), so whichever filesystem a process probed first
    decides for every later path. The benchmark may run after something else
    probed another filesystem: ask again.
    """
    for cls in (imagebackend.Flat, imagebackend.Qcow2):
        if 'can_fallocate' in vars(cls):
            delattr(cls, 'can_fallocate')


def make_base(path, size):
    """A raw base image of random data, as Glance gives (nova keeps images
    raw in its cache by default: force_raw_images). Every MiB is fresh
    os.urandom() output, so nothing on the way can compress or deduplicate
    it and no read of it can be answered from a zero page.
    """
    if os.path.exists(path) and os.path.getsize(path) == size:
        return path
    tmp = path + '.part'
    with open(tmp, 'wb') as f:
        for offset in range(0, size, BASE_BLOCK):
            stopping.check()
            f.write(os.urandom(min(BASE_BLOCK, size - offset)))
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    return path


def _instance():
    flavor = objects.Flavor(extra_specs={})
    return objects.Instance(uuid=uuidutils.generate_uuid(), flavor=flavor)


def _settings(variant):
    if variant.family == NOVA:
        return [(None, 'preallocate_images', variant.mode)]
    if variant.family == PLUGIN:
        settings = [('prealloc_backend', 'mode', variant.mode)]
        if variant.cluster:
            settings.append(('prealloc_backend', 'qcow2_cluster_size',
                             variant.cluster))
        return settings
    return []


def fs_facts(directory):
    """diskplan.FsFacts of the filesystem holding ``directory``."""
    return diskplan.FsFacts(
        fallocate_ok=fsprobe.supports_fallocate(directory),
        fstype=fsprobe.fs_type(directory),
        free_bytes=fsprobe.free_bytes(directory))


def plan(variant, size, fs, images_type='qcow2'):
    """diskplan.make_plan's DiskPlan for a plugin variant, made with the
    options the variant's disk is made with. None for nova and raw.
    """
    if variant.family != PLUGIN:
        return None
    with overrides(_settings(variant)):
        return diskplan.make_plan(
            CONF.prealloc_backend, {}, modes.Mode(variant.mode),
            diskplan.DiskFormat(images_type), size, fs)


def reference_bytes(variant, size):
    """Bytes a reference disk (nova's or raw) takes once made: what its
    one call (fallocate(2), nova's ``fallocate -n``, the zero writes)
    reserves. The plugin's disks take theirs from plan().
    """
    assert variant.family != PLUGIN
    if variant.family == NOVA:
        return size if variant.mode == 'space' else 0
    return 0 if variant.mode == 'sparse' else size


def make_disk(variant, instances_path, base_path, size,
              images_type='qcow2'):
    """Make one disk of ``size`` bytes for ``variant``; return a Disk.

    qcow2 disks are overlays of ``base_path`` (which must lie in the
    image cache directory of ``instances_path``); raw disks start as a copy
    of it, as nova makes them. The raw references ignore base and type.
    """
    if variant.family == RAW:
        return _make_raw_file(variant, instances_path, size)
    instance = _instance()
    workdir = os.path.join(instances_path, instance.uuid)
    # As the libvirt driver does before it asks for the disks.
    os.makedirs(workdir)
    filename = os.path.basename(base_path)

    def fetch(target, *args, **kwargs):
        # The base is made beforehand: like nova's image cache, it is
        # shared by every disk and never part of a creation time.
        if target != base_path:
            shutil.copyfile(base_path, target)

    if variant.family == NOVA:
        image_backend = imagebackend.Backend(use_cow=True)
    else:
        image_backend = backend.Backend(use_cow=True)
    with overrides(_settings(variant)):
        image = image_backend.by_name(instance, 'disk', images_type,
                                      disk_info_mapping=DISK_INFO_MAPPING)
        started = time.monotonic()
        try:
            image.cache(fetch, filename, size=size, image_id='bench')
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        seconds = time.monotonic() - started
        _settle(image.path)
        info = image.libvirt_info(CACHE, {})
    cache_size = getattr(info, 'metadata_cache_max_size', None)
    cluster = extended = None
    if image.driver_format == 'qcow2':
        qinfo = tools.info(image.path, 'qcow2')
        cluster = qinfo.get('cluster-size')
        extended = bool(qinfo.get('format-specific', {}).get(
            'data', {}).get('extended-l2', False))
    block_sizes = None
    if getattr(info, 'physical_block_size', None):
        block_sizes = (int(getattr(info, 'logical_block_size', None) or 512),
                       int(info.physical_block_size))
    return Disk(variant=variant, path=image.path, fmt=image.driver_format,
                create_seconds=seconds, cache_size=cache_size,
                cluster_size=cluster, extended_l2=extended,
                libvirt_io=info.driver_io, workdir=workdir,
                block_sizes=block_sizes)


def _settle(path):
    """Write back what making a disk left dirty before any timed run.

    A disk's creation can leave dirty pages (the base copied for a
    raw disk, qcow2 metadata) whose writeback would otherwise run during a
    later timed run, of whichever variant it times. Every disk is settled
    the same way, after its creation time was taken (nova does not wait
    for it). Clean pages stay where the disk's maker left them: cached
    pages make every first O_DIRECT write over them slower (the kernel
    invalidates them first), which is what the plugin's mode full avoids
    by dropping its zeros (fileops.drop_page_cache) and what the rows
    measure as made.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.sync()


def _write_zeros(fd, size):
    """Zeros over the whole file, on disk and out of the page cache: the
    physical limit is a file a first O_DIRECT write finds written and
    uncached (cached pages cost each such write an invalidation).
    """
    zeros = bytes(BASE_BLOCK)
    for offset in range(0, size, BASE_BLOCK):
        stopping.check()
        os.write(fd, zeros[:min(BASE_BLOCK, size - offset)])
    fileops.drop_page_cache(fd)


def _make_raw_file(variant, instances_path, size):
    """A raw reference: fallocated, zero-written, or a bare truncate."""
    workdir = os.path.join(instances_path, 'raw-' + uuidutils.generate_uuid())
    os.makedirs(workdir)
    path = os.path.join(workdir, 'disk')
    started = time.monotonic()
    try:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
        try:
            if variant.mode == 'sparse':
                os.ftruncate(fd, size)
            elif variant.mode == 'zero-written':
                _write_zeros(fd, size)
            else:
                fileops.fallocate(fd, 0, size, keep_size=False)
        finally:
            os.close(fd)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    seconds = time.monotonic() - started
    _settle(path)
    return Disk(variant=variant, path=path, fmt='raw', create_seconds=seconds,
                cache_size=None, cluster_size=None, extended_l2=None,
                libvirt_io=None, workdir=workdir)
