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

"""prealloc_backend.disk.allocate: the blocks of a raw file as a plan says, and
holes dug where a copied disk reads zeros; real files whose allocation the
tests read (the privsep entrypoints run in-process, tests/base.py).
"""

import logging
import os

import fixtures
from oslo_utils import units

from prealloc_backend.disk import allocate
from prealloc_backend import exception
from tests import base
from tests import fixtures as pb_fixtures


class TestAllocateFile(base.TestCase):

    def setUp(self):
        super().setUp()
        self.disk = os.path.join(self.instances_path, 'disk')
        with open(self.disk, 'wb') as f:
            f.truncate(8 * units.Mi)

    def test_fallocate_reserves_every_block(self):
        self.assertTrue(allocate.fallocate_file(self.disk))
        self.assertGreaterEqual(pb_fixtures.allocated(self.disk),
                                8 * units.Mi)

    def test_fallocate_of_an_allocated_file_calls_nothing(self):
        self.assertTrue(allocate.fallocate_file(self.disk))
        calls = self.useFixture(fixtures.MockPatch(
            'prealloc_backend.privsep.fs.fallocate_range')).mock
        self.assertTrue(allocate.fallocate_file(self.disk))
        calls.assert_not_called()

    def test_zero_fill_writes_every_block_and_yields(self):
        done = list(allocate.zero_fill(self.disk, 8 * units.Mi, 0, 0))
        self.assertGreaterEqual(pb_fixtures.allocated(self.disk),
                                8 * units.Mi)
        self.assertEqual(0, pb_fixtures.hole_bytes(self.disk))
        # interval 0: a yield after every call, with the bytes done.
        self.assertEqual(8 * units.Mi, done[-1])

    def test_zero_fill_stops_where_its_caller_raises(self):
        fill = allocate.zero_fill(self.disk, 8 * units.Mi, 0, 0)
        next(fill)
        self.assertRaises(exception.AllocationCancelled, fill.throw,
                          exception.AllocationCancelled(path=self.disk,
                                                        reason='deleted'))


class TestDigHoles(base.TestCase):
    """A metadata disk that arrived fully written (scp): holes punched
    where it reads zeros, and a failure to punch never fails the move.
    """

    def _written(self):
        path = os.path.join(self.instances_path, 'disk')
        with open(path, 'wb') as f:
            f.write(b'\0' * (4 * units.Mi))
            f.write(b'\1' * units.Mi)
            os.fsync(f.fileno())
        return path

    def test_zeros_become_holes_data_stays(self):
        path = self._written()
        allocate.dig_holes(path)
        self.assertLessEqual(pb_fixtures.allocated(path), 2 * units.Mi)
        with open(path, 'rb') as f:
            self.assertEqual(b'\0' * (4 * units.Mi), f.read(4 * units.Mi))
            self.assertEqual(b'\1' * units.Mi, f.read())

    def test_failed_punch_leaves_the_disk_and_warns(self):
        # A real failing command, not a mock: a 'fallocate' first on PATH
        # that refuses, as util-linux's does where the filesystem cannot
        # punch holes (EOPNOTSUPP).
        bindir = self.useFixture(fixtures.TempDir()).path
        fake = os.path.join(bindir, 'fallocate')
        with open(fake, 'w') as f:
            f.write('#!/bin/sh\necho "fallocate: Operation not supported"'
                    ' >&2\nexit 1\n')
        os.chmod(fake, 0o755)
        self.useFixture(fixtures.EnvironmentVariable(
            'PATH', bindir + os.pathsep + os.environ['PATH']))
        logs = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        path = self._written()
        before = pb_fixtures.allocated(path)
        allocate.dig_holes(path)  # no exception
        self.assertEqual(before, pb_fixtures.allocated(path))
        self.assertIn('left as it is', logs.output)
        self.assertIn('Operation not supported', logs.output)

    def test_a_thin_file_is_not_read(self):
        # At most half allocated: left as it is, no fallocate runs (a
        # 'fallocate' that fails would be logged).
        path = os.path.join(self.instances_path, 'disk')
        with open(path, 'wb') as f:
            f.truncate(4 * units.Mi)
            f.write(b'\1' * units.Mi)
        logs = self.useFixture(fixtures.FakeLogger(level=logging.INFO))
        allocate.dig_holes(path)
        self.assertEqual('', logs.output)
