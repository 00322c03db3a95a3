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

"""tests.fixtures.contains, which the tests asserting a host file's bytes
never reach a guest's disk rely on: a false "no" would let them pass on
a leak, so its hole skipping is checked here on real sparse files (the
test directory's filesystem).
"""

import os
import tempfile

from tests import base
from tests import fixtures as pb_fixtures

MiB = 1024 ** 2


class TestContains(base.TestCase):

    def sparse(self, writes, size=64 * MiB):
        """A file of ``size`` bytes, holes but for ``writes`` ((offset,
        bytes) pairs).
        """
        fd, path = tempfile.mkstemp(dir=self.instances_path)
        try:
            os.ftruncate(fd, size)
            for offset, data in writes:
                os.pwrite(fd, data, offset)
            os.fsync(fd)
        finally:
            os.close(fd)
        return path

    def test_found_after_a_hole(self):
        path = self.sparse([(40 * MiB + 123, b'NEEDLE')])
        self.assertTrue(pb_fixtures.contains(path, b'NEEDLE'))
        self.assertFalse(pb_fixtures.contains(path, b'NEEDLF'))

    def test_found_across_reads(self):
        # In one data range read 4096 bytes at a time: at every offset
        # around the first read's end, one of which splits the needle.
        for offset in range(4080, 4100):
            path = self.sparse([(8 * MiB, b'x' * 8192),
                                (8 * MiB + offset, b'NEEDLE')])
            self.assertTrue(pb_fixtures.contains(path, b'NEEDLE', chunk=4096),
                            offset)

    def test_reads_shorter_than_the_needle(self):
        path = self.sparse([(8 * MiB, b'NEEDLE-OF-ELEVEN')])
        for chunk in (1, 2, 5):
            self.assertTrue(pb_fixtures.contains(path, b'NEEDLE-OF-ELEVEN',
                                                 chunk=chunk), chunk)

    def test_unwritten_extents_and_unflushed_data(self):
        # fallocate's unwritten extents (what every reserving mode makes),
        # then data written into them and not flushed.
        fd, path = tempfile.mkstemp(dir=self.instances_path)
        try:
            os.ftruncate(fd, 64 * MiB)
            os.posix_fallocate(fd, 16 * MiB, 16 * MiB)
            os.pwrite(fd, b'NEEDLE', 20 * MiB + 7)
        finally:
            os.close(fd)
        self.assertTrue(pb_fixtures.contains(path, b'NEEDLE'))

    def test_needle_across_a_hole(self):
        # Its two ends in two data ranges, a whole hole between them.
        needle = b'A' * 10 + b'\0' * 8192 + b'B' * 10
        path = self.sparse([(4 * MiB - 10, b'A' * 10),
                            (4 * MiB + 8192, b'B' * 10)])
        self.assertTrue(pb_fixtures.contains(path, needle))
        self.assertFalse(pb_fixtures.contains(path, b'A' * 11))

    def test_not_a_regular_file(self):
        self.assertRaises(ValueError, pb_fixtures.contains, '/dev/null',
                          b'NEEDLE')

    def test_needle_running_into_a_hole(self):
        # The data ends with the needle's first bytes; its zeros are the
        # hole that follows (data ranges are whole blocks: 4 KiB here).
        path = self.sparse([(4 * MiB, b'x' * 4094 + b'XY')])
        self.assertTrue(pb_fixtures.contains(path, b'XY' + b'\0' * 64))
        self.assertFalse(pb_fixtures.contains(path, b'XZ' + b'\0' * 64))

    def test_needle_starting_in_a_hole(self):
        path = self.sparse([(4 * MiB, b'XY')])
        self.assertTrue(pb_fixtures.contains(path, b'\0' * 64 + b'XY'))

    def test_needle_at_the_end_of_the_file(self):
        path = self.sparse([(MiB - 6, b'NEEDLE')], size=MiB)
        self.assertTrue(pb_fixtures.contains(path, b'NEEDLE'))

    def test_all_zero_needle_refused(self):
        path = self.sparse([])
        self.assertRaises(ValueError, pb_fixtures.contains, path, b'\0' * 8)
