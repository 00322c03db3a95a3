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

"""prealloc_backend/journal.py: the crash journal beside a disk being made
(recovery through nova's spawns is in test_faults.py).
"""

import os

from prealloc_backend import journal
from tests import base


class JournalTestCase(base.TestCase):
    """The journal's own contract, on real files."""

    def test_created_disk_removed_existing_kept(self):
        directory = os.path.join(self.instances_path, 'j')
        os.mkdir(directory)
        made = os.path.join(directory, 'made')
        kept = os.path.join(directory, 'kept')
        for path, created in ((made, True), (kept, False)):
            with open(path, 'wb') as f:
                f.write(b'x' * 4096)
            journal.Journal(path).begin(created)
            with open(path + journal.TMP_SUFFIX, 'wb') as f:
                f.write(b'half')
        for path in (made, kept):
            journal.Journal(path).recover()
            for suffix in (journal.JOURNAL_SUFFIX, journal.TMP_SUFFIX):
                self.assertFalse(os.path.exists(path + suffix))
        self.assertFalse(os.path.exists(made))
        with open(kept, 'rb') as f:
            self.assertEqual(b'x' * 4096, f.read())
        with open(os.path.join(directory, 'unused'), 'wb'):
            pass
        self.assertEqual(['kept', 'unused'], sorted(os.listdir(directory)))
