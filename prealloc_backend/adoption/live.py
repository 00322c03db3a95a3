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

"""One running guest's overlay replaced by a preallocated one, live.

The new overlay is made beside the disk (``<disk>.prealloc-adopt-new``),
with the same backing file and virtual size, in the layout and
preallocation of the disk's plan. Then, with a journal beside the disk
(``<disk>.prealloc-adopt``, written durably before each step):

1. ``swapped``: the names are swapped: the disk becomes
   ``<disk>.prealloc-adopt-orig`` and the new overlay takes the disk's
   name. QEMU keeps the guest on the original file (it holds it open);
   libvirt's and nova's records name the disk's path, unchanged throughout.
2. A shallow block copy (``virDomainBlockCopy``, SHALLOW | REUSE_EXT |
   TRANSIENT_JOB) mirrors the guest's own clusters onto the new overlay,
   at ``bandwidth`` when given; every guest write meanwhile reaches both.
3. Once the copy is ready: the guest is paused, the copy waited for until
   nothing is left to copy, the new file flushed (fsync), and the journal
   says ``pivoting``: from here the new file holds every byte the guest
   wrote, durably, and is the disk whatever happens next.
4. The pivot (``virDomainBlockJobAbort`` with PIVOT), the guest resumed,
   the original file removed and the directory flushed, the journal
   removed.

Until the journal says ``pivoting`` the original file is the disk: a
cancel, a failed copy (the destination's filesystem full, libvirtd gone),
or ``recover`` after a kill or a power cut, abort the copy (never a pivot)
and give the original file its name back. The guest keeps running on it
throughout; QEMU never pivots by itself. After ``pivoting``, ``recover``
completes the pivot, resumes the guest and removes the original file. So a
kill at any point, or a power cut, leaves the guest's disk complete under
its own name; ``recover`` removes what is left over.

The guest pauses only across steps 3 and 4: the end of a copy already in
step, one fsync and the pivot.

Everything here runs as the caller: ``prealloc-backend adopt`` runs it as
the owner of instances_path (the nova user), never as root.
"""

import dataclasses
import json
import os
import time

from lxml import etree
from oslo_log import log as logging

from prealloc_backend.disk import qemu
from prealloc_backend import exception
from prealloc_backend.system import fileops
from prealloc_backend.system import stopping

LOG = logging.getLogger(__name__)

JOURNAL_SUFFIX = '.prealloc-adopt'
NEW_SUFFIX = '.prealloc-adopt-new'
ORIG_SUFFIX = '.prealloc-adopt-orig'
SWAPPED = 'swapped'
PIVOTING = 'pivoting'
PHASES = (SWAPPED, PIVOTING)
# libvirt's constants, by value, so that this module imports without the
# libvirt python module (the unit tier has none).
BLOCK_COPY_SHALLOW = 1
BLOCK_COPY_REUSE_EXT = 2
BLOCK_COPY_TRANSIENT_JOB = 4
BLOCK_JOB_ABORT_PIVOT = 2
DOMAIN_PAUSED = 3
# Seconds between two looks at the copy.
POLL = 0.2
# Seconds the paused guest waits, at most, for the copy's last bytes
# before the adoption gives up (and resumes the guest on its original
# disk).
SETTLE_TIMEOUT = 30


class Cancelled(Exception):
    """The caller asked the adoption to stop (Ctrl-C, SIGTERM)."""


class AdoptionFailed(Exception):
    """The copy failed or could not start; the guest is on its original
    disk, whole, and nothing is left over.
    """


@dataclasses.dataclass(frozen=True)
class Progress:
    dev: str
    copied: int
    total: int
    ready: bool


def journal_path(path):
    return path + JOURNAL_SUFFIX


def read_journal(path):
    """The journal's phase for the disk at ``path``, or None. A journal
    that does not parse or names another phase is reported as it is: the
    caller leaves such a disk alone (never guesses which file is the
    disk).
    """
    try:
        with open(journal_path(path), 'rb') as f:
            data = f.read(4096)
    except FileNotFoundError:
        return None
    try:
        record = json.loads(data)
        phase = record['phase']
    except (ValueError, KeyError, TypeError):
        raise exception.PreallocError(
            reason='%s: adoption journal %r is unreadable: left as it is'
                   % (path, data[:200]))
    if phase not in PHASES:
        raise exception.PreallocError(
            reason='%s: adoption journal names phase %r, not one of %s: '
                   'left as it is' % (path, phase, ', '.join(PHASES)))
    return record


def _journal(path, phase, dev, paused=False):
    fileops.write_file(journal_path(path), json.dumps(
        {'phase': phase, 'dev': dev, 'paused': paused, 'time': time.time()}),
        mode=0o600)


def _end_journal(path):
    fileops.remove(journal_path(path))
    fileops.fsync_dir(os.path.dirname(path))


def _swap(path, new, orig):
    os.rename(path, orig)
    os.rename(new, path)
    fileops.fsync_dir(os.path.dirname(path))


def _unswap(path, orig):
    """Give the original file its name back (the new one, at the disk's
    name, goes).
    """
    if os.path.lexists(orig):
        os.rename(orig, path)
        fileops.fsync_dir(os.path.dirname(path))


def disk_sources(domain):
    """{target dev: source file} of the domain's file disks, as libvirt
    has them now (its live XML).
    """
    tree = etree.fromstring(domain.XMLDesc(0))
    found = {}
    for disk in tree.findall('./devices/disk'):
        if disk.get('type') != 'file' or disk.get('device') != 'disk':
            continue
        source = disk.find('source')
        target = disk.find('target')
        if source is None or target is None or not source.get('file'):
            continue
        found[target.get('dev')] = source.get('file')
    return found


def _mirror_ready(domain, dev):
    """(job present, ready) for the block copy on ``dev``."""
    tree = etree.fromstring(domain.XMLDesc(0))
    for disk in tree.findall('./devices/disk'):
        target = disk.find('target')
        if target is None or target.get('dev') != dev:
            continue
        mirror = disk.find('mirror')
        if mirror is None:
            return False, False
        return True, mirror.get('ready') == 'yes'
    return False, False


def _job(domain, dev):
    info = domain.blockJobInfo(dev, 0)
    return info or None


def _abort_job(domain, dev):
    """Abort the copy on ``dev`` (never a pivot) and wait until libvirt
    says it is gone: the guest stays on its original file.
    """
    if not domain.isActive() or _job(domain, dev) is None:
        return
    domain.blockJobAbort(dev, 0)
    deadline = time.monotonic() + 60
    while _job(domain, dev) is not None:
        if time.monotonic() > deadline:
            raise exception.PreallocError(
                reason='the block copy on %s did not end within 60 s of '
                       'its abort' % dev)
        time.sleep(POLL)


def make_target(path, backing, backing_fmt, virtual_size, plan,
                timeout=None):
    """The new overlay at ``<path>.prealloc-adopt-new``, in ``plan``'s
    layout and preallocation, checked (qemu.check_overlay), flushed.
    """
    new = path + NEW_SUFFIX
    if os.path.lexists(new):
        fileops.remove(new)
    try:
        qemu.create_overlay(new, virtual_size, backing, backing_fmt, plan,
                            timeout=timeout)
        qemu.check_overlay(new, virtual_size, backing, plan)
        fileops.sync(new)
    except BaseException:
        if os.path.lexists(new):
            fileops.remove(new)
        raise
    return new


def adopt_running(domain, dev, path, new, bandwidth=None, progress=None,
                  cancelled=lambda: False):
    """Put the guest of ``domain`` on ``new`` (make_target's) in place of
    the overlay at ``path`` (its disk ``dev``), as the module says.
    Returns the seconds the guest was paused. Raises Cancelled or
    AdoptionFailed with the guest on its original disk and ``new`` gone.
    """
    orig = path + ORIG_SUFFIX
    if os.path.lexists(orig):
        raise AdoptionFailed('%s exists: a crashed adoption is left there; '
                             'run prealloc-backend adopt again to recover '
                             'it' % orig)
    _journal(path, SWAPPED, dev)
    try:
        _swap(path, new, orig)
        stopping.pause_point('adopt swapped')
        flags = (BLOCK_COPY_SHALLOW | BLOCK_COPY_REUSE_EXT |
                 BLOCK_COPY_TRANSIENT_JOB)
        params = {'bandwidth': int(bandwidth)} if bandwidth else {}
        dest = ("<disk type='file'><source file=%s/><driver type='qcow2'/>"
                "</disk>" % _quote(path))
        domain.blockCopy(dev, dest, params, flags)
        _wait_ready(domain, dev, progress, cancelled)
        paused = _settle_and_pivot(domain, dev, path)
    except BaseException as exc:
        try:
            _back_to_original(domain, dev, path, orig)
        except Exception:
            LOG.exception('%s: could not undo the adoption; the journal '
                          'stays for prealloc-backend adopt to recover',
                          path)
            raise exc
        if isinstance(exc, (Cancelled, KeyboardInterrupt)):
            raise
        if isinstance(exc, Exception):
            raise AdoptionFailed('%s: the copy failed, the guest stays on '
                                 'its original disk: %s' % (path, exc))
        raise
    _finish(path, orig)
    return paused


def _quote(value):
    from xml.sax import saxutils
    return saxutils.quoteattr(value)


def _wait_ready(domain, dev, progress, cancelled):
    while True:
        if cancelled():
            raise Cancelled()
        job = _job(domain, dev)
        present, ready = _mirror_ready(domain, dev)
        if job is None or not present:
            raise AdoptionFailed('the block copy of %s ended before it was '
                                 'ready (see libvirtd\'s log: a full '
                                 'filesystem, a read error)' % dev)
        if progress:
            progress(Progress(dev, job['cur'], job['end'], ready))
        stopping.pause_point('adopt copying')
        if ready and job['cur'] == job['end']:
            return
        time.sleep(POLL)


def _settle_and_pivot(domain, dev, path):
    start = time.monotonic()
    domain.suspend()
    try:
        deadline = start + SETTLE_TIMEOUT
        while True:
            job = _job(domain, dev)
            if job is None:
                raise AdoptionFailed('the block copy of %s ended while the '
                                     'guest was paused' % dev)
            if job['cur'] == job['end'] and _mirror_ready(domain, dev)[1]:
                break
            if time.monotonic() > deadline:
                raise AdoptionFailed('the block copy of %s did not settle '
                                     'within %d s of the pause' %
                                     (dev, SETTLE_TIMEOUT))
            time.sleep(0.01)
        # The paused guest writes nothing: the new file holds all it wrote.
        fileops.sync(path)
        _journal(path, PIVOTING, dev, paused=True)
        stopping.pause_point('adopt pivoting')
        try:
            domain.blockJobAbort(dev, BLOCK_JOB_ABORT_PIVOT)
        except Exception:
            if _job(domain, dev) is not None:
                # The pivot did not happen and the paused guest wrote
                # nothing since the settle: its original file is the disk
                # again, as before the journal said pivoting.
                _journal(path, SWAPPED, dev)
            raise
    except BaseException:
        if domain.info()[0] == DOMAIN_PAUSED and read_journal(
                path)['phase'] == SWAPPED:
            domain.resume()
        raise
    domain.resume()
    return time.monotonic() - start


def _back_to_original(domain, dev, path, orig):
    record = read_journal(path)
    if record and record['phase'] == PIVOTING:
        # Past the point of no return: the new file is the disk.
        recover(domain, path)
        return
    _abort_job(domain, dev)
    _unswap(path, orig)
    new = path + NEW_SUFFIX
    if os.path.lexists(new):
        fileops.remove(new)
    _end_journal(path)


def _finish(path, orig):
    fileops.remove(orig)
    fileops.fsync_dir(os.path.dirname(path))
    _end_journal(path)


def recover(domain, path):
    """Finish or undo an adoption a kill or a power cut interrupted, as
    the journal beside ``path`` says (see the module). ``domain`` is the
    instance's libvirt domain, or None when it is not defined. Returns
    what was done, in words, or None when there was nothing to do.
    """
    record = read_journal(path)
    new = path + NEW_SUFFIX
    orig = path + ORIG_SUFFIX
    if record is None:
        if os.path.lexists(new):
            # Made, never swapped in (the journal is written before the
            # swap): a kill while making it.
            fileops.remove(new)
            return 'removed %s (a target never used)' % new
        return None
    dev = record.get('dev')
    active = domain is not None and domain.isActive()
    if record['phase'] == SWAPPED:
        if active and dev:
            _abort_job(domain, dev)
        _unswap(path, orig)
        if os.path.lexists(new):
            fileops.remove(new)
        _end_journal(path)
        return 'copy undone: the guest keeps its original disk %s' % path
    if active and dev and _job(domain, dev) is not None:
        domain.blockJobAbort(dev, BLOCK_JOB_ABORT_PIVOT)
    if active and record.get('paused') and domain.info()[0] == \
            DOMAIN_PAUSED:
        domain.resume()
    if os.path.lexists(orig):
        fileops.remove(orig)
        fileops.fsync_dir(os.path.dirname(path))
    _end_journal(path)
    return 'pivot completed: %s is the preallocated disk' % path
