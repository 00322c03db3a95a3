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

* ``plugin-<mode>``: prealloc_backend.backend.Backend(...).by_name(...)
  .cache(...), the very call nova-compute's libvirt driver makes, with
  ``[prealloc_backend] mode`` set to the mode;
* ``nova-<none|space>``: nova's in-tree nova.virt.libvirt.imagebackend
  .Backend with ``[DEFAULT] preallocate_images`` none or space;
* ``raw``: a raw file allocated with fallocate(2), the physical reference.

The configuration nova's and the plugin's code read is nova's CONF, set
with overrides for the time of a call and cleared after it.
"""

import contextlib
import dataclasses
import os
import shutil
import time

from nova import objects
from nova.virt.libvirt import imagebackend
from oslo_log import log as logging
from oslo_utils import uuidutils

from prealloc_backend import backend
from prealloc_backend.bench import tools
from prealloc_backend import conf as pb_conf
from prealloc_backend import fileops
from prealloc_backend import fsprobe
from prealloc_backend import modes
from prealloc_backend import policy
from prealloc_backend import qemu

LOG = logging.getLogger(__name__)
CONF = pb_conf.CONF

RAW = 'raw'
NOVA = 'nova'
PLUGIN = 'plugin'

# What libvirt's disk XML would name the disk; libvirt_info() needs it.
DISK_INFO_MAPPING = {'bus': 'virtio', 'dev': 'vda', 'type': 'disk'}
# Data of base images is written in blocks of this size.
BASE_BLOCK = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Variant:
    key: str                  # 'plugin-space'
    family: str               # RAW, NOVA or PLUGIN
    mode: str | None = None   # 'none', 'metadata', 'space', 'full'

    @property
    def label(self):
        if self.family == RAW:
            return 'raw %s' % (self.mode or 'fallocated')
        return '%s %s' % ('nova in-tree' if self.family == NOVA else
                          'plugin', self.mode)


RAW_REF = Variant('raw', RAW)
RAW_SPARSE = Variant('raw-sparse', RAW, 'sparse')
NOVA_NONE = Variant('nova-none', NOVA, 'none')
NOVA_SPACE = Variant('nova-space', NOVA, 'space')
PLUGIN_NONE = Variant('plugin-none', PLUGIN, 'none')
PLUGIN_METADATA = Variant('plugin-metadata', PLUGIN, 'metadata')
PLUGIN_SPACE = Variant('plugin-space', PLUGIN, 'space')
PLUGIN_FULL = Variant('plugin-full', PLUGIN, 'full')

ALL = (RAW_REF, RAW_SPARSE, NOVA_NONE, NOVA_SPACE, PLUGIN_NONE,
       PLUGIN_METADATA, PLUGIN_SPACE, PLUGIN_FULL)
BY_KEY = {v.key: v for v in ALL}


@dataclasses.dataclass
class Disk:
    """A disk made for one measurement."""
    variant: Variant
    path: str
    fmt: str
    create_seconds: float
    aio: str                     # what libvirt would be told: driver io=
    cache_size: int | None       # <metadata_cache><max_size>, if any
    cluster_size: int | None
    workdir: str                 # removed with the disk

    @property
    def allocated(self):
        return os.stat(self.path).st_blocks * 512

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

    NOTE: nova's Image._can_fallocate() stores its answer on the image
    class (``can_fallocate``), so whichever filesystem a process probed first
    decides for every later path. The benchmark may run after something else
    probed another filesystem: ask again.
    """
    for cls in (imagebackend.Flat, imagebackend.Qcow2):
        if 'can_fallocate' in vars(cls):
            delattr(cls, 'can_fallocate')


def make_base(path, size, seed=1):
    """A raw base image full of non-zero data, as Glance gives (nova keeps
    images raw in its cache by default: force_raw_images).
    """
    if os.path.exists(path) and os.path.getsize(path) == size:
        return path
    block = bytearray(os.urandom(8)) * (BASE_BLOCK // 8)
    tmp = path + '.part'
    with open(tmp, 'wb') as f:
        for index, offset in enumerate(range(0, size, BASE_BLOCK)):
            # Blocks differ, so nothing along the way may deduplicate them.
            block[:8] = (index + seed).to_bytes(8, 'little')
            f.write(block[:min(BASE_BLOCK, size - offset)])
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
        return [('prealloc_backend', 'mode', variant.mode)]
    return []


def needed_bytes(variant, size, images_type='qcow2'):
    """Bytes the filesystem must be able to reserve for this disk."""
    if variant.family == RAW:
        return 0 if variant.mode == 'sparse' else size
    if variant.family == NOVA:
        # 'fallocate -n -l <size>' on the disk file, whatever its format.
        return size if variant.mode == 'space' else 0
    if images_type == 'raw':
        return size if variant.mode in ('space', 'full') else 0
    opts = CONF.prealloc_backend
    cluster = policy.cluster_size(opts.qcow2_cluster_size, size,
                                  opts.qcow2_extended_l2)
    preallocation = policy.QEMU_PREALLOCATION[modes.Mode(variant.mode)]
    return qemu.measure(size, preallocation, cluster,
                        opts.qcow2_extended_l2)


def make_disk(variant, instances_path, base_path, size,
              images_type='qcow2'):
    """Make one disk of ``size`` bytes for ``variant``; return a Disk.

    qcow2 disks are overlays of ``base_path`` (which must lie in the
    image cache directory of ``instances_path``); raw disks start as a copy
    of it, as nova makes them. The raw reference ignores base and type.
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
        info = image.libvirt_info('none', {})
    cache_size = getattr(info, 'metadata_cache_max_size', None)
    cluster = None
    if image.driver_format == 'qcow2':
        cluster = tools.info(image.path).get('cluster-size')
    return Disk(variant=variant, path=image.path, fmt=image.driver_format,
                create_seconds=seconds, aio=info.driver_io or 'threads',
                cache_size=cache_size, cluster_size=cluster,
                workdir=workdir)


def _make_raw_file(variant, instances_path, size):
    """The raw reference: fallocated, or (raw-sparse) a bare truncate."""
    workdir = os.path.join(instances_path, 'raw-' + uuidutils.generate_uuid())
    os.makedirs(workdir)
    path = os.path.join(workdir, 'disk')
    started = time.monotonic()
    try:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
        try:
            if variant.mode == 'sparse':
                os.ftruncate(fd, size)
            else:
                fileops.fallocate(fd, 0, size, keep_size=False)
        finally:
            os.close(fd)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    seconds = time.monotonic() - started
    # As nova does for a preallocated disk: io='native' (cache=none).
    return Disk(variant=variant, path=path, fmt='raw', create_seconds=seconds,
                aio='threads' if variant.mode == 'sparse' else 'native',
                cache_size=None, cluster_size=None, workdir=workdir)


def free_bytes(directory):
    return fsprobe.free_bytes(directory)
