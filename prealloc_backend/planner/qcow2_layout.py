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

"""The layout of a qcow2 disk and what it costs: pure formulas.

The cluster size of a new overlay, the bytes a qcow2 image of a given
size and preallocation occupies, the ``<metadata_cache>`` that covers a
disk, the ``<blockio>`` of its guest XML. planner/diskplan.py decides with
them; the benchmark and ``prealloc-backend check`` size disks with them.
Nothing here touches a disk or runs a process.

Layout rules (measured with the benchmark; the figures are in
doc/source/admin/modes.rst):

* 128K clusters (4K subclusters with extended_l2) at every disk size. From
  256K up, every 4 KiB guest write into a new subcluster also copies the
  rest of its subcluster from the backing file (0.36x a raw file at 256K,
  0.12x at 2M), so larger clusters are used only when the operator asks
  (``[prealloc_backend] qcow2_cluster_size`` or the flavor's
  ``prealloc:cluster_size``).
* ``<metadata_cache>`` covers the whole disk or is not set: a partial cover
  measured slower than QEMU's own default, and where the default (32 MiB of
  L2 tables) already covers the disk the element adds nothing.

Sizes of qcow2 metadata follow QEMU's own formula
(``qcow2_calc_prealloc_size`` and ``qcow2_refcount_metadata_size`` in
block/qcow2.c, QEMU 7.2); tests compare them with ``qemu-img measure``.
"""

import enum
import threading

from oslo_log import log as logging
from oslo_utils import units

from prealloc_backend import exception
from prealloc_backend.planner.modes import Mode

LOG = logging.getLogger(__name__)


# Flavor extra spec choosing the cluster size of a flavor's qcow2 overlays.
FLAVOR_CLUSTER_KEY = 'prealloc:cluster_size'


# QEMU's default upper bound of a qcow2 L2 cache on Linux (QEMU >= 3.1,
# DEFAULT_L2_CACHE_MAX_SIZE); the cache is min(this, what covers the disk).
QEMU_DEFAULT_L2_CACHE = 32 * units.Mi


# QEMU keeps at least this many clusters of refcount cache (qcow2.c,
# MIN_REFCOUNT_CACHE_SIZE); cache-size must leave room for them.
MIN_REFCOUNT_CACHE_CLUSTERS = 4


MIN_CLUSTER = 64 * units.Ki


# Default cluster: 4 KiB subclusters with extended_l2 (32 per cluster).
DEFAULT_CLUSTER = 128 * units.Ki


# QEMU's default, which nova's own overlays get from a raw base.
QEMU_DEFAULT_CLUSTER = 64 * units.Ki


# qcow2 defaults the plugin never changes: 16-bit refcounts, 8-byte L1 and
# refcount table entries.
REFCOUNT_BITS = 16


L1_ENTRY_BYTES = 8


REFTABLE_ENTRY_BYTES = 8


CLUSTER_SIZES = {
    '64K': 64 * units.Ki,
    '128K': 128 * units.Ki,
    '256K': 256 * units.Ki,
    '512K': 512 * units.Ki,
    '1M': units.Mi,
    '2M': 2 * units.Mi,
}


class Qcow2Preallocation(enum.Enum):
    """qemu-img's ``preallocation=`` values."""
    OFF = 'off'
    METADATA = 'metadata'
    FALLOC = 'falloc'
    FULL = 'full'

    @property
    def heavy(self):
        """qemu-img reserves or writes the whole data area itself."""
        return self in (Qcow2Preallocation.FALLOC, Qcow2Preallocation.FULL)


def l2_entry_bytes(extended_l2):
    return 16 if extended_l2 else 8


def l2_coverage(cluster_size, extended_l2, cache_bytes=QEMU_DEFAULT_L2_CACHE):
    """Virtual bytes an L2 cache of ``cache_bytes`` maps."""
    return cache_bytes // l2_entry_bytes(extended_l2) * cluster_size


def _round_up(value, step):
    return -(-value // step) * step


def l2_cache_bytes(virtual_size, cluster, extended_l2):
    """L2 cache that maps the whole disk: whole L2 tables (one cluster
    each), as QEMU computes its ``max_l2_cache``.
    """
    entries = -(-virtual_size // cluster)
    return _round_up(entries * l2_entry_bytes(extended_l2), cluster)


def refcount_metadata_bytes(clusters, cluster):
    """Refcount table and blocks for ``clusters`` host clusters, counting
    themselves (QEMU's fixed point, without its generous increase).
    """
    per_block = cluster * 8 // REFCOUNT_BITS
    per_table_cluster = cluster // REFTABLE_ENTRY_BYTES
    table = blocks = 0
    total = -1
    while True:
        blocks = -(-(clusters + table + blocks) // per_block)
        table = -(-blocks // per_table_cluster)
        if clusters + blocks + table == total:
            return (blocks + table) * cluster
        total = clusters + blocks + table


def qcow2_metadata_bytes(virtual_size, cluster, extended_l2):
    """Metadata of a fully mapped qcow2 image: header, L1 and L2 tables,
    refcounts (``qemu-img measure``'s ``required`` for an empty image).
    """
    data = _round_up(virtual_size, cluster)
    entry = l2_entry_bytes(extended_l2)
    l2_entries = _round_up(data // cluster, cluster // entry)
    meta = cluster + l2_entries * entry
    l1_entries = _round_up(l2_entries * entry // cluster,
                           cluster // L1_ENTRY_BYTES)
    meta += l1_entries * L1_ENTRY_BYTES
    meta += refcount_metadata_bytes((meta + data) // cluster, cluster)
    return meta


def qcow2_thin_bytes(virtual_size, cluster, extended_l2):
    """What ``qemu-img create`` writes for a thin qcow2 image: header,
    refcount table, one refcount block and the L1 table.
    """
    l2_span = cluster // l2_entry_bytes(extended_l2) * cluster
    l1_bytes = -(-virtual_size // l2_span) * L1_ENTRY_BYTES
    return 3 * cluster + _round_up(l1_bytes, cluster)


def qcow2_needed_bytes(virtual_size, preallocation, cluster, extended_l2):
    """Bytes a qcow2 image of ``virtual_size`` occupies once created."""
    if preallocation is Qcow2Preallocation.OFF:
        return qcow2_thin_bytes(virtual_size, cluster, extended_l2)
    meta = qcow2_metadata_bytes(virtual_size, cluster, extended_l2)
    if preallocation is Qcow2Preallocation.METADATA:
        return meta
    return meta + _round_up(virtual_size, cluster)


_partial_cache_lock = threading.Lock()


_partial_cache_logged = set()


def metadata_cache_for(opts, virtual_size, cluster, extended_l2):
    """``<metadata_cache><max_size>`` for a qcow2 disk, or None.

    The L2 tables of the whole disk plus QEMU's minimum refcount cache (so
    that QEMU's split of cache-size gives the L2 cache all of the disk),
    when that is within ``qcow2_metadata_cache_max_mb``. None where QEMU's
    default L2 cache already covers the disk, and None (logged once per
    cap and size) where the cover would exceed the cap: a partial cover is
    slower than QEMU's default.
    """
    if (opts.qcow2_l2_cache != 'full-coverage' or not virtual_size or
            not cluster):
        return None
    l2 = l2_cache_bytes(virtual_size, cluster, extended_l2)
    if l2 <= QEMU_DEFAULT_L2_CACHE:
        return None
    wanted = l2 + MIN_REFCOUNT_CACHE_CLUSTERS * cluster
    cap = opts.qcow2_metadata_cache_max_mb * units.Mi
    if wanted <= cap:
        return wanted
    key = (cap, virtual_size, cluster, extended_l2)
    with _partial_cache_lock:
        first = key not in _partial_cache_logged
        _partial_cache_logged.add(key)
    if first:
        LOG.info('No <metadata_cache> for qcow2 disks of %(size)d bytes '
                 '(cluster %(cluster)d): covering them needs %(wanted)d MiB, '
                 'above [prealloc_backend] qcow2_metadata_cache_max_mb = '
                 '%(cap)d; partial cover is slower than QEMU\'s default, '
                 'which applies', {'size': virtual_size, 'cluster': cluster,
                                   'wanted': -(-wanted // units.Mi),
                                   'cap': cap // units.Mi})
    return None


def chosen_cluster_size(opts, extra_specs):
    """The cluster size of a new overlay: the flavor's
    ``prealloc:cluster_size``, else ``[prealloc_backend]
    qcow2_cluster_size`` (128K by default).
    """
    value = (extra_specs or {}).get(FLAVOR_CLUSTER_KEY)
    if value is not None:
        try:
            return CLUSTER_SIZES[str(value).strip().upper()]
        except KeyError:
            raise exception.InvalidFlavorPolicy(
                value=value, key=FLAVOR_CLUSTER_KEY,
                allowed=', '.join(CLUSTER_SIZES))
    setting = opts.qcow2_cluster_size
    if setting is None:
        return DEFAULT_CLUSTER
    try:
        return CLUSTER_SIZES[setting]
    except KeyError:
        raise exception.ConflictingOptions(
            reason='[prealloc_backend] qcow2_cluster_size=%r: allowed '
                   'values are %s' % (setting, ', '.join(CLUSTER_SIZES)))


# A guest write smaller than a subcluster over backing data copies the rest
# of the subcluster first; the plugin's default layout (128K clusters,
# extended_l2) has 4 KiB subclusters, the size 512e disks advertise.
ADVERTISED_PHYSICAL_BLOCK = 4 * units.Ki


SUBCLUSTERS_PER_CLUSTER = 32


def physical_block_size(opts, mode, existing):
    """The ``<blockio physical_block_size>`` of a qcow2 disk, or None.

    4096 where ``existing`` (the disk's ExistingDisk as it is on the host)
    has 4 KiB subclusters, the disk's mode is not none and ``[prealloc_
    backend] advertise_physical_block_size`` is on; None (nova's XML, QEMU's
    512) everywhere else. The logical block size stays 512, so guests that
    write 512 bytes still can (doc/source/admin/write-size.rst).
    """
    if (not opts.advertise_physical_block_size or mode is Mode.NONE or
            existing is None or not existing.extended_l2 or
            not existing.cluster_size):
        return None
    subcluster = existing.cluster_size // SUBCLUSTERS_PER_CLUSTER
    if subcluster != ADVERTISED_PHYSICAL_BLOCK:
        return None
    return ADVERTISED_PHYSICAL_BLOCK
