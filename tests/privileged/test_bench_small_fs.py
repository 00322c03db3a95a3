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

"""``prealloc-bench`` on small loop-mounted filesystems (root).

A figure the filesystem cannot hold is not shown, and the report says why
in a line of its own; the others are still measured. The space a plugin
disk needs is the plan's (diskplan.make_plan), so a disk the plan says fits
is measured and one it says does not is skipped.
"""

import dataclasses

from oslo_utils import units

from prealloc_bench import engine
from prealloc_bench import report
from prealloc_bench import variants
from prealloc_bench import workloads
from tests import base


# The rows of the random-read workload measured on a 1 GiB filesystem.
READ_ROWS = ('raw-sparse', 'nova-none', 'plugin-none', 'plugin-metadata')


class SkipTestCase(base.TestCase):

    def test_creation_on_a_small_filesystem(self):
        fs = self.use_loop_fs('ext4', 256)
        config = dataclasses.replace(engine.QUICK, reps=1,
                                     create_sizes=(10 * units.Gi,),
                                     small_base=units.Mi, cluster_sweep=())
        with engine.Bench(fs.path, config) as bench:
            out = bench.run_workload(workloads.Creation())
            metadata_needs = bench.needed_bytes(variants.PLUGIN_METADATA,
                                                10 * units.Gi)
        # The plan's figure for a metadata overlay fits, so it is measured.
        self.assertLess(metadata_needs, 64 * units.Mi)
        rows = {row['variant']: row for row in out['cases']}
        for key in ('raw-fallocated', 'nova-space', 'plugin-space'):
            self.assertIsNone(rows[key]['median'])
            self.assertIn('cannot be reserved here: needs 10 GiB',
                          rows[key]['skip'])
        for key in ('nova-none', 'plugin-none', 'plugin-metadata'):
            self.assertIsNone(rows[key]['skip'])
            self.assertIsNone(rows[key]['error'])
            self.assertEqual(1, len(rows[key]['samples']))
            self.assertIsNotNone(rows[key]['median'])
        self.assertIn('not measured: full writes 10 GiB of zeros',
                      rows['plugin-full']['skip'])
        report.add_ratios(out)
        text = '\n'.join(report.workload_lines(out, 8))
        self.assertRegex(text, r'not shown: plugin space: cannot be '
                               r'reserved here: needs 10 GiB, \d+ MiB free '
                               r'on %s' % fs.path)
        self.assertNotIn('Traceback', text)

    def _reads(self, min_seconds, read_points=2048):
        """The random-read rows on a small filesystem, runs shorter than
        ``min_seconds`` not shown.
        """
        fs = self.use_loop_fs('ext4', 1024)
        config = dataclasses.replace(engine.QUICK, reps=1,
                                     read_points=read_points,
                                     small_base=units.Mi, cluster_sweep=(),
                                     min_seconds=min_seconds)
        with engine.Bench(fs.path, config) as bench:
            out = bench.run_workload(workloads.RandomReads())
        rows = {row['variant']: row for row in out['cases']}
        self.assertIn('cannot be reserved here: needs 1 TiB',
                      rows['plugin-space']['skip'])
        return out, rows

    def test_reads_on_a_small_filesystem(self):
        # No floor: every run is timed, however fast the machine.
        out, rows = self._reads(min_seconds=0.0)
        for key in READ_ROWS:
            self.assertIsNone(rows[key]['error'], key)
            self.assertIsNone(rows[key]['skip'], key)
            self.assertIsNotNone(rows[key]['median'], key)
        report.add_ratios(out)
        self.assertIn('raw-sparse', rows['plugin-metadata']['ratios'])

    def test_too_short_reads_are_not_shown(self):
        # A floor no run of this size reaches: every row is too short.
        _out, rows = self._reads(min_seconds=3600.0, read_points=256)
        for key in READ_ROWS:
            self.assertIsNone(rows[key]['error'], key)
            self.assertIsNone(rows[key]['median'], key)
            self.assertIn('too short to time honestly', rows[key]['skip'])
            self.assertIn('under 3600.00 s', rows[key]['skip'])
