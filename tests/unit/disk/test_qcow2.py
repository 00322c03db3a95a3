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

"""prealloc_backend.disk.qcow2: a disk's layout read, an overlay made, a disk
grown, an overlay re-laid out, a raw disk converted; real qemu-img on real
files, each result checked in the file (header, allocation, content).
"""

import errno
import logging
import os
import shutil
import subprocess
from unittest import mock

import fixtures
from oslo_utils import units

from prealloc_backend.disk import formats
from prealloc_backend.disk import journal
from prealloc_backend.disk import qcow2
from prealloc_backend import exception
from prealloc_backend.planner import diskplan
from prealloc_backend.planner import qcow2_layout
from prealloc_backend.system import fileops
from tests import base
from tests import fixtures as pb_fixtures

Prealloc = qcow2_layout.Qcow2Preallocation


def _plan(virtual_size, preallocation, cluster=64 * units.Ki,
          extended_l2=True):
    return diskplan.DiskPlan(
        mode=diskplan.Mode.SPACE, fmt=diskplan.DiskFormat.QCOW2,
        virtual_size=virtual_size, raw_action=None,
        preallocation=preallocation, cluster_size=cluster,
        extended_l2=extended_l2, needed_bytes=0, metadata_cache_bytes=None,
        warning=None)


class Qcow2TestCase(base.TestCase):

    def setUp(self):
        super().setUp()
        self.base = self.base_path('base')
        pb_fixtures.make_base(self.base, 'raw', 3 * units.Mi, seed=5)
        self.disk = os.path.join(self.instances_path, 'disk')

    def stock_overlay(self, size=8 * units.Mi):
        """nova's own overlay: no extended_l2, thin; guest data written."""
        subprocess.run(['qemu-img', 'create', '-f', 'qcow2', '-F', 'raw',
                        '-b', self.base, self.disk, str(size)], check=True,
                       capture_output=True)
        subprocess.run(['qemu-io', '-f', 'qcow2', '-c',
                        'write -P 0x6b 1M 64k', self.disk], check=True,
                       capture_output=True)


class TestExisting(Qcow2TestCase):

    def test_layout_as_qemu_img_reports_it(self):
        self.stock_overlay()
        existing, info = qcow2.existing(self.disk)
        self.assertEqual(8 * units.Mi, existing.virtual_size)
        self.assertEqual(64 * units.Ki, existing.cluster_size)
        self.assertFalse(existing.extended_l2)
        self.assertEqual(pb_fixtures.allocated(self.disk),
                         existing.allocated_bytes)
        self.assertEqual(self.base, info.backing_file)


class TestCreateOverlay(Qcow2TestCase):

    def test_space_overlay_allocated_and_renamed_into_place(self):
        size = 16 * units.Mi
        with mock.patch.object(fileops, 'drop_file_page_cache') as drop:
            qcow2.create_overlay(self.disk, size, self.base, 'raw',
                                 _plan(size, Prealloc.FALLOC))
        # Only preallocation=full writes zeros worth dropping.
        drop.assert_not_called()
        info = pb_fixtures.qemu_img_info(self.disk)
        self.assertTrue(info['format-specific']['data']['extended-l2'])
        self.assertGreaterEqual(pb_fixtures.allocated(self.disk), size)
        self.assertFalse(os.path.exists(self.disk + journal.TMP_SUFFIX))

    def test_full_overlay_s_zeros_leave_the_page_cache(self):
        # qemu-img writes mode full's zeros through the page cache; a guest
        # with cache=none would pay to invalidate them on its first writes.
        pb_fixtures.skip_unless_pages_drop(self, self.instances_path)
        size = 16 * units.Mi
        with mock.patch.object(fileops, 'drop_file_page_cache'):
            qcow2.create_overlay(self.disk, size, self.base, 'raw',
                                 _plan(size, Prealloc.FULL))
        # Without the drop, qemu-img's zeros stay cached (what the
        # assertion below would miss if cached_bytes saw nothing).
        self.assertGreater(pb_fixtures.cached_bytes(self.disk), size // 2)
        os.unlink(self.disk)
        qcow2.create_overlay(self.disk, size, self.base, 'raw',
                             _plan(size, Prealloc.FULL))
        self.assertGreaterEqual(pb_fixtures.allocated(self.disk), size)
        self.assertEqual(0, pb_fixtures.cached_bytes(self.disk))

    def test_failure_leaves_nothing(self):
        self.assertRaises(exception.QemuImgError, qcow2.create_overlay,
                          self.disk, units.Mi,
                          os.path.join(self.instances_path, 'absent'),
                          'raw', _plan(units.Mi, Prealloc.METADATA))
        self.assertFalse(os.path.exists(self.disk))
        self.assertFalse(os.path.exists(self.disk + journal.TMP_SUFFIX))


class TestGrow(Qcow2TestCase):

    def test_grown_with_the_new_area_preallocated(self):
        size = 16 * units.Mi
        qcow2.create_overlay(self.disk, 4 * units.Mi, self.base, 'raw',
                             _plan(4 * units.Mi, Prealloc.FALLOC))
        qcow2.grow(self.disk, 4 * units.Mi, _plan(size, Prealloc.FALLOC))
        self.assertEqual(size,
                         pb_fixtures.qemu_img_info(self.disk)['virtual-size'])
        self.assertGreaterEqual(pb_fixtures.allocated(self.disk), size)

    def test_grown_full_area_leaves_the_page_cache(self):
        pb_fixtures.skip_unless_pages_drop(self, self.instances_path)
        size = 16 * units.Mi
        qcow2.create_overlay(self.disk, 4 * units.Mi, self.base, 'raw',
                             _plan(4 * units.Mi, Prealloc.FULL))
        qcow2.grow(self.disk, 4 * units.Mi, _plan(size, Prealloc.FULL))
        self.assertGreaterEqual(pb_fixtures.allocated(self.disk), size)
        self.assertEqual(0, pb_fixtures.cached_bytes(self.disk))

    def test_a_growth_cut_short_before_is_mended_then_grown(self):
        # What a growth killed after its first refcount-block write left
        # (refcount.py): qemu-img's next preallocating growth aborts on it.
        qcow2.create_overlay(self.disk, 4 * units.Mi, self.base, 'raw',
                             _plan(4 * units.Mi, Prealloc.FALLOC))
        pb_fixtures.count_past_end(self.disk)
        journal.Journal(self.disk).begin(False)
        qcow2.grow(self.disk, 4 * units.Mi,
                   _plan(16 * units.Mi, Prealloc.FALLOC))
        self.assertEqual(16 * units.Mi,
                         pb_fixtures.qemu_img_info(self.disk)['virtual-size'])
        subprocess.run(['qemu-img', 'check', '-f', 'qcow2', self.disk],
                       check=True, capture_output=True)
        # The journal says what the growth was, for a crash's recovery.
        with open(self.disk + journal.JOURNAL_SUFFIX) as f:
            self.assertIn('"phase": "growing"', f.read())

    def test_a_failed_growth_is_mended_at_once(self):
        qcow2.create_overlay(self.disk, 4 * units.Mi, self.base, 'raw',
                             _plan(4 * units.Mi, Prealloc.FALLOC))
        length = os.stat(self.disk).st_size

        def killed(path, *args, **kwargs):
            # qemu-img killed (a timeout) after its first refcount write
            pb_fixtures.count_past_end(path)
            raise exception.AllocationTimeout(path=path, timeout=1)

        with mock.patch.object(qcow2.qemu, 'resize', killed):
            self.assertRaises(exception.AllocationTimeout, qcow2.grow,
                              self.disk, 4 * units.Mi,
                              _plan(16 * units.Mi, Prealloc.FALLOC))
        self.assertEqual(length, os.stat(self.disk).st_size)
        qcow2.qemu.resize(self.disk, 'qcow2', 16 * units.Mi,
                          Prealloc.FALLOC)


class TestRelayoutOverlay(Qcow2TestCase):

    def test_rewritten_with_the_plan_s_layout_same_content(self):
        self.stock_overlay()
        before = pb_fixtures.guest_sha(self.disk)
        done = qcow2.relayout_overlay(
            self.disk, self.base, 'raw',
            _plan(8 * units.Mi, Prealloc.FALLOC, cluster=128 * units.Ki))
        self.assertTrue(done)
        info = pb_fixtures.qemu_img_info(self.disk)
        self.assertTrue(info['format-specific']['data']['extended-l2'])
        self.assertEqual(128 * units.Ki, info['cluster-size'])
        self.assertEqual(self.base, info['backing-filename'])
        self.assertEqual(before, pb_fixtures.guest_sha(self.disk))
        # preallocation=falloc: the whole disk reserved.
        self.assertGreaterEqual(pb_fixtures.allocated(self.disk),
                                8 * units.Mi)
        self.assertFalse(os.path.exists(self.disk + journal.TMP_SUFFIX))

    def test_full_rewrite_leaves_the_page_cache(self):
        pb_fixtures.skip_unless_pages_drop(self, self.instances_path)
        self.stock_overlay()
        self.assertTrue(qcow2.relayout_overlay(
            self.disk, self.base, 'raw',
            _plan(8 * units.Mi, Prealloc.FULL, cluster=128 * units.Ki)))
        self.assertEqual(0, pb_fixtures.cached_bytes(self.disk))

    def test_comma_in_a_name_leaves_it_as_it_is(self):
        self.stock_overlay()
        logs = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        before = pb_fixtures.sha256_of(self.disk)
        self.assertFalse(qcow2.relayout_overlay(
            self.disk, self.base + ',x', 'raw',
            _plan(8 * units.Mi, Prealloc.FALLOC)))
        self.assertEqual(before, pb_fixtures.sha256_of(self.disk))
        self.assertIn('has a comma', logs.output)

    def test_failed_convert_keeps_the_disk(self):
        self.stock_overlay()
        before = pb_fixtures.sha256_of(self.disk)
        # A backing file of another content: qemu-img compare refuses the
        # rewrite (what the guest reads would change).
        other = self.base_path('other')
        pb_fixtures.make_base(other, 'raw', 3 * units.Mi, seed=6)
        self.assertRaises(exception.QemuImgError, qcow2.relayout_overlay,
                          self.disk, other, 'raw',
                          _plan(8 * units.Mi, Prealloc.OFF))
        self.assertEqual(before, pb_fixtures.sha256_of(self.disk))
        self.assertFalse(os.path.exists(self.disk + journal.TMP_SUFFIX))


class TestConvertRaw(Qcow2TestCase):

    def test_standalone_qcow2_same_content(self):
        pb_fixtures.write_pattern(self.disk, 8 * units.Mi, seed=7)
        src_sha = pb_fixtures.guest_sha(self.disk)
        qcow2.convert_raw(self.disk,
                          _plan(8 * units.Mi, Prealloc.FALLOC,
                                cluster=256 * units.Ki))
        info = pb_fixtures.qemu_img_info(self.disk)
        self.assertEqual('qcow2', info['format'])
        self.assertNotIn('backing-filename', info)
        self.assertEqual(256 * units.Ki, info['cluster-size'])
        self.assertEqual(src_sha, pb_fixtures.guest_sha(self.disk))
        self.assertGreaterEqual(pb_fixtures.allocated(self.disk),
                                8 * units.Mi)
        self.assertFalse(os.path.exists(self.disk + '_qcow'))

    def test_full_conversion_leaves_the_page_cache(self):
        # qemu-img convert -t none still writes preallocation=full's zeros
        # through the page cache when it makes the file.
        pb_fixtures.skip_unless_pages_drop(self, self.instances_path)
        pb_fixtures.write_pattern(self.disk, 16 * units.Mi, seed=7)
        src_sha = pb_fixtures.guest_sha(self.disk)
        qcow2.convert_raw(self.disk, _plan(16 * units.Mi, Prealloc.FULL,
                                           cluster=128 * units.Ki))
        self.assertEqual(0, pb_fixtures.cached_bytes(self.disk))
        self.assertEqual(src_sha, pb_fixtures.guest_sha(self.disk))

    def test_failure_leaves_the_raw_disk(self):
        pb_fixtures.write_pattern(self.disk, units.Mi, seed=7)
        before = pb_fixtures.sha256_of(self.disk)
        # qemu-img refuses a cluster size that is not a power of two.
        self.assertRaises(exception.QemuImgError, qcow2.convert_raw,
                          self.disk, _plan(units.Mi, Prealloc.OFF,
                                           cluster=3 * units.Ki))
        self.assertEqual(before, pb_fixtures.sha256_of(self.disk))
        self.assertFalse(os.path.exists(self.disk + '_qcow'))

    def test_failure_after_the_copy_removes_it(self):
        # A real qemu-img that writes the copy, then fails (as one killed
        # by allocation_timeout would): the partial copy goes.
        bindir = self.useFixture(fixtures.TempDir()).path
        with open(os.path.join(bindir, 'qemu-img'), 'w') as f:
            f.write('#!/bin/sh\n%s "$@"\nexit 1\n'
                    % shutil.which('qemu-img'))
        os.chmod(os.path.join(bindir, 'qemu-img'), 0o755)
        self.useFixture(fixtures.EnvironmentVariable(
            'PATH', bindir + os.pathsep + os.environ['PATH']))
        pb_fixtures.write_pattern(self.disk, units.Mi, seed=7)
        before = pb_fixtures.sha256_of(self.disk)
        self.assertRaises(exception.QemuImgError, qcow2.convert_raw,
                          self.disk, _plan(units.Mi, Prealloc.OFF))
        self.assertEqual(before, pb_fixtures.sha256_of(self.disk))
        self.assertFalse(os.path.exists(self.disk + '_qcow'))

    def test_records_qcow2_through_the_journal_s_phases(self):
        # The order a crash depends on (every crash point: tests/crash):
        # the new file flushed, 'converting', the flushed rename, 'ready',
        # disk.info says qcow2, the journal removed.
        pb_fixtures.write_pattern(self.disk, units.Mi, seed=7)
        formats.record_format(self.disk, 'raw')
        steps = []
        real_phase, real_publish = journal.Journal.phase, fileops.publish
        real_record = formats.record_format

        def phase(record, name):
            steps.append(name)
            return real_phase(record, name)

        def publish(tmp, final):
            steps.append('publish')
            return real_publish(tmp, final)

        def record_format(path, fmt):
            steps.append('record %s' % fmt)
            return real_record(path, fmt)

        for target, name, func in ((journal.Journal, 'phase', phase),
                                   (fileops, 'publish', publish),
                                   (formats, 'record_format', record_format)):
            self.useFixture(fixtures.MockPatchObject(target, name, func))
        qcow2.convert_raw(self.disk, _plan(units.Mi, Prealloc.OFF))
        self.assertEqual([journal.CONVERTING, 'publish', journal.READY,
                          'record qcow2'], steps)
        self.assertEqual('qcow2', formats.disk_info_format(
            os.path.join(os.path.dirname(self.disk), 'disk.info'),
            self.disk))
        self.assertFalse(os.path.exists(self.disk + journal.JOURNAL_SUFFIX))

    def _recorded(self):
        return formats.disk_info_format(
            os.path.join(os.path.dirname(self.disk), 'disk.info'), self.disk)

    def test_record_failure_after_publish_is_finished_by_next_cache(self):
        # disk.info cannot be written once the qcow2 file is published
        # (ENOSPC): the journal is handed over, and the next cache() of
        # this same process (Journal.recover) records qcow2; it never
        # removes the journal and leaves a qcow2 file recorded raw.
        pb_fixtures.write_pattern(self.disk, units.Mi, seed=7)
        formats.record_format(self.disk, 'raw')
        src_sha = pb_fixtures.guest_sha(self.disk)
        real_record = formats.record_format
        calls = []

        def record_format(path, fmt):
            calls.append(fmt)
            if len(calls) == 1:
                raise OSError(errno.ENOSPC, 'No space left on device')
            return real_record(path, fmt)
        self.useFixture(fixtures.MockPatchObject(formats, 'record_format',
                                                 record_format))
        self.assertRaises(OSError, qcow2.convert_raw, self.disk,
                          _plan(units.Mi, Prealloc.OFF))
        self.assertEqual('raw', self._recorded())
        journal.Journal(self.disk).recover()
        self.assertEqual('qcow2', self._recorded())
        self.assertEqual('qcow2',
                         pb_fixtures.qemu_img_info(self.disk)['format'])
        self.assertEqual(src_sha, pb_fixtures.guest_sha(self.disk))
        self.assertFalse(os.path.exists(self.disk + journal.JOURNAL_SUFFIX))

    def test_converting_not_flushed_leaves_the_disk_raw(self):
        # The journal's 'converting' reached its name but its directory's
        # flush failed (EIO): the journal goes before the new file, so no
        # later reconcile() takes the raw disk (its guest wrote a qcow2
        # magic) for the published conversion.
        with open(self.disk, 'wb') as f:
            f.write(b'QFI\xfb guest data')
            f.truncate(units.Mi)
        formats.record_format(self.disk, 'raw')
        before = pb_fixtures.sha256_of(self.disk)
        real_write = journal.Journal._write

        def write(record, data):
            real_write(record, data)
            if data.get('phase') == journal.CONVERTING:
                raise OSError(errno.EIO, 'Input/output error')
        self.useFixture(fixtures.MockPatchObject(journal.Journal, '_write',
                                                 write))
        self.assertRaises(OSError, qcow2.convert_raw, self.disk,
                          _plan(units.Mi, Prealloc.OFF))
        # the next nova-compute (another process) recovers the disk
        self.useFixture(fixtures.MockPatchObject(journal, 'PROCESS',
                                                 'restarted'))
        journal.Journal(self.disk).recover()
        self.assertEqual('raw', self._recorded())
        self.assertEqual(before, pb_fixtures.sha256_of(self.disk))
        left = os.listdir(os.path.dirname(self.disk))
        self.assertNotIn('disk' + journal.JOURNAL_SUFFIX, left)
        self.assertNotIn('disk' + journal.CONVERT_SUFFIX, left)

    def test_thin_is_what_nova_makes(self):
        # driver._disk_raw_to_qcow2 where no plan applies (mode none, no
        # room): nova's layout, through the journalled conversion.
        pb_fixtures.write_pattern(self.disk, units.Mi, seed=7)
        formats.record_format(self.disk, 'raw')
        src_sha = pb_fixtures.guest_sha(self.disk)
        qcow2.convert_raw(self.disk, qcow2.THIN)
        info = pb_fixtures.qemu_img_info(self.disk)
        self.assertEqual(65536, info['cluster-size'])
        self.assertFalse(info['format-specific']['data'].get('extended-l2'))
        self.assertEqual(src_sha, pb_fixtures.guest_sha(self.disk))
        self.assertEqual('qcow2', self._recorded())
