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

"""bench/prealloc_bench/engine.py: the statistics' helpers and a Bench
session in a real directory (the round robin and a run too short to time,
with a threshold the test sets, are in prealloc_bench/tests/test_bench.py).
"""

import os

from oslo_utils import units

from prealloc_backend.disk import fsprobe
from prealloc_bench import engine
from prealloc_bench import variants
from tests import base


class HelpersTestCase(base.TestCase):

    def test_rotated(self):
        self.assertEqual([], engine.rotated([], 3))
        self.assertEqual(['b', 'c', 'a'], engine.rotated(['a', 'b', 'c'], 1))
        self.assertEqual(['a', 'b', 'c'], engine.rotated(['a', 'b', 'c'], 3))

    def test_paired_ratios_skip_missing_and_zero_references(self):
        self.assertEqual([2.0, 0.5],
                         engine.paired_ratios([4, None, 1, 3],
                                              [2, 5, 2, 0]))

    def test_case_add_pads_by_repetition(self):
        case = engine.Case(variants.RAW_SPARSE)
        case.add(2, engine.Sample(5.0, {'allocated': 7}))
        case.add(0, engine.Sample(1.0))
        self.assertEqual([1.0, None, 5.0], case.samples)
        self.assertEqual({'allocated': [None, None, 7]}, case.extra)

    def test_quick_is_smaller(self):
        for field in ('write_disk', 'seq_bytes'):
            self.assertLess(getattr(engine.QUICK, field),
                            getattr(engine.DEFAULT, field), field)


class SessionTestCase(base.TestCase):

    def test_scratch_directory_made_and_removed(self):
        directory = os.path.join(self.instances_path, 'bench')
        with engine.Bench(directory, engine.QUICK) as bench:
            workdir = bench.workdir
            self.assertEqual(directory, os.path.dirname(workdir))
            self.assertTrue(os.path.basename(workdir).startswith(
                'prealloc-bench-'))
            self.assertEqual(fsprobe.fs_type(directory), bench.fs_type)
            self.assertGreaterEqual(bench.reserve_margin(), 64 * units.Mi)
            base_path = bench.base(2 * units.Mi)
            self.assertEqual(2 * units.Mi, os.path.getsize(base_path))
            self.assertIs(base_path, bench.base(2 * units.Mi))
            with open(base_path, 'rb') as f:
                self.assertNotEqual(bytes(units.Mi), f.read(units.Mi))
        self.assertFalse(os.path.exists(workdir))
        self.assertEqual([], os.listdir(directory))
