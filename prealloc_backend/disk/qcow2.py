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

"""qcow2 operations: a disk's layout as it is, an overlay made, a disk grown.

Each carries out a DiskPlan with qemu.py's commands and checks the result:
an overlay is made into ``<path>.prealloc-tmp`` and renamed into place
only once qemu-img reported success and its header says what was asked,
so that a disk at ``path`` is always complete; a grown disk must report
the size asked for. The zeros of ``preallocation=full`` are dropped from
the host's page cache once they are on disk (_drop_zeros).

Not in qemu.py, which stays one thin wrapper per qemu-img verb; the
steps that make one disk out of several commands, and the temporary file,
are here.
"""

import collections
import errno
import os
import time

from oslo_log import log as logging
from oslo_utils import fileutils

from prealloc_backend.disk import formats
from prealloc_backend.disk import journal
from prealloc_backend.disk import qemu
from prealloc_backend.disk import refcount
from prealloc_backend import exception
from prealloc_backend.planner import qcow2_layout
from prealloc_backend.system import fileops

LOG = logging.getLogger(__name__)


class Layout(collections.namedtuple(
        'Layout', 'cluster_size extended_l2 preallocation')):
    """A qcow2 file's layout where there is no plan (qemu.convert reads
    these three fields of a DiskPlan).
    """


# What nova's own ``qemu-img convert -O qcow2`` makes: qemu-img's defaults.
THIN = Layout(65536, False, qcow2_layout.Qcow2Preallocation.OFF)


def _drop_zeros(path, plan):
    """After qemu-img wrote a ``preallocation=full`` disk through the page
    cache: write it back and drop its pages (fileops.drop_page_cache), so
    that a guest's first cache=none writes do not invalidate them first.
    """
    if plan.preallocation is not qcow2_layout.Qcow2Preallocation.FULL:
        return
    if not fileops.drop_file_page_cache(path):
        LOG.debug('%s: its pages could not be dropped from the page cache',
                  path)


def existing(path):
    """(ExistingDisk, ImageInfo) of the qcow2 disk at ``path``."""
    info = qemu.info(path, 'qcow2')
    return existing_from(path, info), info


def existing_from(path, info):
    """The ExistingDisk of the qcow2 disk at ``path`` whose ImageInfo is
    ``info`` (read for its check: formats.check_qcow2_disk), its
    allocation as it is now.
    """
    return info.existing(os.stat(path).st_blocks * 512)


def make_overlay(target, virtual_size, base, base_fmt, plan, timeout=None):
    """Make ``target``, a new file, a qcow2 overlay of ``base`` (format
    ``base_fmt``) of ``virtual_size`` bytes laid out as ``plan`` says,
    checked (qemu.check_overlay), its zeros out of the page cache: the one
    way an overlay is made, by the disk operation (create_overlay) and by
    adoption (adoption/live.py's target). Removed on any error. Returns
    its ImageInfo; the caller flushes and publishes it.
    """
    with fileutils.remove_path_on_error(target):
        qemu.create_overlay(target, virtual_size, base, base_fmt, plan,
                            timeout=timeout)
        made = qemu.check_overlay(target, virtual_size, base, plan)
        _drop_zeros(target, plan)
    return made


def create_overlay(path, virtual_size, base, base_fmt, plan, timeout=None):
    """Make ``path`` a qcow2 overlay of ``base`` laid out as ``plan`` says,
    through a temporary file renamed into place when complete. Returns
    its ImageInfo.
    """
    tmp = path + journal.TMP_SUFFIX
    started = time.monotonic()
    made = make_overlay(tmp, virtual_size, base, base_fmt, plan,
                        timeout=timeout)
    with fileutils.remove_path_on_error(tmp):
        fileops.publish(tmp, path)
    LOG.info('Created %(path)s: qcow2 overlay of %(base)s, %(size)d bytes, '
             'preallocation=%(prealloc)s, cluster_size=%(cluster)d, '
             'extended_l2=%(ext)s in %(secs).2f s',
             {'path': path, 'base': base, 'size': virtual_size,
              'prealloc': plan.preallocation.value,
              'cluster': plan.cluster_size, 'ext': plan.extended_l2,
              'secs': time.monotonic() - started})
    return made


def grow(path, old_size, plan, timeout=None):
    """Grow the qcow2 disk at ``path`` to ``plan.virtual_size`` with the
    plan's preallocation of the new area, inside the journal cache()
    began for it.

    A growth cut short (a kill, a power cut, a timeout's kill) leaves the
    old disk, and may leave clusters counted past the file's end, on
    which QEMU's next preallocating growth aborts (refcount.py): mended
    first (refcount.mend; nothing to do, a read of the refcount table's
    tail, on a disk no cut growth touched). The journal records the
    file's length before the growth, for the recovery of a crash
    (journal.Journal.recover); a failed growth is mended at once.
    """
    size = plan.virtual_size
    LOG.info('Growing %(path)s from %(old)d to %(new)d bytes with '
             'preallocation=%(prealloc)s',
             {'path': path, 'old': old_size, 'new': size,
              'prealloc': plan.preallocation.value})
    refcount.mend(path, timeout=timeout)
    length = os.stat(path).st_size
    journal.Journal(path).growing(length)
    try:
        qemu.resize(path, 'qcow2', size, plan.preallocation,
                    timeout=timeout)
    except BaseException:
        try:
            refcount.mend(path, length, timeout=timeout)
        except Exception:
            LOG.exception('%s: a failed growth could not be mended: the '
                          'next growth tries again', path)
        raise
    # qemu-img flushes what it wrote; flushed again here, so that the
    # grown disk is on the device when the journal is removed.
    fileops.sync(path)
    # Read from the header qemu-img wrote last (no second qemu-img info
    # of a disk the operation read already).
    header = qemu.header_info(path)
    grown = header.virtual_size if header is not None else 0
    if grown < size:
        raise exception.QemuImgOutputError(
            cmd='qemu-img resize', reason='it reported success but the '
            'virtual size is %d, not %d' % (grown, size), output=path)
    _drop_zeros(path, plan)


def relayout_overlay(path, backing, backing_fmt, plan, timeout=None):
    """Rewrite the overlay at ``path`` of ``backing`` (format
    ``backing_fmt``, as check_qcow2_disk resolved and checked it) with the
    plan's cluster size, extended_l2 and preallocation: ``qemu-img convert
    -B`` writes its own data into a new overlay of the same backing file,
    checked with ``qemu-img compare`` to read the same before the rename.
    Returns False, leaving it as it is, where a name holds a comma.
    """
    if ',' in backing or ',' in backing_fmt:
        LOG.warning('%(path)s: backing file %(backing)r has a comma: '
                    'not rewritten, grown without preallocation',
                    {'path': path, 'backing': backing})
        return False
    tmp = path + journal.TMP_SUFFIX
    with fileutils.remove_path_on_error(tmp):
        qemu.convert(path, 'qcow2', tmp, plan, 'writeback',
                     backing_file=backing, backing_fmt=backing_fmt,
                     timeout=timeout or None)
        qemu.compare(path, tmp)
        _drop_zeros(tmp, plan)
        # The new file flushed before it replaces the guest's only copy,
        # the directory after.
        fileops.publish(tmp, path)
    LOG.info('Rewrote %(path)s with extended_l2, cluster_size=%(cluster)d'
             ' and preallocation=%(prealloc)s before growing it',
             {'path': path, 'cluster': plan.cluster_size,
              'prealloc': plan.preallocation.value})
    return True


def convert_cache(path):
    """The destination cache mode of a conversion of the disk at ``path``
    into a file beside it: ``none`` where its filesystem takes O_DIRECT,
    ``writeback`` where it does not (both honour flushes), as nova's
    images.convert_image chooses. Asked by opening the disk itself with
    O_DIRECT, read-only: nova's supports_direct_io writes a test file,
    which a kill would leave beside the disk (tests/crash).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return 'writeback'
    os.close(fd)
    return 'none'


def convert_raw(path, plan, timeout=None):
    """Convert the raw disk at ``path`` in place into a standalone qcow2
    disk laid out as ``plan`` says (through ``<path>_qcow``, nova's name
    for it, renamed into place when complete), and record it qcow2 in
    disk.info.

    The disk and its record change in an order a crash at any point
    leaves recoverable (journal.Journal.reconcile): the new file is
    flushed, the journal says 'converting', the rename is flushed, the
    journal says 'ready', disk.info says qcow2, the journal is removed.
    """
    tmp = path + journal.CONVERT_SUFFIX
    record = journal.Journal(path)
    try:
        qemu.convert(path, 'raw', tmp, plan, convert_cache(path),
                     timeout=timeout or None, path=path)
        # NOTE(qemu): qemu-img convert's -t none keeps the copied data out
        # of the page cache, not the zeros of preallocation=full, written
        # when the file is made.
        _drop_zeros(tmp, plan)
        fileops.sync(tmp)
    except BaseException:
        fileops.remove(tmp)
        raise
    try:
        record.phase(journal.CONVERTING)
    except BaseException:
        # The journal may say 'converting' on the device: it goes first,
        # the temporary file after, so that no state has the journal
        # without it (reconcile() would record the raw disk qcow2). If
        # the journal cannot be removed, the temporary file stays and
        # reconcile() rolls back.
        record.discard()
        fileops.remove(tmp)
        raise
    try:
        fileops.publish(tmp, path)
        record.phase(journal.READY)
        formats.record_format(path, 'qcow2')
        record.end()
    except BaseException:
        # Published or not, the journal (whose phase and the temporary
        # name tell which) is handed to the next cache() of this process
        # too: reconcile() leaves a journal bearing this process's mark
        # to the conversion that wrote it, which has ended here.
        record.phase(journal.CONVERTING, mine=False)
        raise
    LOG.info('Converted %(path)s from raw to qcow2 with '
             'preallocation=%(prealloc)s, cluster_size=%(cluster)d',
             {'path': path, 'prealloc': plan.preallocation.value,
              'cluster': plan.cluster_size})
