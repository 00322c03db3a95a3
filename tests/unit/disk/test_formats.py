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

"""prealloc_backend.disk.formats: a disk's format from nova's records, the
header read only to refuse a disagreement, and the checks of a qcow2 disk
and of a base image; real files, real qemu-img. (The same rules through
the image classes: tests/unit/adapter/test_backend.py TestFormatFromRecords.)
"""

import json
import logging
import os
import struct
import subprocess
import uuid

import fixtures
from nova import exception as nova_exception
from oslo_utils.imageutils import format_inspector
from oslo_utils import units
from oslo_utils import uuidutils

from prealloc_backend.disk import formats
from prealloc_backend.disk import qemu
from prealloc_backend import exception
from prealloc_backend.planner import diskplan
from tests import base


def _guid(text):
    return uuid.UUID(text).bytes_le


def guest_header(kind, size):
    """{offset: bytes} a guest writes into its raw disk of ``size`` bytes
    to make format_inspector name ``kind``; VMDK and VHDX point the
    inspector at the disk's end (tests/functional/test_guest_headers.py
    writes the same).
    """
    if kind == 'vmdk':
        # A hosted sparse extent header, version 1, descriptor at sector
        # 1, grain directory "at end" (0xffffffffffffffff): a footer the
        # inspector waits for until the end of the file.
        return {0: struct.pack('<4sIIQQQQIQQ', b'KDMV', 1, 0, 2048, 128, 1,
                               1, 512, 0, 0xFFFFFFFFFFFFFFFF)}
    if kind == 'vhdx':
        # The identifier, and a region table at 192 KiB whose metadata
        # region is the disk's last MiB.
        table = struct.pack('<IIII', 0x69676572, 0, 1, 0) + _guid(
            format_inspector.VHDXInspector.METAREGION) + struct.pack(
            '<QII', size - units.Mi, units.Mi, 1)
        return {0: b'vhdxfile', 192 * units.Ki: table}
    if kind == 'luks':
        return {0: b'LUKS\xba\xbe' + struct.pack('>H', 1)}
    if kind == 'qcow2':
        return {0: struct.pack('>4sIQIIQ', b'QFI\xfb', 3, 0, 0, 16, size)}
    raise ValueError(kind)


GUEST_HEADERS = ('vmdk', 'vhdx', 'luks', 'qcow2')


def write_guest_header(path, kind, size):
    """guest_header's bytes for a disk of ``size`` bytes written into the
    raw file at ``path`` (made sparse, ``size`` bytes, if it does not
    exist; else its size kept).
    """
    with open(path, 'r+b' if os.path.exists(path) else 'wb') as f:
        if not os.fstat(f.fileno()).st_size:
            f.truncate(size)
        for offset, data in guest_header(kind, size).items():
            f.seek(offset)
            f.write(data)
    return path


class InspectedBytes(fixtures.Fixture):
    """Counts the bytes every format_inspector.InspectWrapper is fed, by
    the name of the file it reads (detect_file_format and nova's
    get_image_format make theirs through the module too).
    """

    def _setUp(self):
        self.fed = {}
        fed = self.fed
        real = format_inspector.InspectWrapper

        class Counting(real):
            def read(self, size):
                chunk = super().read(size)
                name = getattr(self._source, 'name', None)
                fed[name] = fed.get(name, 0) + len(chunk)
                return chunk

        self.useFixture(fixtures.MockPatchObject(
            format_inspector, 'InspectWrapper', Counting))


class FormatsTestCase(base.TestCase):

    def setUp(self):
        super().setUp()
        self.uuid = uuidutils.generate_uuid()
        self.inst_dir = os.path.join(self.instances_path, self.uuid)
        os.makedirs(self.inst_dir)
        self.disk = os.path.join(self.inst_dir, 'disk')
        self.disk_info = os.path.join(self.inst_dir, 'disk.info')

    def qcow2(self, path, *opts):
        subprocess.run(['qemu-img', 'create', '-f', 'qcow2', *opts, path,
                        str(units.Mi)], check=True, capture_output=True)
        return path

    def raw(self, path, data=b''):
        with open(path, 'wb') as f:
            f.write(data)
            f.truncate(units.Mi)
        return path


class TestMigrationRecord(FormatsTestCase):

    def test_migration_record_written_to_disk_info(self):
        self.raw(self.disk, b'QFI\xfb')  # a guest's bytes: raw wins
        self.assertEqual('raw', formats.migration_record(self.disk, 'raw'))
        self.assertEqual('raw', formats.disk_info_format(self.disk_info,
                                                         self.disk))

    def test_migration_record_qcow2_with_raw_header_refused(self):
        self.raw(self.disk)
        exc = self.assertRaises(exception.DiskFormatMismatch,
                                formats.migration_record, self.disk, 'qcow2')
        self.assertIn('domain XML', str(exc))
        self.assertIsNone(formats.disk_info_format(self.disk_info,
                                                   self.disk))


class TestRecords(FormatsTestCase):

    def test_record_format_replaces_an_entry(self):
        formats.record_format(self.disk, 'raw')
        formats.record_format(self.disk, 'qcow2')
        formats.record_format(self.disk + '.local', 'raw')
        with open(self.disk_info) as f:
            self.assertEqual({self.disk: 'qcow2', self.disk + '.local': 'raw'},
                             json.load(f))

    def test_record_format_refuses_a_disk_info_that_is_not_json(self):
        with open(self.disk_info, 'w') as f:
            f.write('{not json')
        exc = self.assertRaises(nova_exception.InvalidDiskInfo,
                                formats.record_format, self.disk, 'raw')
        self.assertIn(self.disk_info, str(exc))

    def test_a_write_cut_before_its_rename_is_removed(self):
        formats.record_format(self.disk, 'raw')
        # record_format's or nova's temporary file, killed before its
        # rename: the record itself is the old one, whole.
        with open(self.disk_info + '.tmp', 'w') as f:
            f.write('{"%s": "qcow2", "and a longer tail": 1' % self.disk)
        formats.remove_partial_record(self.disk)
        self.assertEqual(['disk.info'], os.listdir(self.inst_dir))
        self.assertEqual('raw', formats.disk_info_format(self.disk_info,
                                                         self.disk))
        formats.remove_partial_record(self.disk)

    def test_recorded_format_order(self):
        self.assertEqual(('raw', 'the raw backend that made it'),
                         formats.recorded_format(self.disk, self.disk_info,
                                                 'raw'))
        formats.record_format(self.disk, 'qcow2')
        self.assertEqual(('qcow2', self.disk_info),
                         formats.recorded_format(self.disk, self.disk_info,
                                                 'raw'))
        self.assertEqual(('raw', 'the source host\'s domain XML'),
                         formats.recorded_format(self.disk, self.disk_info,
                                                 'raw',
                                                 migration_format='raw'))


class TestDiskFormat(FormatsTestCase):

    def test_recorded_raw_is_raw_whatever_its_header(self):
        self.qcow2(self.disk)
        formats.record_format(self.disk, 'raw')
        self.assertIs(diskplan.DiskFormat.RAW,
                      formats.checked_format(self.disk, self.disk_info,
                                             'qcow2')[0])

    def test_recorded_qcow2_with_raw_header_refused(self):
        self.raw(self.disk)
        exc = self.assertRaises(exception.DiskFormatMismatch,
                                formats.checked_format, self.disk,
                                self.disk_info, 'qcow2')
        self.assertIn(self.disk, str(exc))

    def test_other_recorded_format_refused(self):
        formats.record_format(self.disk, 'vmdk')
        self.assertRaises(nova_exception.InvalidDiskFormat,
                          formats.checked_format, self.disk, self.disk_info,
                          'raw')

    def test_unrecorded_raw_backend_disk(self):
        self.qcow2(self.disk)
        logs = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        # A header is data unless this cache() call just made the disk.
        self.assertEqual('raw', formats.unrecorded_raw_format(
            self.disk, False, self.disk_info))
        self.assertIn('handled as raw', logs.output)
        self.assertEqual('qcow2', formats.unrecorded_raw_format(
            self.disk, True, self.disk_info))

    def test_virtual_size_unchecked(self):
        self.qcow2(self.disk)
        self.assertEqual(units.Mi, formats.virtual_size_unchecked(self.disk))
        raw = self.raw(self.disk + '.raw')
        self.assertEqual(units.Mi, formats.virtual_size_unchecked(raw))


class TestCheckQcow2Disk(FormatsTestCase):

    def test_no_backing(self):
        self.qcow2(self.disk)
        self.assertEqual((None, None),
                         formats.check_qcow2_disk(self.disk)[:2])

    def test_backing_in_the_image_cache(self):
        cached = self.raw(self.base_path('abc'))
        self.qcow2(self.disk, '-F', 'raw', '-b', cached)
        self.assertEqual((cached, 'raw'),
                         formats.check_qcow2_disk(self.disk)[:2])

    def test_backing_elsewhere_refused_naming_the_cache(self):
        elsewhere = self.raw(os.path.join(self.instances_path, 'x'))
        self.qcow2(self.disk, '-F', 'raw', '-b', elsewhere)
        exc = self.assertRaises(exception.UnsafeDiskHeader,
                                formats.check_qcow2_disk, self.disk)
        self.assertIn(formats.cache_dir(), str(exc))

    def test_not_qcow2_refused(self):
        self.raw(self.disk)
        exc = self.assertRaises(exception.UnsafeDiskHeader,
                                formats.check_qcow2_disk, self.disk)
        self.assertIn('not a qcow2 file', str(exc))


class TestCheckedOverlay(FormatsTestCase):
    """An overlay the operation has just made is judged as check_qcow2_disk
    judges one read from the records, from its ImageInfo, with no
    qemu-img run.
    """

    def setUp(self):
        super().setUp()
        self.infos = self.useFixture(fixtures.MockPatchObject(
            qemu, 'info', side_effect=AssertionError('qemu-img info')))

    def made(self, backing, fmt='raw', **fields):
        return qemu.ImageInfo(format='qcow2', virtual_size=units.Mi,
                              cluster_size=65536, has_backing=True,
                              backing_file=backing, backing_format=fmt,
                              **fields)

    def test_the_verdict_of_a_disk_read_from_its_records(self):
        for fmt in ('raw', 'qcow2'):
            cached = self.raw(self.base_path('abc-' + fmt))
            info = self.made(cached, fmt)
            self.assertEqual(formats.Checked(cached, fmt, info),
                             formats.checked_overlay(self.disk, info))

    def test_refused_as_check_qcow2_disk_refuses(self):
        cached = self.raw(self.base_path('abc'))
        elsewhere = self.raw(os.path.join(self.instances_path, 'x'))
        for info, why in (
                (self.made(cached, 'vmdk'), "has format 'vmdk'"),
                (self.made(elsewhere), formats.cache_dir()),
                (self.made(cached, data_file='/d'), "data-file '/d'")):
            exc = self.assertRaises(exception.UnsafeDiskHeader,
                                    formats.checked_overlay, self.disk, info)
            self.assertIn(why, str(exc))
        self.infos.mock.assert_not_called()


class TestCheckedBase(FormatsTestCase):

    def test_a_plain_base_passes(self):
        cached = self.raw(self.base_path('abc'), b'data')
        self.assertEqual('raw',
                         formats.checked_base(cached, False).file_format)

    def test_a_base_with_a_backing_file_refused(self):
        other = self.raw(self.base_path('other'))
        cached = self.qcow2(self.base_path('abc'), '-F', 'raw', '-b', other)
        exc = self.assertRaises(nova_exception.InvalidDiskInfo,
                                formats.checked_base, cached, True)
        self.assertIn('Base image failed safety check', str(exc))


class TestBoundedInspection(FormatsTestCase):
    """A guest's header never makes the host read past HEADER_PREFIX, and
    a disk recorded raw is not read at all.
    """

    SIZE = 64 * units.Mi

    def setUp(self):
        super().setUp()
        self.inspected = self.useFixture(InspectedBytes())

    def guest_disk(self, kind):
        """A new sparse raw disk whose guest wrote ``kind``'s header."""
        if os.path.exists(self.disk):
            os.unlink(self.disk)
        return write_guest_header(self.disk, kind, self.SIZE)

    def test_the_prefix_is_a_mebibyte(self):
        self.assertEqual(units.Mi, formats.HEADER_PREFIX)

    def test_no_read_past_the_prefix_whatever_the_header(self):
        for kind in GUEST_HEADERS:
            with self.subTest(kind=kind):
                self.inspected.fed.clear()
                self.guest_disk(kind)
                self.assertEqual(kind, formats.header_format(self.disk))
                self.assertLessEqual(self.inspected.fed[self.disk],
                                     formats.HEADER_PREFIX)

    def test_a_real_qcow2_file_still_named(self):
        self.qcow2(self.disk)
        self.assertEqual('qcow2', formats.header_format(self.disk))
        self.assertEqual('raw', formats.header_format(self.raw(self.disk)))

    def test_migration_record_raw_never_inspected(self):
        for kind in GUEST_HEADERS:
            with self.subTest(kind=kind):
                self.guest_disk(kind)
                self.assertEqual('raw',
                                 formats.migration_record(self.disk, 'raw'))
                self.assertNotIn(self.disk, self.inspected.fed)

    def test_disk_info_raw_never_inspected(self):
        formats.record_format(self.disk, 'raw')
        for kind in GUEST_HEADERS:
            with self.subTest(kind=kind):
                self.guest_disk(kind)
                self.assertIs(diskplan.DiskFormat.RAW, formats.checked_format(
                    self.disk, self.disk_info, 'qcow2')[0])
                self.assertNotIn(self.disk, self.inspected.fed)

    def test_recorded_qcow2_read_within_the_prefix(self):
        # A raw disk recorded qcow2 (the record wrong, or the guest's
        # header): refused after reading the prefix, not the disk.
        for kind in ('vmdk', 'vhdx'):
            with self.subTest(kind=kind):
                self.inspected.fed.clear()
                self.guest_disk(kind)
                self.assertRaises(exception.DiskFormatMismatch,
                                  formats.migration_record, self.disk,
                                  'qcow2')
                self.assertRaises(exception.DiskFormatMismatch,
                                  formats.checked_format, self.disk,
                                  self.disk_info, 'qcow2')
                self.assertLessEqual(self.inspected.fed[self.disk],
                                     2 * formats.HEADER_PREFIX)

    def test_unrecorded_raw_read_within_the_prefix(self):
        for kind in ('vmdk', 'vhdx'):
            with self.subTest(kind=kind):
                self.inspected.fed.clear()
                self.guest_disk(kind)
                self.assertEqual('raw', formats.unrecorded_raw_format(
                    self.disk, False, self.disk_info))
                self.assertLessEqual(self.inspected.fed[self.disk],
                                     formats.HEADER_PREFIX)
