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

"""bench/prealloc_bench/variants.py: the variants' names and what the
reference disks take; the disks made through the real backends are in
prealloc_bench/tests/test_bench.py.
"""

import os

from oslo_utils import units

from prealloc_bench import variants
from tests import base
from tests import fixtures as pb_fixtures


class VariantTestCase(base.TestCase):

    def test_keys_and_labels(self):
        self.assertEqual(len(variants.ALL), len(variants.BY_KEY))
        self.assertEqual('raw sparse', variants.RAW_SPARSE.label)
        self.assertEqual('nova space', variants.NOVA_SPACE.label)
        v = variants.by_key('plugin-space@256K')
        self.assertEqual(('plugin-space@256K', 'space', '256K',
                          'plugin space (256K asked)'),
                         (v.key, v.mode, v.cluster, v.label))
        self.assertIs(variants.PLUGIN_FULL, variants.by_key('plugin-full'))
        self.assertRaises(KeyError, variants.by_key, 'nope')

    def test_reference_bytes(self):
        size = 8 * units.Mi
        self.assertEqual(size, variants.reference_bytes(
            variants.NOVA_SPACE, size))
        self.assertEqual(0, variants.reference_bytes(variants.NOVA_NONE,
                                                     size))
        self.assertEqual(0, variants.reference_bytes(variants.RAW_SPARSE,
                                                     size))
        self.assertEqual(size, variants.reference_bytes(variants.RAW_ZERO,
                                                        size))

    def test_make_base_is_random_and_kept(self):
        path = os.path.join(self.instances_path, 'base')
        variants.make_base(path, 3 * units.Mi + 5)
        self.assertEqual(3 * units.Mi + 5, os.path.getsize(path))
        with open(path, 'rb') as f:
            first, second = f.read(units.Mi), f.read(units.Mi)
        self.assertNotEqual(first, second)
        self.assertNotIn(bytes(4096), first)
        mtime = os.stat(path).st_mtime_ns
        variants.make_base(path, 3 * units.Mi + 5)
        self.assertEqual(mtime, os.stat(path).st_mtime_ns)
        self.assertFalse(os.path.exists(path + '.part'))

    def test_zero_written_reference_is_written_and_uncached(self):
        # The physical limit: every block written, no cached page for a
        # first O_DIRECT write to invalidate.
        pb_fixtures.skip_unless_pages_drop(self, self.instances_path)
        size = 4 * units.Mi + 5
        disk = variants._make_raw_file(variants.RAW_ZERO,
                                       self.instances_path, size)
        self.assertEqual(size, os.path.getsize(disk.path))
        self.assertGreaterEqual(pb_fixtures.allocated(disk.path), size)
        self.assertEqual(0, pb_fixtures.hole_bytes(disk.path))
        self.assertEqual(0, pb_fixtures.cached_bytes(disk.path))
