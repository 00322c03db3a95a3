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

"""The allocation executor: the blocks of a raw file, as a DiskPlan says.

The two ways a plan's ``raw_action`` allocates a file as it is now, holes
only: ``fallocate_file``, one privileged fallocate(2) of the whole file,
and ``zero_fill``, calls of ``ZERO_FILL_CALL_BYTES`` with progress logged
and the wall-clock ``allocation_timeout`` checked between them; it yields
to its caller every ``progress_interval``, where the disk operation
checks that the instance is not being deleted. Where fallocate(2) turns
out unsupported, the filesystem is recorded as such (fsprobe) and
``fallocate_file`` says so: the operation plans again (the decision stays
in diskplan.make_plan).

``dig_holes`` does the opposite for a metadata-mode disk that arrived
fully written: holes where whole blocks read as zeros.

os-brick and os-vif call a privileged
entrypoint once and let a dead daemon's error through. Here a call whose
daemon died under it is made once more (``_privileged``): both entrypoints
are idempotent on the same range, and a spawn or hard reboot should not
fail because the daemon was restarted under a long zero-fill.
"""

import errno
import os
import time

from oslo_log import log as logging
from oslo_utils import units

from prealloc_backend.disk import fsprobe
from prealloc_backend import exception
import prealloc_backend.privsep.fs
from prealloc_backend.system import fileops
from prealloc_backend.system import process

LOG = logging.getLogger(__name__)

# Bytes zero-filled per privileged call: progress, timeout and cancellation
# are checked between calls.
ZERO_FILL_CALL_BYTES = 256 * units.Mi

# OSError errnos of a call whose privsep daemon died under it (None: the
# 'Premature eof' of oslo.privsep).
_DAEMON_GONE = (errno.EPIPE, errno.ECONNRESET, None)


def _privileged(func, *args):
    """Call a privileged entrypoint of prealloc_backend.privsep.fs.

    The entrypoints are idempotent (fallocate, zero-fill of holes): when
    the daemon died under a call, the call is made once more, which starts
    a new daemon. Other errors propagate.
    """
    try:
        return func(*args)
    except OSError as exc:
        if exc.errno not in _DAEMON_GONE:
            raise
        LOG.warning('The prealloc_backend privsep daemon died during '
                    '%(call)s (%(err)s): calling it again',
                    {'call': getattr(func, '__name__', func), 'err': exc})
        return func(*args)


def fallocate_file(path):
    """fallocate(2) every hole of the file at ``path`` as it is now, as a
    plan's FALLOCATE says. False when the filesystem has no fallocate(2)
    (recorded with fsprobe for the next plan); True when it is allocated.

    Free space is not checked here: the plan checked it before the work
    (plan.fits, the disk operation), and the daemon checks it again under
    its lock before each fallocate(2) or write, as its own defence
    (AllocationOutOfSpace).
    """
    st = os.stat(path)
    size = st.st_size
    # st_blocks, not SEEK_HOLE: blocks reserved by fallocate are
    # unwritten extents that SEEK_HOLE may report as holes, and a disk
    # allocated long ago must not fail a hard reboot on a full host.
    unallocated = max(0, size - st.st_blocks * 512)
    if not unallocated:
        return True
    return _fallocate(path, size, unallocated)


def _fallocate(path, size, unallocated):
    """fallocate(2) the whole file; False when the filesystem has no
    fallocate(2) (recorded for its next plan).
    """
    try:
        _privileged(prealloc_backend.privsep.fs.fallocate_range,
                    path, 0, size)
    except OSError as exc:
        if not fileops.is_unsupported(exc):
            raise exception.AllocationFailed(path=path, reason=str(exc))
        fsprobe.record_unsupported(os.path.dirname(path))
        return False
    # The reserved extents on the device before the journal is removed
    # (the zero-fill path flushes in the daemon: fileops.zero_fill). A
    # disk only the daemon may open is left to it.
    fileops.sync(path, denied_ok=True)
    LOG.info('Allocated %(path)s (%(size)d bytes, %(holes)d were not '
             'allocated)', {'path': path, 'size': size, 'holes': unallocated})
    return True


def zero_fill(path, size, timeout, interval):
    """Write zeros into the holes of the first ``size`` bytes of ``path``,
    ``ZERO_FILL_CALL_BYTES`` per privileged call: a generator, which
    yields the bytes done so far with the progress log every ``interval``
    seconds (the caller may stop there by raising) and ends when the file
    is filled.

    Raises AllocationTimeout once ``timeout`` seconds (0: none) have
    passed.
    """
    started = last_log = time.monotonic()
    written = 0
    for offset in range(0, size, ZERO_FILL_CALL_BYTES):
        length = min(ZERO_FILL_CALL_BYTES, size - offset)
        try:
            written += _privileged(
                prealloc_backend.privsep.fs.zero_fill_range,
                path, offset, length)
        except OSError as exc:
            raise exception.AllocationFailed(path=path, reason=str(exc))
        now = time.monotonic()
        if timeout and now - started > timeout:
            raise exception.AllocationTimeout(path=path, timeout=timeout)
        if now - last_log >= interval:
            last_log = now
            done = offset + length
            LOG.info('Zero-filling %(path)s: %(done)d of %(total)d MiB '
                     '(%(pct)d%%), %(rate).0f MiB/s',
                     {'path': path, 'done': done // units.Mi,
                      'total': size // units.Mi,
                      'pct': 100 * done // size,
                      'rate': written / units.Mi / (now - started)})
            yield done
    LOG.info('Zero-filled %(path)s: %(written)d bytes written in '
             '%(secs).1f s', {'path': path, 'written': written,
                              'secs': time.monotonic() - started})


def dig_holes(path):
    """A metadata-mode disk that arrived on this host fully written.

    NOTE(nova): nova's default transport (``[libvirt]
    remote_filesystem_transport = ssh``: scp, SshDriver in
    nova/virt/libvirt/volume/remotefs.py) writes every
    byte of a cold-migrated disk, zeros included, so a metadata overlay
    (mapped clusters, no data blocks) arrives fully allocated. Punch
    holes where whole blocks read as zeros (util-linux ``fallocate
    --dig-holes``): what the guest reads is unchanged (a hole reads as
    zeros, the qcow2 metadata keeps every cluster mapped), the disk is
    what metadata preallocation makes. Only in finish_migration, where
    the copy just happened: it reads the whole file. A file at most half
    allocated is left as it is.
    """
    st = os.stat(path)
    before = st.st_blocks * 512
    if before <= st.st_size // 2:
        return
    try:
        process.execute('fallocate', '--dig-holes', path)
    except exception.PreallocError as exc:
        # Only makes the disk thinner: never fails the migration.
        LOG.warning('%(path)s arrived fully written; punching holes '
                    'where it reads zeros failed, left as it is: '
                    '%(error)s', {'path': path, 'error': exc})
        return
    LOG.info('%(path)s arrived fully written (a full copy): holes '
             'punched where it read zeros for mode metadata, %(before)d '
             'then %(after)d bytes allocated',
             {'path': path, 'before': before,
              'after': os.stat(path).st_blocks * 512})
