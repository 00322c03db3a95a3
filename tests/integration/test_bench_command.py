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

"""``prealloc-bench`` run as a command, end to end, on real
qemu-img runs.
"""

import json
import os
import subprocess
import sys

from prealloc_bench import engine
from prealloc_bench import workloads
from tests import base


class CommandRunTestCase(base.TestCase):
    """The real command, end to end, on one workload (``--quick`` itself
    runs in .ci/run).
    """

    def test_one_workload_paired(self):
        out_json = os.path.join(self.instances_path, 'bench.json')
        directory = os.path.join(self.instances_path, 'here')
        # The default sizes, not --quick's: flush-4k's 8192 writes take
        # about 0.5 s and more here, ten times the floor under which a
        # timed run is not shown (--quick's 1024 took 0.06 s at best, and
        # a faster host would have had rows refused as too short). 32M:
        # the disk those 8192 x 4 KiB writes fill once.
        proc = subprocess.run(
            [sys.executable, '-m', 'prealloc_bench.cmd',
             '--reps', '2', '--only', 'flush-4k',
             '--write-size', '32M', '--dir', directory, '--json', out_json],
            capture_output=True, text=True, timeout=600)
        self.assertEqual(0, proc.returncode, proc.stderr[-3000:])
        self.assertNotIn('Traceback', proc.stderr)
        # The scratch directory is gone.
        self.assertEqual([], os.listdir(directory))
        with open(out_json) as f:
            data = json.load(f)
        self.assertEqual(engine.SCHEMA_VERSION, data['schema'])
        self.assertEqual(2, data['config']['reps'])
        self.assertEqual(engine.DEFAULT.flush_writes,
                         data['config']['flush_writes'])
        self.assertEqual(('native', 'none'), (data['host']['aio'],
                                              data['host']['cache']))
        (w,) = data['workloads']
        self.assertEqual('flush-4k', w['name'])
        self.assertIn('--flush-interval=16', w['engine'])
        self.assertEqual({v.key for v in workloads.WRITE_VARIANTS},
                         {c['variant'] for c in w['cases']})
        for row in w['cases']:
            self.assertIsNone(row['error'], row)
            self.assertIsNone(row['skip'], row)
            self.assertEqual(2, len(row['samples']))
            self.assertLessEqual(row['min'], row['median'])
            self.assertLessEqual(row['median'], row['max'])
        plugin_none = [c for c in w['cases']
                       if c['variant'] == 'plugin-none'][0]
        nova_none = [c for c in w['cases'] if c['variant'] == 'nova-none'][0]
        paired = plugin_none['ratios']['nova-none']
        self.assertEqual([a / b for a, b in zip(plugin_none['samples'],
                                                nova_none['samples'])],
                         paired['samples'])
        names = [t['name'] for t in data['targets']]
        self.assertIn('flush-4k: plugin none / stock nova (none)', names)
        for target in data['targets']:
            self.assertTrue(target['met'] is not None or target['why'])
        self.assertIn('Targets (median of the paired ratios', proc.stdout)
