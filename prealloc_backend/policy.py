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

"""Decisions, as pure functions: what to do for a disk.

Given the mode, the disk's format and size, the layout options and what the
filesystem supports, return a plan. Nothing here touches a disk, so every
decision is testable on its own; backend.py carries the plans out.
"""

import dataclasses

from oslo_log import log as logging
from oslo_utils import units

from prealloc_backend import exception
from prealloc_backend.modes import Mode

LOG = logging.getLogger(__name__)

# QEMU's default upper bound of a qcow2 L2 cache on Linux (QEMU >= 3.1,
# DEFAULT_L2_CACHE_MAX_SIZE); the cache is min(this, what covers the disk).
QEMU_DEFAULT_L2_CACHE = 32 * units.Mi
# QEMU keeps at least this many clusters of refcount cache (qcow2.c,
# MIN_REFCOUNT_CACHE_SIZE); cache-size must leave room for them.
MIN_REFCOUNT_CACHE_CLUSTERS = 4
MIN_CLUSTER = 64 * units.Ki
MAX_CLUSTER = 2 * units.Mi
# extended_l2 needs clusters of at least 16 KiB (32 subclusters of 512 B).
MIN_EXTENDED_L2_CLUSTER = 16 * units.Ki

CLUSTER_SIZES = {
    '64K': 64 * units.Ki,
    '128K': 128 * units.Ki,
    '256K': 256 * units.Ki,
    '512K': 512 * units.Ki,
    '1M': units.Mi,
    '2M': 2 * units.Mi,
}

# qemu-img's preallocation= for each mode.
QEMU_PREALLOCATION = {
    Mode.NONE: 'off',
    Mode.METADATA: 'metadata',
    Mode.SPACE: 'falloc',
    Mode.FULL: 'full',
}

RAW_NOTHING = 'none'
RAW_FALLOCATE = 'fallocate'
RAW_ZERO_FILL = 'zero-fill'


@dataclasses.dataclass(frozen=True)
class Qcow2Layout:
    """How a qcow2 overlay is created."""
    preallocation: str        # qemu-img preallocation=
    extended_l2: bool
    cluster_size: int
    warning: str | None = None  # why the plan is weaker than the mode asked


@dataclasses.dataclass(frozen=True)
class RawPlan:
    """What to do to a raw file's blocks."""
    action: str               # RAW_NOTHING, RAW_FALLOCATE or RAW_ZERO_FILL
    warning: str | None = None


def l2_entry_bytes(extended_l2):
    return 16 if extended_l2 else 8


def l2_coverage(cluster_size, extended_l2, cache_bytes=QEMU_DEFAULT_L2_CACHE):
    """Virtual bytes an L2 cache of ``cache_bytes`` maps."""
    return cache_bytes // l2_entry_bytes(extended_l2) * cluster_size


def cluster_size(setting, virtual_size, extended_l2):
    """Cluster size for an overlay of ``virtual_size`` bytes.

    ``auto``: the smallest of 64K..2M for which QEMU's default L2 cache
    covers the whole disk; the largest (2M) beyond. Otherwise the named size.
    """
    if setting != 'auto':
        try:
            return CLUSTER_SIZES[setting]
        except KeyError:
            raise exception.ConflictingOptions(
                reason='[prealloc_backend] qcow2_cluster_size=%r: allowed '
                       'values are auto, %s' % (setting,
                                                ', '.join(CLUSTER_SIZES)))
    size = MIN_CLUSTER
    while (size < MAX_CLUSTER and
           l2_coverage(size, extended_l2) < virtual_size):
        size *= 2
    return size


def l2_cache_bytes(virtual_size, cluster, extended_l2):
    """L2 cache that maps the whole disk: whole L2 tables (one cluster each).
    """
    entries = -(-virtual_size // cluster)
    table_bytes = entries * l2_entry_bytes(extended_l2)
    return -(-table_bytes // cluster) * cluster


def metadata_cache_bytes(policy, max_mb, virtual_size, cluster, extended_l2):
    """``<metadata_cache><max_size>`` for a qcow2 disk, or None for none.

    full-coverage: the L2 tables of the whole disk plus QEMU's minimum
    refcount cache, so that QEMU's split of cache-size gives the L2 cache
    full coverage; capped at ``max_mb`` MiB.
    """
    if policy != 'full-coverage' or not virtual_size or not cluster:
        return None
    wanted = (l2_cache_bytes(virtual_size, cluster, extended_l2) +
              MIN_REFCOUNT_CACHE_CLUSTERS * cluster)
    return min(wanted, max_mb * units.Mi)


def qcow2_overlay_layout(mode, virtual_size, extended_l2, cluster_setting,
                         fallocate_ok, fallocate_policy, path,
                         fstype='unknown'):
    """The layout of a new qcow2 overlay (one with a backing file)."""
    warning = None
    preallocation = QEMU_PREALLOCATION[mode]
    if mode is Mode.SPACE and not fallocate_ok:
        if fallocate_policy == 'fail':
            raise exception.FallocateUnsupported(path=path,
                                                 fstype=fstype)
        if fallocate_policy == 'zero-fill':
            preallocation = 'full'
        else:
            # QEMU would emulate falloc by writing zeros (slow); metadata
            # preallocation keeps most of the first-write speed for free.
            preallocation = 'metadata'
            warning = ('filesystem without fallocate(2): created with '
                       'preallocation=metadata instead of falloc '
                       '([prealloc_backend] fallocate_unsupported=warn)')
    if preallocation != 'off' and not extended_l2:
        warning = ('[prealloc_backend] qcow2_extended_l2 is off: QEMU cannot '
                   'preallocate an overlay with a backing file without it, '
                   'so the overlay is thin (mode %s not applied)' % mode.value)
        preallocation = 'off'
    cluster = cluster_size(cluster_setting, virtual_size, extended_l2)
    return Qcow2Layout(preallocation=preallocation, extended_l2=extended_l2,
                       cluster_size=cluster, warning=warning)


def qcow2_resize_preallocation(mode, fallocate_ok, fallocate_policy, path,
                               fstype='unknown'):
    """qemu-img resize --preallocation for growing a qcow2 disk."""
    if mode is Mode.SPACE and not fallocate_ok:
        if fallocate_policy == 'fail':
            raise exception.FallocateUnsupported(path=path,
                                                 fstype=fstype)
        return 'full' if fallocate_policy == 'zero-fill' else 'metadata'
    return QEMU_PREALLOCATION[mode]


def raw_plan(mode, fallocate_ok, fallocate_policy, path, fstype='unknown'):
    """What to do with the blocks of a raw disk for ``mode``."""
    if mode in (Mode.NONE, Mode.METADATA):
        # raw has no metadata: metadata mode has nothing to do.
        return RawPlan(RAW_NOTHING)
    if mode is Mode.FULL:
        return RawPlan(RAW_ZERO_FILL)
    if fallocate_ok:
        return RawPlan(RAW_FALLOCATE)
    if fallocate_policy == 'fail':
        raise exception.FallocateUnsupported(path=path,
                                             fstype=fstype)
    if fallocate_policy == 'zero-fill':
        return RawPlan(RAW_ZERO_FILL)
    return RawPlan(RAW_NOTHING,
                   warning='filesystem without fallocate(2): disk left thin '
                           '([prealloc_backend] fallocate_unsupported=warn)')
