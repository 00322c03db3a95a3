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

"""prealloc_backend.disk.refcount: what a growth cut short leaves past a
qcow2 file's end, found and mended; real qemu-img on real files (every cut
point of a growth: tests/crash).
"""

import os
import struct
import subprocess

import fixtures
from oslo_utils import units

from prealloc_backend.disk import refcount
from prealloc_backend import exception
from tests import base
from tests import fixtures as pb_fixtures


def _qemu_img(*args, ok=(0,)):
    proc = subprocess.run(('qemu-img',) + args, capture_output=True,
                          text=True)
    assert proc.returncode in ok, (args, proc.returncode, proc.stderr)
    return proc


class RefcountTestCase(base.TestCase):

    def setUp(self):
        super().setUp()
        self.disk = os.path.join(self.instances_path, 'disk')
        self.ref = os.path.join(self.instances_path, 'ref')

    def make(self, refcount_bits=16, size=4 * units.Mi):
        """A metadata-preallocated disk with guest data, and a copy."""
        _qemu_img('create', '-f', 'qcow2', '-o', 'extended_l2=on,'
                  'preallocation=metadata,refcount_bits=%d' % refcount_bits,
                  self.disk, str(size))
        subprocess.run(['qemu-io', '-f', 'qcow2', '-c',
                        'write -P 0x5a 64k 128k', self.disk], check=True,
                       capture_output=True)
        _qemu_img('convert', '-f', 'qcow2', '-O', 'qcow2', self.disk,
                  self.ref)

    def grow(self, size=8 * units.Mi, ok=(0,)):
        return _qemu_img('resize', '-f', 'qcow2', '--preallocation=falloc',
                         self.disk, str(size), ok=ok)


class TestCutGrowth(RefcountTestCase):

    def test_qemu_img_aborts_on_it_and_check_sees_nothing(self):
        # The finding itself (QEMU 7.2 and 10.0): not a test of the
        # plugin, a test that the state the others mend is the one QEMU
        # cannot grow.
        self.make()
        pb_fixtures.count_past_end(self.disk)
        _qemu_img('check', '-f', 'qcow2', '-r', 'all', self.disk)
        proc = self.grow(ok=(-6, 134))
        self.assertIn('qcow2_refcount_area', proc.stderr)

    def test_found_mended_and_grown(self):
        for bits in (1, 2, 4, 8, 16, 32, 64):
            self.make(bits)
            length = os.stat(self.disk).st_size
            first = pb_fixtures.count_past_end(self.disk, clusters=3)
            size, in_file, counted = refcount.counted_end(self.disk)
            self.assertEqual((length, length, (first + 3) * 65536),
                             (size, in_file, counted), bits)
            self.assertTrue(refcount.mend(self.disk))
            self.assertEqual(length, os.stat(self.disk).st_size)
            self.assertEqual(length, refcount.counted_end(self.disk)[2])
            _qemu_img('check', '-f', 'qcow2', self.disk)
            self.grow()
            _qemu_img('check', '-f', 'qcow2', self.disk)
            _qemu_img('compare', '-f', 'qcow2', '-F', 'qcow2', self.ref,
                      self.disk)
            os.unlink(self.disk)

    def test_an_intact_disk_is_left_as_it_is(self):
        self.make()
        with open(self.disk, 'rb') as f:
            before = f.read()
        self.assertFalse(refcount.mend(self.disk))
        with open(self.disk, 'rb') as f:
            self.assertEqual(before, f.read())

    def test_leaks_inside_the_file_freed_and_cut_back_to_the_length(self):
        # A growth cut later: its new refcount table written at the end,
        # counted, never referenced (the header still names the old one).
        self.make()
        length = os.stat(self.disk).st_size
        pb_fixtures.count_past_end(self.disk)
        with open(self.disk, 'ab') as f:
            f.write(b'\0\0\0\0\0\2' + bytes(65530))
        self.assertEqual(3, _qemu_img('check', '-f', 'qcow2', self.disk,
                                      ok=(3,)).returncode)
        # Without the length from before: nothing passes the end.
        self.assertFalse(refcount.mend(self.disk))
        self.assertTrue(refcount.mend(self.disk, length))
        self.assertEqual(length, os.stat(self.disk).st_size)
        _qemu_img('check', '-f', 'qcow2', self.disk)
        _qemu_img('compare', '-f', 'qcow2', '-F', 'qcow2', self.ref,
                  self.disk)

    def test_a_referenced_cluster_is_never_cut(self):
        # A file whose last data cluster was lost (cut by hand): counted
        # and referenced past the end. The mend gives the file its
        # length back (a hole) and cuts nothing a table references.
        self.make(size=2 * units.Mi)
        subprocess.run(['qemu-io', '-f', 'qcow2', '-c',
                        'write -P 0x33 1984k 64k', self.disk], check=True,
                       capture_output=True)
        full = os.stat(self.disk).st_size
        os.truncate(self.disk, full - 65536)
        self.assertTrue(refcount.mend(self.disk))
        self.assertEqual(full, os.stat(self.disk).st_size)
        _qemu_img('check', '-f', 'qcow2', self.disk)
        # Cut back to the length the caller knew: never below the end.
        os.truncate(self.disk, full - 65536)
        refcount.mend(self.disk, full - 65536)
        self.assertEqual(full, os.stat(self.disk).st_size)


class TestBadHeaders(RefcountTestCase):

    def _refused(self, reason):
        exc = self.assertRaises(exception.Qcow2RefcountError,
                                refcount.counted_end, self.disk)
        self.assertIn(self.disk, str(exc))
        self.assertIn(reason, str(exc))

    def _poke(self, offset, fmt, value):
        with open(self.disk, 'r+b') as f:
            f.seek(offset)
            f.write(struct.pack(fmt, value))

    def test_not_qcow2(self):
        with open(self.disk, 'wb') as f:
            f.write(b'\0' * 4096)
        self._refused('no qcow2 magic')

    def test_short(self):
        with open(self.disk, 'wb') as f:
            f.write(refcount.MAGIC)
        self._refused('header is 4 bytes long')

    def test_fields_out_of_bounds(self):
        for offset, fmt, value, reason in (
                (4, '>I', 4, 'version 4'),
                (20, '>I', 30, 'cluster_bits 30'),
                (96, '>I', 7, 'refcount_order 7'),
                (56, '>I', 1024, 'refcount table of 1024 clusters'),
                (48, '>Q', 1000, 'refcount table of 1 clusters at 1000'),
                (48, '>Q', 1 << 40, 'passes the end of the file')):
            self.make()
            self._poke(offset, fmt, value)
            self._refused(reason)
            os.unlink(self.disk)

    def test_refcount_block_past_the_end(self):
        self.make()
        with open(self.disk, 'rb') as f:
            f.seek(48)
            table = struct.unpack('>Q', f.read(8))[0]
        # A second refcount block, far past the end.
        self._poke(table + 8, '>Q', 1 << 40)
        self._refused('refcount block 1 at %d passes the end' % (1 << 40))

    def test_a_table_naming_one_block_again_and_again_reads_it_once(self):
        self.make()
        with open(self.disk, 'rb') as f:
            f.seek(48)
            table = struct.unpack('>Q', f.read(8))[0]
            f.seek(table)
            first = f.read(8)
        with open(self.disk, 'r+b') as f:
            f.seek(table)
            f.write(first * 8192)
        reads = []
        pread = os.pread

        def counting(fd, length, offset):
            reads.append(length)
            return pread(fd, length, offset)

        self.useFixture(fixtures.MockPatchObject(refcount.os, 'pread',
                                                 counting))
        refcount.counted_end(self.disk)
        # The header, the table, one block.
        self.assertEqual(3, len(reads))
