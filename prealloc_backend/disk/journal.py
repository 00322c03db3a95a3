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

"""The crash journals: small files beside a disk while it is being made.

``JournalFile`` is the one implementation of such a file: a JSON object
beside the disk, written aside, flushed and renamed into place (complete
or absent, before and after a power cut), read back tolerantly, removed
durably. Two journals use it, each with its own names and phases, which a
running fleet may have left and which are read as they were always
written:

* ``Journal`` (``<disk>.prealloc-journal``, written through ``.part``): the
  disk operation's, around each cache() call (recover() runs first), a
  qcow2 growth and a raw disk's conversion to qcow2;
* adoption's (``<disk>.prealloc-adopt``, written through ``.tmp``, mode
  0600): adoption/live.py's phases of an overlay replaced under a running
  guest, or rewritten offline.
"""

import json
import os
import time
import uuid

from oslo_log import log as logging

from prealloc_backend.disk import formats
from prealloc_backend.disk import refcount
from prealloc_backend import exception
from prealloc_backend.system import fileops

LOG = logging.getLogger(__name__)

# Beside a disk while the plugin makes or grows it; see Journal.
JOURNAL_SUFFIX = '.prealloc-journal'
# A qcow2 overlay is created under this name and renamed when complete.
TMP_SUFFIX = '.prealloc-tmp'
# A raw disk converted to qcow2 is written under this name (nova's).
CONVERT_SUFFIX = '_qcow'
# The phases of a raw disk's conversion to qcow2 (qcow2.convert_raw):
# 'converting' is recorded once the new file is complete and flushed,
# before the rename that publishes it; 'ready' once that rename is on
# the device, before disk.info is rewritten.
CONVERTING = 'converting'
READY = 'ready'
# A qcow2 disk's growth (qcow2.grow), with the file's length before it:
# recover() frees what a growth cut short left (refcount.mend) and cuts
# the file back, keeping the disk.
GROWING = 'growing'
# This process's mark in a conversion's journal: reconcile() leaves a
# conversion this same process may still be carrying out (another thread
# resolving the disk's format meanwhile) to that process. A crash ends the
# process, so a journal left by a crash always bears another mark.
PROCESS = uuid.uuid4().hex


# How much of a journal is read: the records are a few hundred bytes.
READ_LIMIT = 64 * 1024


class Unreadable(Exception):
    """A journal that exists but holds no JSON object; ``data`` is what it
    holds (its first READ_LIMIT bytes).
    """

    def __init__(self, path, data):
        super().__init__('%s: %r' % (path, data[:200]))
        self.path = path
        self.data = data


class JournalFile:
    """The journal file ``disk + suffix``, written through ``path +
    tmp_suffix`` with ``mode``.
    """

    def __init__(self, disk, suffix, tmp_suffix, mode=0o644):
        self.disk = disk
        self.path = disk + suffix
        self.tmp = self.path + tmp_suffix
        self.mode = mode

    def read(self):
        """The journal's record (a dict), None when there is no journal;
        Unreadable when it holds no JSON object (or cannot be read).
        """
        try:
            with open(self.path, 'rb') as f:
                data = f.read(READ_LIMIT)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise Unreadable(self.path, str(exc).encode())
        try:
            record = json.loads(data)
        except (ValueError, RecursionError):
            raise Unreadable(self.path, data)
        if not isinstance(record, dict):
            raise Unreadable(self.path, data)
        return record

    def write(self, record):
        """Replace the journal with ``record`` (a dict), this process's ID
        and the time added. Written aside, flushed and renamed, the
        directory flushed: a journal is complete or absent, before and
        after a power cut.
        """
        record = dict(record, pid=os.getpid(), time=time.time())
        fileops.write_file(self.path, json.dumps(record), mode=self.mode,
                           suffix=self.tmp[len(self.path):])

    def remove(self):
        """Remove the journal durably, a write's leftover first. True when
        the journal existed.
        """
        fileops.remove(self.tmp)
        return fileops.remove(self.path)

    def remove_partial(self):
        """Remove what a write killed before its rename left (never a
        journal: the old one, or none, stands). True when there was one.
        """
        return fileops.remove(self.tmp)


class Journal:
    """A small JSON file beside a disk while the plugin makes or grows it.

    It records whether the disk existed before. If nova-compute dies (or the
    work is killed) before the journal is removed, the next attempt on the
    same disk finds it: a disk this plugin was *creating* is removed (it may
    be half-made), a disk that existed before is kept (its data is intact;
    the allocation is simply done again; a qcow2 growth cut short is
    mended first, see GROWING).

    Every removal is ordered so that a crash inside it leaves a state the
    next recovery reads right: what the journal describes goes before the
    journal, except a conversion's new file, which goes after it (see
    reconcile()).
    """

    def __init__(self, path):
        self.disk = path
        self.file = JournalFile(path, JOURNAL_SUFFIX, '.part')
        self.path = self.file.path

    def _read(self):
        """The journal's record (a dict), None when there is none, or
        False when it is unreadable.
        """
        try:
            return self.file.read()
        except Unreadable:
            return False

    def reconcile(self):
        """Finish or roll back a raw disk's conversion to qcow2 that a
        crash interrupted (qcow2.convert_raw): the disk and disk.info end
        up agreeing. Called before the disk's format is read from its
        records (backend.resolve_driver_format) and by recover().

        'converting': the new file was complete and flushed; whether the
        rename published it is told by the temporary name, never by the
        disk's header (a guest may have written a qcow2 header into its
        raw disk): still there, the rename did not happen: it is removed
        and the disk stays raw. Gone: the disk is the new qcow2 file.
        'ready': the rename is on the device. Either way disk.info then
        says qcow2 and the journal is removed. Returns the format the disk
        has once it acted ('raw' rolled back, 'qcow2' finished), None when
        there was nothing to do: the caller updates a migration's record.
        """
        record = self._read()
        if (not record or record.get('phase') not in (CONVERTING, READY) or
                record.get('process') == PROCESS):
            return None
        tmp = self.disk + CONVERT_SUFFIX
        if record['phase'] == CONVERTING and os.path.exists(tmp):
            LOG.warning('%(disk)s: its conversion to qcow2 was interrupted '
                        'before the new file was published: it stays raw',
                        {'disk': self.disk})
            # The journal goes first, the new file after: a crash between
            # the two leaves the file without a journal (removed by the
            # next recover() as never published; disk.info still says
            # raw), never a 'converting' journal without the file, which
            # reads as published and would record the raw disk qcow2.
            self.discard()
            fileops.remove(tmp)
            return 'raw'
        LOG.warning('%(disk)s: its conversion to qcow2 was interrupted '
                    'after the new file was published: recorded qcow2',
                    {'disk': self.disk})
        # disk.info first, the journal after: a crash between the two
        # finds the journal again and records qcow2 again.
        formats.record_format(self.disk, 'qcow2')
        self.discard()
        return 'qcow2'

    def recover(self):
        """Recover from a crash before this disk's work starts: a
        conversion finished or rolled back (reconcile: its format returned,
        for a migration's record), a half-made disk removed. None when
        there was no conversion to reconcile.
        """
        fmt = self.reconcile()
        if fmt:
            return fmt
        record = self._read()
        if (record and record.get('phase') in (CONVERTING, READY) and
                record.get('process') == PROCESS):
            # A conversion this process is carrying out (qcow2.convert_raw
            # hands a failed one over without the mark): its journal is
            # what makes it recoverable, never removed here.
            LOG.warning('%(disk)s: its conversion to qcow2 is under way '
                        'in this process: left to it', {'disk': self.disk})
            return
        self.file.remove_partial()
        # A disk.info write a crash cut before its rename (the record
        # itself is whole: the old one).
        formats.remove_partial_record(self.disk)
        if not os.path.exists(self.path):
            fileops.remove(self.disk + TMP_SUFFIX)
            fileops.remove(self.disk + CONVERT_SUFFIX)
            return
        record = self._read()
        if record is False:
            # begin() completes (written, fsynced, renamed) before
            # the work on the disk starts, so an unreadable journal means a
            # crash inside begin(): whatever disk is there was not made by
            # this plugin (it may hold a guest's data). Keep it.
            LOG.warning('Unreadable journal %(journal)s: keeping %(disk)s',
                        {'journal': self.path, 'disk': self.disk})
            created = False
        else:
            created = bool((record or {}).get('created'))
        if created and os.path.exists(self.disk):
            LOG.warning('Removing %(disk)s: its creation was interrupted '
                        '(journal %(journal)s found); it will be created '
                        'again', {'disk': self.disk, 'journal': self.path})
            fileops.remove(self.disk)
        elif (record and record.get('phase') == GROWING and
                os.path.exists(self.disk)):
            self._mend(record.get('length'))
        fileops.remove(self.disk + TMP_SUFFIX)
        # A conversion's file (nova's, or qcow2.convert_raw's) that a crash
        # left before its journal said 'converting': never published.
        fileops.remove(self.disk + CONVERT_SUFFIX)
        # Last, once the removals above are on the device: a crash before
        # it finds the journal again and does the same.
        fileops.remove(self.path)

    def _mend(self, length):
        """A qcow2 growth a crash cut: the disk is the old one or the new
        one (qemu-img writes the new virtual size last); what the cut
        growth left (clusters counted past the file's end, leaked ones
        inside it) is freed and the file cut back to its ``length`` before
        the growth (refcount.mend), so that the next growth completes.
        A disk that cannot be mended is left as it is: the next growth
        mends it again before it starts, or refuses it.
        """
        if not isinstance(length, int) or isinstance(length, bool) or \
                length < 0:
            length = None
        LOG.warning('%(disk)s: its growth was interrupted (journal '
                    '%(journal)s found): the disk is kept; freeing what the '
                    'growth left', {'disk': self.disk, 'journal': self.path})
        try:
            refcount.mend(self.disk, length)
        except (exception.PreallocError, OSError) as exc:
            LOG.warning('%(disk)s: not mended (%(err)s): left as it is',
                        {'disk': self.disk, 'err': exc})

    def _write(self, record):
        self.file.write(record)

    def begin(self, created):
        self._write({'created': created})

    def growing(self, length):
        """Record a qcow2 growth of the disk, whose file is ``length``
        bytes long before it (see recover()).
        """
        self._write({'created': False, 'phase': GROWING, 'length': length})

    def phase(self, phase, mine=True):
        """Record a conversion's phase (CONVERTING, READY): see
        reconcile(). ``mine=False`` leaves out this process's mark, so
        that the next reconcile() in this process acts on it too.
        """
        record = {'created': False, 'phase': phase}
        if mine:
            record['process'] = PROCESS
        self._write(record)

    def discard(self):
        """Remove the journal durably, whatever it says."""
        self.file.remove()

    def end(self):
        """The work on the disk is done: the disk is flushed (whatever
        made or grew it: nova's copy and truncate, qemu-img, the daemon),
        then the journal removed durably. A journal that came back after
        a power cut would make the next cache() remove a disk it
        finished; a journal removed before the disk was flushed would
        leave a disk a power cut cut short.
        """
        if os.path.isfile(self.disk):
            fileops.sync(self.disk, denied_ok=True)
        fileops.remove(self.path)
