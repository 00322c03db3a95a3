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

"""bench --guest: the in-guest write workload of the real-hypervisor issue.

The real boots run in .ci/run (``prealloc-backend bench --quick --guest``)
and in tests/functional/real; here the workload's own logic.
"""

import fixtures

from prealloc_backend.bench import engine
from prealloc_backend.bench import guest_writes
from prealloc_backend.bench import workloads
from prealloc_backend.cmd import bench as cmd_bench
from prealloc_backend.bench import guest
from tests import base


class GuestWritesTestCase(base.TestCase):

    def test_no_guest_skips_every_variant_with_the_reason(self):
        # NOTE: no kernel anywhere: build_guest's own error, as on a host
        # without the guest cache.
        self.useFixture(fixtures.MockPatchObject(
            guest, 'build_guest',
            side_effect=guest.GuestError('no kernel image found')))
        workload = guest_writes.GuestWrites()
        with engine.Bench(self.instances_path, engine.QUICK) as bench:
            out = bench.run_workload(workload)
        rows = out['cases']
        self.assertEqual(len(workloads.WRITE_VARIANTS), len(rows))
        for row in rows:
            self.assertIn('no kernel image found', row['skip'])
            self.assertEqual([], row['samples'])
        self.assertIn('accelerator: none', out['engine'])

    def test_write_size_fits_the_disk(self):
        workload = guest_writes.GuestWrites()
        for config in (engine.QUICK, engine.DEFAULT):
            with engine.Bench(self.instances_path, config) as bench:
                mib = workload._mib(bench)
            self.assertLessEqual(mib * 2 ** 20, config.write_disk)
            self.assertGreater(mib, 0)

    def test_opt_in_flag(self):
        import argparse
        parser = argparse.ArgumentParser()
        cmd_bench.add_arguments(parser)
        self.assertTrue(parser.parse_args(['--guest']).guest)
        self.assertFalse(parser.parse_args([]).guest)
        self.assertNotIn(guest_writes.GuestWrites.name,
                         [w.name for w in workloads.instances()])
