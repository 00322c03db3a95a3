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

"""What a qcow2 growth cut short leaves past the file's end, and its mend.

NOTE(qemu): ``qemu-img resize --preallocation=falloc|full``
(qcow2_co_truncate) puts the refcount structures of the new area at the
end of the file (qcow2_refcount_area): it first sets, in a refcount block
already in the file, the refcounts of the clusters it is about to write
there, flushes that block, and only then writes them. Cut between the two
(a kill, a power cut: seen 2 times in 3 with ``strace -e
inject=pwrite64:signal=SIGKILL:when=2``), the file ends before clusters its
refcounts count as used. QEMU reads such a file; ``qemu-img check`` (with
``-r all`` too) compares refcounts only for the clusters inside the file
(compare_refcounts stops at the file's length), so it finds nothing; and
the next preallocating growth, which puts its structures after the last
used cluster inside the file, finds them counted and aborts
(``qcow2_refcount_area: Assertion `s->get_refcount(refblock_data, j) ==
0' failed``, SIGABRT). QEMU 7.2.22 and 10.0.2 alike; a metadata growth
whose refcounts reach the device before the file is extended leaves the
same. Found upstream by fuzzing, answered by a refusal of such a growth,
not a repair:
https://lore.kernel.org/qemu-devel/20250506141042.99917-1-gerben@altlinux.org/

``mend`` reads the refcount table and the refcount blocks covering the
file's end (the header's fields, bounded as QEMU bounds them), and where a
refcount counts a cluster past the end: extends the file over it (a hole),
so that ``qemu-img check -r leaks`` sees those clusters, proves that no
metadata references them (a leak: counted, never referenced) and frees
them; then cuts the file back to its length before, never below the end
``qemu-img check`` reports (the last cluster anything counts or
references) nor below what the refcounts still count. No byte a table
references is ever dropped. Run before every growth (qcow2.grow) and by
the journal's recovery of a growth a crash cut (journal.Journal.recover),
which also frees the clusters the cut growth left inside the file and cuts
the file back to its length before the growth.

Read here rather than by qemu-img: no qemu-img verb reports refcounts past
the file's end.
"""

import os
import struct

from oslo_log import log as logging
from oslo_utils import units

from prealloc_backend.disk import qemu
from prealloc_backend import exception
from prealloc_backend.system import fileops

LOG = logging.getLogger(__name__)

MAGIC = b'QFI\xfb'
# magic, version, backing_file_offset, backing_file_size, cluster_bits,
# size, crypt_method, l1_size, l1_table_offset, refcount_table_offset,
# refcount_table_clusters (the qcow2 header, docs/interop/qcow2.txt).
_HEADER = struct.Struct('>4sIQIIQIIQQI')
# Version 3's refcount_order.
_REFCOUNT_ORDER = struct.Struct('>I')
_REFCOUNT_ORDER_AT = 96
# QEMU's bounds (block/qcow2.h): MIN_CLUSTER_BITS, MAX_CLUSTER_BITS,
# QCOW_MAX_REFTABLE_SIZE; refcount_order 0 (1 bit) to 6 (64 bits).
MIN_CLUSTER_BITS = 9
MAX_CLUSTER_BITS = 21
MAX_REFTABLE_BYTES = 8 * units.Mi
MAX_REFCOUNT_ORDER = 6
# A refcount table entry's offset bits (bits 0-8 are reserved).
_REFTABLE_OFFSET_MASK = 0xfffffffffffffe00


def _fail(path, reason):
    raise exception.Qcow2RefcountError(path=path, reason=reason)


def _pread(fd, offset, length):
    chunks = []
    while length:
        chunk = os.pread(fd, length, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        length -= len(chunk)
    return b''.join(chunks)


def _layout(fd, path):
    """(cluster size, refcount_order, refcount table offset, its bytes)
    from the header, each within QEMU's bounds.
    """
    head = _pread(fd, 0, _REFCOUNT_ORDER_AT + _REFCOUNT_ORDER.size)
    if len(head) < _HEADER.size:
        _fail(path, 'its header is %d bytes long' % len(head))
    (magic, version, _bfo, _bfs, cluster_bits, _size, _crypt, _l1_size,
     _l1_offset, table_offset, table_clusters) = _HEADER.unpack_from(head)
    if magic != MAGIC:
        _fail(path, 'no qcow2 magic (%r)' % magic)
    if version not in (2, 3):
        _fail(path, 'qcow2 version %d, not 2 or 3' % version)
    if not MIN_CLUSTER_BITS <= cluster_bits <= MAX_CLUSTER_BITS:
        _fail(path, 'cluster_bits %d, not %d to %d' % (
            cluster_bits, MIN_CLUSTER_BITS, MAX_CLUSTER_BITS))
    order = 4
    if version == 3:
        if len(head) < _REFCOUNT_ORDER_AT + _REFCOUNT_ORDER.size:
            _fail(path, 'its version 3 header is %d bytes long'
                  % len(head))
        order = _REFCOUNT_ORDER.unpack_from(head, _REFCOUNT_ORDER_AT)[0]
        if order > MAX_REFCOUNT_ORDER:
            _fail(path, 'refcount_order %d, not 0 to %d'
                  % (order, MAX_REFCOUNT_ORDER))
    cluster = 1 << cluster_bits
    table_bytes = table_clusters * cluster
    if (table_offset % cluster or not table_clusters or
            table_bytes > MAX_REFTABLE_BYTES):
        _fail(path, 'refcount table of %d clusters at %d (cluster size %d,'
              ' at most %d bytes)' % (table_clusters, table_offset, cluster,
                                      MAX_REFTABLE_BYTES))
    return cluster, order, table_offset, table_bytes


def _last_counted(block, order):
    """Index of the last non-zero refcount in a refcount block (entries of
    2**order bits, big-endian; below 8 bits, the first entry in a byte's
    low bits, as QEMU's get_refcount_ro0..2 read them), or None.
    """
    used = len(block.rstrip(b'\0'))
    if not used:
        return None
    if order >= 3:
        return (used - 1) // (1 << (order - 3))
    width = 1 << order
    last_byte = block[used - 1]
    return (used - 1) * (8 // width) + (last_byte.bit_length() - 1) // width


def counted_end(path):
    """(file length, end of its last cluster, end of the last cluster a
    refcount counts as used) of the qcow2 file at ``path``. The refcount
    blocks are read from the one covering the file's last cluster on:
    the third figure is exact where it passes the second, else at most the
    second. Raises Qcow2RefcountError where the header or a table does
    not hold together.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        length = os.fstat(fd).st_size
        cluster, order, table_offset, table_bytes = _layout(fd, path)
        in_file = -(-length // cluster)
        per_block = cluster * 8 >> order
        table = _pread(fd, table_offset, table_bytes)
        if len(table) < table_bytes:
            _fail(path, 'its refcount table (%d bytes at %d) passes the '
                  'end of the file (%d bytes)' % (table_bytes, table_offset,
                                                 length))
        entries = struct.unpack('>%dQ' % (table_bytes // 8), table)
        end = 0
        # Each block read once, however many entries name it (a table
        # naming one block a million times reads it once).
        lasts = {}
        for index in range(in_file // per_block, len(entries)):
            offset = entries[index] & _REFTABLE_OFFSET_MASK
            if not offset:
                continue
            if offset not in lasts:
                block = _pread(fd, offset, cluster)
                if len(block) < cluster:
                    _fail(path, 'refcount block %d at %d passes the end of '
                          'the file (%d bytes)' % (index, offset, length))
                lasts[offset] = _last_counted(block, order)
            last = lasts[offset]
            if last is not None:
                end = max(end, (index * per_block + last + 1) * cluster)
        return length, in_file * cluster, end
    finally:
        os.close(fd)


def mend(path, length=None, timeout=None):
    """Free the clusters a growth cut short left counted past the end of
    the qcow2 file at ``path``, as the module says. ``length``: the file's
    length before that growth (the journal's record): the clusters it left
    inside the file are freed too and the file cut back to it, never
    below anything counted or referenced. Without it, the file is only
    worked on where refcounts pass its end. True when it was changed.
    Raises Qcow2RefcountError, or QemuImgError from ``qemu-img check``
    (a corrupt file is left as it is).
    """
    size, in_file_end, counted = counted_end(path)
    past = counted > in_file_end
    if not past and length is None:
        return False
    if past:
        LOG.warning('%(path)s: its refcounts count clusters up to %(end)d '
                    'bytes, past the end of the file (%(size)d bytes): a '
                    'growth cut short; freeing them (qemu-img check -r '
                    'leaks) before any growth',
                    {'path': path, 'end': counted, 'size': size})
        os.truncate(path, counted)
    result = qemu.repair_leaks(path, timeout=timeout)
    _, _, counted = counted_end(path)
    keep = max(size if length is None else length,
               result['image-end-offset'], counted)
    if keep < os.stat(path).st_size:
        LOG.info('%(path)s: cut back to %(keep)d bytes (%(freed)d leaked '
                 'clusters freed)', {'path': path, 'keep': keep,
                                     'freed': result.get('leaks-fixed', 0)})
        os.truncate(path, keep)
    fileops.sync(path)
    return past or bool(result.get('leaks-fixed'))
