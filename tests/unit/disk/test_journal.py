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

"""prealloc_backend/disk/journal.py: the crash journal beside a disk being made
(recovery through nova's spawns is in test_faults.py).
"""

import json
import os
import subprocess

from unittest import mock

import fixtures
from oslo_utils import units

from prealloc_backend.disk import formats
from prealloc_backend.disk import journal
from prealloc_backend.system import fileops
from tests import base
from tests import fixtures as pb_fixtures


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


class JournalFileTestCase(base.TestCase):
    """The one journal file both journals are (the disk operation's and
    adoption's, adoption/live.py).
    """

    def setUp(self):
        super().setUp()
        self.disk = os.path.join(self.instances_path, 'disk')
        self.file = journal.JournalFile(self.disk, '.j', '.w', mode=0o600)

    def test_written_whole_read_back_removed(self):
        self.assertIsNone(self.file.read())
        self.file.write({'phase': 'x'})
        self.assertEqual(['disk.j'], os.listdir(self.instances_path))
        self.assertEqual(0o600, os.stat(self.disk + '.j').st_mode & 0o777)
        record = self.file.read()
        self.assertEqual(('x', os.getpid()),
                         (record['phase'], record['pid']))
        self.assertIsInstance(record['time'], float)
        with open(self.disk + '.j.w', 'w') as f:
            f.write('{"pha')
        self.assertTrue(self.file.remove())
        self.assertEqual([], os.listdir(self.instances_path))
        self.assertFalse(self.file.remove())

    def test_unreadable_is_said_with_what_it_holds(self):
        for text in ('{"pha', '[1]', '"x"', '[' * 100000, ''):
            with open(self.disk + '.j', 'w') as f:
                f.write(text)
            exc = self.assertRaises(journal.Unreadable, self.file.read)
            self.assertEqual(text.encode()[:10], exc.data[:10])

    def test_a_write_cut_before_its_rename_is_no_journal(self):
        with open(self.disk + '.j.w', 'w') as f:
            f.write('{"pha')
        self.assertIsNone(self.file.read())
        self.assertTrue(self.file.remove_partial())
        self.assertEqual([], os.listdir(self.instances_path))

    def test_journals_the_old_code_wrote_are_recovered(self):
        # Bytes Journal wrote before JournalFile (the same format): a
        # creation cut short, and a growth, each recovered.
        made = self.disk
        with open(made, 'wb') as f:
            f.write(b'half')
        with open(made + journal.JOURNAL_SUFFIX, 'w') as f:
            f.write('{"created": true, "pid": 4242, '
                    '"time": 1764403200.5}')
        journal.Journal(made).recover()
        self.assertEqual([], os.listdir(self.instances_path))
        with open(made, 'wb') as f:
            f.write(b'guest')
        with open(made + journal.JOURNAL_SUFFIX, 'w') as f:
            f.write('{"created": false, "pid": 4242, '
                    '"time": 1764403200.5}')
        journal.Journal(made).recover()
        self.assertEqual(['disk'], os.listdir(self.instances_path))


class ReconcileTestCase(base.TestCase):
    """A raw disk's conversion to qcow2 interrupted at each phase
    (qcow2.convert_raw; every crash point: tests/crash).
    """

    def setUp(self):
        super().setUp()
        self.dir = os.path.join(self.instances_path, 'r')
        os.mkdir(self.dir)
        self.disk = os.path.join(self.dir, 'disk')
        self.info = os.path.join(self.dir, 'disk.info')
        with open(self.disk, 'wb') as f:
            f.write(b'QFI\xfb guest data')
        formats.record_format(self.disk, 'raw')
        self.useFixture(fixtures.MockPatchObject(journal, 'PROCESS', 'now'))

    def journal(self, phase, process='crashed'):
        with open(self.disk + journal.JOURNAL_SUFFIX, 'w') as f:
            json.dump({'created': False, 'phase': phase,
                       'process': process}, f)

    def assert_reconciled(self, fmt):
        self.assertEqual(fmt, formats.disk_info_format(self.info, self.disk))
        self.assertEqual(['disk', 'disk.info'], sorted(os.listdir(self.dir)))

    def test_converting_with_the_new_file_aside_is_rolled_back(self):
        # Whatever the disk's header says (its guest wrote a qcow2 magic).
        self.journal(journal.CONVERTING)
        with open(self.disk + journal.CONVERT_SUFFIX, 'wb') as f:
            f.write(b'QFI\xfb new')
        self.assertEqual('raw', journal.Journal(self.disk).reconcile())
        self.assert_reconciled('raw')

    def test_a_crash_inside_the_rollback_leaves_the_disk_raw(self):
        # Killed right after the rollback's first removal: the next
        # reconcile must still read a raw disk (removing the new file
        # first, then the journal, left 'converting' without the file,
        # which reads as published: qcow2 recorded over a raw disk).
        self.journal(journal.CONVERTING)
        with open(self.disk + journal.CONVERT_SUFFIX, 'wb') as f:
            f.write(b'QFI\xfb new')
        remove = fileops.remove

        def killed_after_one(path):
            if remove(path):
                raise SystemExit('killed')
            return False

        with mock.patch.object(fileops, 'remove', killed_after_one):
            self.assertRaises(SystemExit,
                              journal.Journal(self.disk).reconcile)
        journal.Journal(self.disk).reconcile()
        self.assertEqual('raw', formats.disk_info_format(self.info,
                                                         self.disk))
        journal.Journal(self.disk).recover()
        self.assert_reconciled('raw')

    def test_a_crash_inside_the_finish_records_qcow2_again(self):
        self.journal(journal.CONVERTING)
        with mock.patch.object(fileops, 'remove',
                               side_effect=SystemExit('killed')):
            self.assertRaises(SystemExit,
                              journal.Journal(self.disk).reconcile)
        self.assertEqual('qcow2', formats.disk_info_format(self.info,
                                                           self.disk))
        self.assertEqual('qcow2', journal.Journal(self.disk).reconcile())
        self.assert_reconciled('qcow2')

    def test_converting_once_renamed_is_finished(self):
        self.journal(journal.CONVERTING)
        self.assertEqual('qcow2', journal.Journal(self.disk).reconcile())
        self.assert_reconciled('qcow2')

    def test_ready_is_finished_by_recover_too(self):
        self.journal(journal.READY)
        # The format it finished, for a migration's record (backend.py).
        self.assertEqual('qcow2', journal.Journal(self.disk).recover())
        self.assert_reconciled('qcow2')

    def test_a_conversion_of_this_process_is_left_alone(self):
        self.journal(journal.READY, process='now')
        self.assertIsNone(journal.Journal(self.disk).reconcile())
        self.assertEqual('raw', formats.disk_info_format(self.info,
                                                         self.disk))

    def test_recover_keeps_a_conversion_of_this_process(self):
        # another thread's cache() while this process converts the disk
        self.journal(journal.READY, process='now')
        journal.Journal(self.disk).recover()
        self.assertTrue(os.path.exists(self.disk + journal.JOURNAL_SUFFIX))
        self.assertEqual('raw', formats.disk_info_format(self.info,
                                                         self.disk))

    def test_no_conversion_nothing_done(self):
        journal.Journal(self.disk).begin(False)
        self.assertIsNone(journal.Journal(self.disk).reconcile())
        self.assertTrue(os.path.exists(self.disk + journal.JOURNAL_SUFFIX))


class GrowthTestCase(base.TestCase):
    """A qcow2 growth a crash cut (qcow2.grow; every crash point:
    tests/crash): the disk kept, what the growth left freed.
    """

    def setUp(self):
        super().setUp()
        self.disk = os.path.join(self.instances_path, 'disk')
        subprocess.run(['qemu-img', 'create', '-f', 'qcow2', '-o',
                        'preallocation=metadata', self.disk,
                        str(4 * units.Mi)], check=True, capture_output=True)
        subprocess.run(['qemu-io', '-f', 'qcow2', '-c', 'write -P 7 0 64k',
                        self.disk], check=True, capture_output=True)
        self.length = os.stat(self.disk).st_size

    def grow(self):
        return subprocess.run(['qemu-img', 'resize', '-f', 'qcow2',
                               '--preallocation=falloc', self.disk,
                               str(8 * units.Mi)], capture_output=True)

    def test_cut_after_its_first_refcount_write_is_mended(self):
        journal.Journal(self.disk).growing(self.length)
        pb_fixtures.count_past_end(self.disk)
        journal.Journal(self.disk).recover()
        self.assertFalse(os.path.exists(self.disk + journal.JOURNAL_SUFFIX))
        self.assertEqual(self.length, os.stat(self.disk).st_size)
        self.assertEqual(0, self.grow().returncode)

    def test_cut_later_is_cut_back_to_its_length(self):
        journal.Journal(self.disk).growing(self.length)
        pb_fixtures.count_past_end(self.disk)
        with open(self.disk, 'ab') as f:
            f.write(b'\0' * 65536)
        journal.Journal(self.disk).recover()
        self.assertEqual(self.length, os.stat(self.disk).st_size)
        subprocess.run(['qemu-img', 'check', '-f', 'qcow2', self.disk],
                       check=True, capture_output=True)

    def test_a_disk_that_cannot_be_mended_is_kept(self):
        journal.Journal(self.disk).growing(self.length)
        with open(self.disk, 'r+b') as f:
            f.write(b'nope')
        journal.Journal(self.disk).recover()
        self.assertTrue(os.path.exists(self.disk))
        self.assertFalse(os.path.exists(self.disk + journal.JOURNAL_SUFFIX))
