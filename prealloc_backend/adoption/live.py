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
   at ``bandwidth`` when given; every guest write meanwhile is copied too.
   A copy that does not come into step is given up and undone (the guest
   stays on its original disk): when the bytes left to copy make no new
   low for ``CopyLimits.stall`` seconds, or the copy has copied
   COPY_FACTOR times what it had to copy at its start, as a guest writing
   faster than the copy's rate makes it.
3. Once the copy is in step: the journal says the guest is paused (before
   it is), the copy's rate limit is lifted, the guest is paused (QEMU
   flushes the original file), the copy waited for until nothing is left,
   and the pivot (``virDomainBlockJobAbort`` with PIVOT): QEMU flushes the
   new file, metadata included, before it switches to it.
4. ``pivoted``: the new file flushed again from here, the journal says so;
   only then is the guest resumed, the original file removed and the
   directory flushed, the journal removed.

The guest writes nothing between its pause and ``pivoted``: until then the
original file holds everything it wrote, flushed; from then the new file
does. Which file QEMU has open, when it runs, is read from QEMU's own
image locks (its write-permission byte, fileops.QEMU_WRITER_BYTE): a
file no QEMU holds is the only one ever renamed over or removed.

``recover`` (after a kill, a power cut, a libvirtd restart) and the undo of
a cancel or a failed copy follow from that:

- The guest is not running (a power cut): the journal decides:
  ``swapped``, the original; ``pivoted``, the new file.
- It runs: a copy still running is aborted (never pivoted); then QEMU
  holding the original file means the original gets its name back, and
  QEMU holding the new file alone means the pivot happened, if the
  journal says ``pivoted`` or says the adoption paused this very QEMU
  (its domain ID: a pivot comes only then).
- Anything else (a QEMU started from the disk's name after a crash, no
  image lock on either file, both held): nothing is touched, the journal
  stays, the error says why. The adoption itself refuses a disk whose
  QEMU holds no image lock (image locking off).

A guest the adoption paused is resumed by the undo or by ``recover``; one
QEMU paused on an I/O error while the copy took room (a full filesystem)
is resumed once the copy's file is gone. nova-compute's start runs
``recover`` too (the driver's init_host), before nova starts any guest
(adoption.recovery: waiting for a running adopt).

Everything here runs as the caller: ``prealloc-backend adopt`` runs it as
the owner of instances_path (the nova user), never as root.
"""

import dataclasses
import json
import os
import stat
import time

from lxml import etree
from oslo_log import log as logging

from prealloc_backend.disk import journal as journal_mod
from prealloc_backend.disk import qcow2
from prealloc_backend import exception
from prealloc_backend.system import fileops
from prealloc_backend.system import stopping

LOG = logging.getLogger(__name__)

JOURNAL_SUFFIX = '.prealloc-adopt'
NEW_SUFFIX = '.prealloc-adopt-new'
ORIG_SUFFIX = '.prealloc-adopt-orig'
SWAPPED = 'swapped'
PIVOTED = 'pivoted'
# A stopped instance's offline rewrite (qcow2.relayout_overlay): its
# temporary file is removed by recover.
OFFLINE = 'offline'
PHASES = (SWAPPED, PIVOTED, OFFLINE)
# libvirt's constants, by value, so that this module imports without the
# libvirt python module (the unit tier has none).
BLOCK_COPY_SHALLOW = 1
BLOCK_COPY_REUSE_EXT = 2
BLOCK_COPY_TRANSIENT_JOB = 4
BLOCK_JOB_ABORT_PIVOT = 2
DOMAIN_RUNNING = 1
DOMAIN_PAUSED = 3
# virDomainPausedReason: paused by a client (the adoption's suspend).
PAUSED_USER = 1
# virDomainPausedReason: stopped on an I/O error (werror=enospc, ...).
PAUSED_IOERROR = 5
# Seconds between two looks at the copy.
POLL = 0.2
# Seconds the paused guest waits, at most, for the copy's last bytes
# before the adoption gives up (and resumes the guest on its original
# disk).
SETTLE_TIMEOUT = 30
# Seconds the bytes left to copy may go without a new low before the copy
# is given up (a guest writing faster than the copy's rate keeps it from
# coming into step): the default of ``adopt --stall-timeout``.
STALL_TIMEOUT = 120
# What QEMU's mirror copies at once before its rate limit makes it wait
# (its default buffer, DEFAULT_MIRROR_BUF_SIZE: 16 in-flight requests of
# 1 MiB); seen on QEMU 7.2: 16 MiB of a 32 MiB copy at once, then nothing
# for as long as the rate takes to pay it back.
MIRROR_BURST = 16 * 2 ** 20
# The copy's bound: it may copy COPY_FACTOR times what it had to copy at
# its start (a guest rewriting its disk faster than the copy makes it copy
# the same clusters again and again).
COPY_FACTOR = 4
# What a copy in step may still have to copy when the guest is paused for
# the pivot (copied then, unthrottled: milliseconds): what it copied in
# READY_SLACK_SECONDS at the rate seen so far, READY_SLACK bytes at least.
# A busy guest seldom leaves the copy with nothing at all left at the
# moment it looks.
READY_SLACK = 2 ** 20
READY_SLACK_SECONDS = 0.25


class Cancelled(Exception):
    """The caller asked the adoption to stop (Ctrl-C, SIGTERM)."""


class AdoptionFailed(Exception):
    """The copy failed or could not start; the guest is on its original
    disk, whole, and nothing is left over.
    """


class NotConverging(AdoptionFailed):
    """The copy did not come into step within its bounds (the guest writes
    faster than the copy's rate); it was undone: the guest is on its
    original disk, whole, and nothing is left over.
    """


@dataclasses.dataclass(frozen=True)
class CopyLimits:
    """When a copy that does not come into step is given up.

    ``stall``: seconds the bytes left to copy may go without a new low;
    ``factor``: the copy may copy this many times what it had to copy at
    its start (at ``rate``, its ``--max-rate``, that takes ``factor *
    size / rate`` seconds; slower storage only makes it longer, never
    gives it up). ``clock`` is time.monotonic but in tests.
    """
    stall: float = STALL_TIMEOUT
    rate: int | None = None
    factor: float = COPY_FACTOR
    clock: object = time.monotonic
    burst: int = MIRROR_BURST

    def work(self, to_copy):
        """Bytes the copy may copy in all, ``to_copy`` at its start."""
        return self.factor * max(to_copy, READY_SLACK)

    @property
    def quiet(self):
        """Seconds without a new low before the copy is given up: the
        stall time, plus the time a rate-limited copy waits after a burst
        (QEMU's mirror copies up to ``burst`` bytes at once, then sleeps
        until its rate is paid back: with --max-rate 0.1, 160 s).
        """
        return self.stall + (self.burst / self.rate if self.rate else 0)


@dataclasses.dataclass(frozen=True)
class Progress:
    dev: str
    copied: int
    total: int
    ready: bool


def _journal_file(path):
    # disk/journal.py's JournalFile, with this journal's names: those a
    # running fleet's adopt may have left.
    return journal_mod.JournalFile(path, JOURNAL_SUFFIX, '.tmp', mode=0o600)


def journal_path(path):
    return _journal_file(path).path


def read_journal(path):
    """The journal's record for the disk at ``path``, or None. A journal
    that does not parse or names another phase is reported as it is: the
    caller leaves such a disk alone (never guesses which file is the
    disk).
    """
    try:
        record = _journal_file(path).read()
        if record is not None and 'phase' not in record:
            raise journal_mod.Unreadable(path, json.dumps(record).encode())
    except journal_mod.Unreadable as exc:
        raise exception.PreallocError(
            reason='%s: adoption journal %r is unreadable: left as it is'
                   % (path, exc.data[:200]))
    if record is None:
        return None
    phase = record['phase']
    if phase not in PHASES:
        raise exception.PreallocError(
            reason='%s: adoption journal names phase %r, not one of %s: '
                   'left as it is' % (path, phase, ', '.join(PHASES)))
    return record


def _journal(path, phase, dev, paused=False, domain_id=None):
    # domain_id: the running domain's ID (one per QEMU process) when the
    # adoption paused it: a QEMU started later has another.
    _journal_file(path).write({'phase': phase, 'dev': dev, 'paused': paused,
                               'domain_id': domain_id})


def begin_offline(path):
    """Journal a stopped instance's offline rewrite of ``path``."""
    _journal(path, OFFLINE, None)


def end_offline(path):
    _end_journal(path)


def _end_journal(path):
    # A journal write killed before its rename leaves its temporary file.
    _journal_file(path).remove()
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


def held_by_qemu(path):
    """True when a QEMU holds the file at ``path`` open for writing (its
    image lock on the write-permission byte), False when none does, None
    when there is no such file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC |
                     os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise exception.PreallocError(
            reason='cannot open %s to read QEMU\'s image lock (%s): left '
                   'as it is' % (path, exc.strerror or exc))
    try:
        return fileops.ofd_lock_held(fd, fileops.QEMU_WRITER_BYTE)
    finally:
        os.close(fd)


def disk_sources(domain):
    """{target dev: source file} of the domain's file disks, as libvirt
    has them now (its live XML).
    """
    return {dev: path for dev, (path, _fmt) in disk_records(domain).items()}


def disk_records(domain):
    """{target dev: (source file, format)} of the domain's file disks, as
    libvirt has them now (its live XML): the format is the disk's
    ``<driver type>``, what nova told QEMU the file is (None without one).
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
        driver = disk.find('driver')
        found[target.get('dev')] = (
            source.get('file'), driver.get('type') if driver is not None
            else None)
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
    layout and preallocation (qcow2.make_overlay, checked), with the
    disk's permissions, flushed.
    """
    new = path + NEW_SUFFIX
    if os.path.lexists(new):
        fileops.remove(new)
    qcow2.make_overlay(new, virtual_size, backing, backing_fmt, plan,
                       timeout=timeout)
    try:
        # The disk's own permissions, whatever this process's umask: the
        # file stays readable to whom the disk was (recover reads QEMU's
        # lock through it after libvirt gives it to QEMU's user).
        os.chmod(new, stat.S_IMODE(os.stat(path).st_mode))
        fileops.sync(new)
    except BaseException:
        if os.path.lexists(new):
            fileops.remove(new)
        raise
    return new


def _inode(path):
    st = os.lstat(path)
    return st.st_dev, st.st_ino


def adopt_running(domain, dev, path, new, bandwidth=None, progress=None,
                  cancelled=lambda: False, reconnect=None, limits=None):
    """Put the guest of ``domain`` on ``new`` (make_target's) in place of
    the overlay at ``path`` (its disk ``dev``), as the module says.
    Returns the seconds the guest was paused. Raises Cancelled or
    AdoptionFailed with the guest on its original disk and ``new`` gone
    (NotConverging when the copy did not come into step within
    ``limits``, a CopyLimits: default STALL_TIMEOUT and the rate
    ``bandwidth``), or, past the pivot, AdoptionFailed saying what recover
    did.

    ``reconnect()``, when given, returns the domain again on a new
    connection (None when libvirt has it no more): the undo uses it when
    the connection died under the copy (libvirtd restarted; QEMU, the
    guest and the copy ran on).
    """
    orig = path + ORIG_SUFFIX
    if limits is None:
        limits = CopyLimits(rate=bandwidth)
    why = None
    if os.path.lexists(orig) or os.path.lexists(journal_path(path)):
        why = ('a killed adoption left its files there; run prealloc-backend '
               'adopt again to recover them')
    elif domain.info()[0] != DOMAIN_RUNNING:
        why = 'the guest is not running (libvirt state %d)' % domain.info()[0]
    elif disk_sources(domain).get(dev) != path:
        why = 'it is not the disk %s of the domain' % dev
    elif held_by_qemu(path) is not True:
        # Which file QEMU runs on is read from its image locks (recover):
        # without them (file.locking=off, a filesystem without OFD locks)
        # nothing could tell after a crash.
        why = ('QEMU holds no image lock on it (image locking off?): the '
               'adoption reads which file QEMU runs on from those locks')
    if why:
        fileops.remove(new)
        raise AdoptionFailed('%s: %s: left as it is' % (path, why))
    target = _inode(new)
    _journal(path, SWAPPED, dev)
    try:
        _swap(path, new, orig)
        stopping.pause_point('adopt swapped')
        flags = (BLOCK_COPY_SHALLOW | BLOCK_COPY_REUSE_EXT |
                 BLOCK_COPY_TRANSIENT_JOB)
        params = {'bandwidth': int(bandwidth)} if bandwidth else {}
        dest = ("<disk type='file'><source file=%s/><driver type='qcow2'/>"
                "</disk>" % _quote(path))
        if _inode(path) != target:
            raise AdoptionFailed('%s was replaced before the copy' % path)
        domain.blockCopy(dev, dest, params, flags)
        if _inode(path) != target:
            raise AdoptionFailed('%s was replaced when the copy started'
                                 % path)
        _wait_ready(domain, dev, progress, cancelled, limits)
        paused = _pause_and_pivot(domain, dev, path)
    except BaseException as exc:
        try:
            domain, lost = _connected(domain, reconnect)
            done = recover(domain, path)
            resumed = _resume_after_io_error(domain)
        except Exception as undo_exc:
            LOG.exception('%s: could not finish or undo the adoption; the '
                          'journal stays for prealloc-backend adopt to '
                          'recover', path)
            if _journal_says_paused(path):
                raise AdoptionFailed(
                    '%s: could not finish or undo the adoption (%s, then '
                    '%s): the guest stays PAUSED until the next '
                    'prealloc-backend adopt or nova-compute\'s start '
                    'recovers it' % (path, exc, undo_exc)) from exc
            if isinstance(exc, (Cancelled, NotConverging)):
                # Not "undone": what is left beside the disk is for the
                # next run to recover.
                raise AdoptionFailed(
                    '%s: %s, and the copy could not be undone (%s): it is '
                    'left beside the disk for the next prealloc-backend '
                    'adopt or nova-compute\'s start to recover'
                    % (path, 'cancelled' if isinstance(exc, Cancelled)
                       else exc, undo_exc)) from exc
            raise exc
        if lost and isinstance(exc, Exception) and \
                not isinstance(exc, Cancelled):
            exc = AdoptionFailed('libvirtd\'s connection was lost during '
                                 'the copy (libvirtd restarted?), opened '
                                 'again: %s' % exc)
        if done and done.startswith(PIVOT_DONE):
            raise AdoptionFailed('%s: %s, after: %s' % (path, done, exc))
        if isinstance(exc, (Cancelled, KeyboardInterrupt)):
            raise
        if isinstance(exc, NotConverging):
            raise NotConverging('%s: %s; the copy was undone, the guest '
                                'stays on its original disk%s'
                                % (path, exc, resumed)) from exc
        if isinstance(exc, Exception):
            raise AdoptionFailed('%s: the copy failed, the guest stays on '
                                 'its original disk%s: %s' % (
                                     path, resumed, exc))
        raise
    try:
        domain_resumed = _resume_ours(domain, path)
    except Exception as exc:
        domain, domain_resumed = _resume_after_loss(domain, path, reconnect,
                                                    exc)
    fileops.remove(orig)
    _end_journal(path)
    if not domain_resumed:
        raise AdoptionFailed('%s: adopted, but the guest is not running '
                             'after its resume' % path)
    return paused


def _connected(domain, reconnect):
    """(domain, lost): ``domain`` when its connection still answers, else
    (``reconnect()``'s, True). libvirtd restarted: its clients'
    connections are dead, while QEMU (and the copy in it) runs on. Raises
    when libvirt answers again without the domain (recover would have to
    act on the journal alone, without QEMU's locks: left for the next run,
    which leaves a disk of no domain of this host alone).
    """
    if reconnect is None:
        return domain, False
    try:
        domain.connect().getLibVersion()
        return domain, False
    except Exception:
        LOG.warning('the libvirt connection is lost (libvirtd restarted?): '
                    'opening it again')
    fresh = reconnect()
    if fresh is None:
        raise exception.PreallocError(
            reason='libvirtd answers again but has no such domain')
    return fresh, True


def _journal_says_paused(path):
    try:
        record = read_journal(path)
    except exception.PreallocError:
        return False
    return bool(record and record.get('paused'))


def _resume_after_loss(domain, path, reconnect, exc):
    """After the pivot and ``pivoted``, the resume failed (libvirtd
    restarted): recover, through a new connection, keeps the new file and
    resumes the guest. (domain, running after it).
    """
    try:
        domain, lost = _connected(domain, reconnect)
        if not lost:
            raise exc
        recover(domain, path)
        return domain, domain.info()[0] == DOMAIN_RUNNING
    except Exception:
        LOG.exception('%s: the guest could not be resumed after the pivot',
                      path)
        raise AdoptionFailed(
            '%s: pivoted onto the new file, but the guest could not be '
            'resumed (%s): it stays PAUSED until the next prealloc-backend '
            'adopt or nova-compute\'s start finishes the adoption'
            % (path, exc)) from exc


def _resume_after_io_error(domain):
    """Resume a guest QEMU paused on an I/O error while the copy ran (its
    own writes found the filesystem full while the copy's target took
    room, now given back); '' when it runs, else what was done, in words.
    """
    try:
        state, reason = domain.state()
    except Exception:
        return ''
    if state != DOMAIN_PAUSED or reason != PAUSED_IOERROR:
        return ''
    domain.resume()
    return (' (QEMU had paused it on an I/O error during the copy, a full '
            'filesystem: resumed once the copy\'s file was removed)')


def _quote(value):
    from xml.sax import saxutils
    return saxutils.quoteattr(value)


def _wait_ready(domain, dev, progress, cancelled, limits):
    """Until the copy is in step with at most what it copies in
    READY_SLACK_SECONDS left, READY_SLACK bytes at least (the guest is then
    paused for its pivot, the rest copied unthrottled: milliseconds).
    Raises NotConverging when the bytes left have made no new low for
    ``limits.quiet`` seconds, or the copy has copied ``limits.factor``
    times what it had to copy when it started without coming into step
    (limits.work): a guest writing faster than the copy's rate would keep
    it (and the host's adopt lock, and ``--all``'s next instances) waiting
    for ever. Looks before the copy has moved (QEMU sizes the job first:
    libvirt shows 0 of 0, or of 1) count for the stall's time, never as a
    low or as the size to copy.
    """
    clock = limits.clock
    start = clock()
    lowest, low_at, work = None, start, None
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
        now = clock()
        copied, left = job['cur'], job['end'] - job['cur']
        slack = max(READY_SLACK, int(READY_SLACK_SECONDS * copied /
                                     max(now - start, POLL)))
        if ready and left <= slack:
            # In step: what is left is copied with the guest paused, the
            # rate limit lifted (_pause_and_pivot).
            return
        if copied > 0:
            if work is None:
                # What it had to copy at its start, once QEMU sized it.
                work = limits.work(job['end'])
            if lowest is None or left < lowest:
                lowest, low_at = left, now
        stalled = now - low_at > limits.quiet
        if stalled or (work is not None and copied > work):
            raise NotConverging(
                'the block copy of %s did not come into step: %s, %.1f MiB '
                'still to copy after %d s (%s): the guest writes faster '
                'than the copy; run adopt again with a higher --max-rate '
                'or at a quieter time'
                % (dev, 'no new low of the bytes left for %d s'
                   % limits.quiet if stalled else
                   'it copied %.1f MiB, %g times what it had to copy at '
                   'its start' % (copied / 2 ** 20, limits.factor),
                   left / 2 ** 20, now - start,
                   'at %.2f MiB/s' % (limits.rate / 2 ** 20)
                   if limits.rate else 'no --max-rate'))
        time.sleep(POLL)


def _pause_and_pivot(domain, dev, path):
    """Steps 3 and 4 of the module; the seconds the guest was paused."""
    # Said before the pause: a kill from here on leaves a guest recover
    # resumes.
    domain_id = domain.ID()
    _journal(path, SWAPPED, dev, paused=True, domain_id=domain_id)
    # The rate limit would slow the last bytes while the guest waits.
    domain.blockJobSetSpeed(dev, 0, 0)
    start = time.monotonic()
    domain.suspend()
    stopping.pause_point('adopt paused')
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
    domain.blockJobAbort(dev, BLOCK_JOB_ABORT_PIVOT)
    if held_by_qemu(path + ORIG_SUFFIX) or not held_by_qemu(path):
        raise AdoptionFailed('after the pivot of %s, QEMU does not hold '
                             'the new file alone' % dev)
    # QEMU flushed the new file completing the copy; flushed again here,
    # then the directory, before the journal says it is the disk.
    fileops.sync(path)
    fileops.fsync_dir(os.path.dirname(path))
    _journal(path, PIVOTED, dev, paused=True, domain_id=domain_id)
    stopping.pause_point('adopt pivoted')
    return time.monotonic() - start


def _resume_ours(domain, path):
    """Resume the guest if the journal says the adoption paused it and
    libvirt says it is paused by a user (not on an I/O error). True when
    it runs afterwards.
    """
    record = read_journal(path)
    if record and record.get('paused') and \
            record.get('domain_id') == domain.ID():
        state, reason = domain.state()
        if state == DOMAIN_PAUSED and reason == PAUSED_USER:
            domain.resume()
    return domain.info()[0] == DOMAIN_RUNNING


PIVOT_DONE = 'pivot completed'


def recover(domain, path):
    """Finish or undo an adoption a kill, a power cut or a failure
    interrupted, as the module says, from the journal beside ``path`` and
    the image locks QEMU holds. ``domain`` is the instance's libvirt
    domain (None when this host does not define it: then only a journal
    of a guest that cannot run here is acted on). Returns what was done,
    in words, or None when there was nothing to do. Raises PreallocError
    when it cannot tell which file is the disk (nothing touched then).
    """
    record = read_journal(path)
    new = path + NEW_SUFFIX
    orig = path + ORIG_SUFFIX
    if record is None:
        # A journal write killed before its rename leaves its temporary
        # file: never a journal, whatever else is left.
        tmp_journal = _journal_file(path).remove_partial()
        if os.path.lexists(new):
            # Made, never swapped in (the journal is written before the
            # swap): a kill while making it.
            fileops.remove(new)
            return 'removed %s (a target never used)' % new
        if tmp_journal:
            return ('removed %s (a journal never written)'
                    % _journal_file(path).tmp)
        return None
    phase = record['phase']
    if phase == OFFLINE:
        fileops.remove(path + journal_mod.TMP_SUFFIX)
        _end_journal(path)
        return 'removed what an offline rewrite left; %s as it was' % path
    dev = record.get('dev')
    active = domain is not None and domain.isActive()
    if not os.path.lexists(orig):
        # Killed before the first rename (swapped: the disk's name is still
        # the original), or after the original's removal (pivoted).
        if phase == PIVOTED:
            return _keep_new(domain, path, record, active)
        return _undo(domain, path, active)
    if not active:
        # No QEMU of this host runs the guest (its domain is this host's):
        # the journal decides.
        if phase == PIVOTED:
            return _keep_new(domain, path, record, active)
        return _undo(domain, path, active)
    if disk_sources(domain).get(dev) != path:
        raise exception.PreallocError(
            reason='%s: its adoption journal names disk %r, which the '
                   'domain does not have at this path: left as it is'
                   % (path, dev))
    if _job(domain, dev) is not None:
        # A copy still runs: never pivoted.
        _abort_job(domain, dev)
    on_orig = held_by_qemu(orig)
    on_new = held_by_qemu(path)
    if on_orig and not on_new:
        return _undo(domain, path, active)
    if on_new and not on_orig:
        # A pivot happened if the journal says so, or if the adoption had
        # paused this very QEMU (a pivot comes only then); a QEMU started
        # since, from the disk's name, is another.
        if phase == PIVOTED or (record.get('paused') and
                                record.get('domain_id') == domain.ID()):
            return _keep_new(domain, path, record, active)
        raise exception.PreallocError(
            reason='%s: a QEMU runs on %s while the journal says the '
                   'original file %s is the disk (started from the disk\'s '
                   'name after a crash?): left as it is'
                   % (path, path, orig))
    raise exception.PreallocError(
        reason='%s: the domain runs but QEMU\'s image locks show %s: left '
               'as it is' % (path, 'both files held' if on_orig else
                             'neither file held (image locking off?)'))


def _keep_new(domain, path, record, active):
    """The new file is the disk: flushed, said in the journal, the
    original removed, the guest resumed if the adoption paused it.
    """
    fileops.sync(path)
    fileops.fsync_dir(os.path.dirname(path))
    if record['phase'] != PIVOTED:
        _journal(path, PIVOTED, record.get('dev'),
                 paused=record.get('paused', False),
                 domain_id=record.get('domain_id'))
    fileops.remove(path + ORIG_SUFFIX)
    resumed = active and _resume_ours(domain, path)
    _end_journal(path)
    return '%s: %s is the preallocated disk%s' % (
        PIVOT_DONE, path, ', the guest resumed' if resumed else '')


def _undo(domain, path, active):
    """The original file is the disk: its name back, the copy removed,
    the guest resumed if the adoption paused it.
    """
    _unswap(path, path + ORIG_SUFFIX)
    fileops.remove(path + NEW_SUFFIX)
    resumed = active and _resume_ours(domain, path)
    _end_journal(path)
    return 'copy undone: the guest keeps its original disk %s%s' % (
        path, ', resumed' if resumed else '')
