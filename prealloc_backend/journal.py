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

"""The crash journal: a small file beside a disk while it is being made.

Split out of backend.py (one concern per module): the nova adapter begins
and ends a journal around each cache() call; recover() runs first.
"""

import json
import os
import time

from oslo_log import log as logging
from oslo_utils import fileutils

LOG = logging.getLogger(__name__)

# Beside a disk while the plugin makes or grows it; see Journal.
JOURNAL_SUFFIX = '.prealloc-journal'
# A qcow2 overlay is created under this name and renamed when complete.
TMP_SUFFIX = '.prealloc-tmp'


class Journal:
    """A small JSON file beside a disk while the plugin makes or grows it.

    It records whether the disk existed before. If nova-compute dies (or the
    work is killed) before the journal is removed, the next attempt on the
    same disk finds it: a disk this plugin was *creating* is removed (it may
    be half-made), a disk that existed before is kept (its data is intact;
    the allocation is simply done again).
    """

    def __init__(self, path):
        self.disk = path
        self.path = path + JOURNAL_SUFFIX

    def recover(self):
        fileutils.delete_if_exists(self.path + '.part')
        if not os.path.exists(self.path):
            fileutils.delete_if_exists(self.disk + TMP_SUFFIX)
            return
        try:
            with open(self.path) as f:
                created = bool(json.load(f).get('created'))
        except (OSError, ValueError, AttributeError):
            # NOTE: begin() completes (written, fsynced, renamed) before
            # the work on the disk starts, so an unreadable journal means a
            # crash inside begin(): whatever disk is there was not made by
            # this plugin (it may hold a guest's data). Keep it.
            LOG.warning('Unreadable journal %(journal)s: keeping %(disk)s',
                        {'journal': self.path, 'disk': self.disk})
            created = False
        if created and os.path.exists(self.disk):
            LOG.warning('Removing %(disk)s: its creation was interrupted '
                        '(journal %(journal)s found); it will be created '
                        'again', {'disk': self.disk, 'journal': self.path})
            fileutils.delete_if_exists(self.disk)
        fileutils.delete_if_exists(self.disk + TMP_SUFFIX)
        fileutils.delete_if_exists(self.path)

    def begin(self, created):
        # Written aside and renamed: a journal is complete or absent.
        partial = self.path + '.part'
        with open(partial, 'w') as f:
            json.dump({'created': created, 'pid': os.getpid(),
                       'time': time.time()}, f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(partial, self.path)
        directory = os.open(os.path.dirname(self.path) or '.', os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def end(self):
        fileutils.delete_if_exists(self.path)
