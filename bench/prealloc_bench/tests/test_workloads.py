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

"""bench/prealloc_bench/workloads.py: the registry and the facts shown
per disk (the plans of the sweeps are in prealloc_bench/tests/test_bench.py).
"""

from oslo_utils import units

from prealloc_bench import variants
from prealloc_bench import workloads
from tests import base


def disk(fmt='qcow2', cache_size=None, cluster_size=None, extended=False):
    return variants.Disk(variant=variants.PLUGIN_SPACE, path='/d', fmt=fmt,
                         create_seconds=0.0, cache_size=cache_size,
                         cluster_size=cluster_size, extended_l2=extended,
                         libvirt_io='native', workdir='/w')


class WorkloadsTestCase(base.TestCase):

    def test_registry_names_are_unique_workloads(self):
        found = workloads.instances()
        self.assertEqual(list(workloads.REGISTRY), [w.name for w in found])
        for w in found:
            self.assertIsInstance(w, workloads.Workload)
            self.assertTrue(w.title, w.name)

    def test_register_adds_in_order(self):
        saved = dict(workloads.REGISTRY)
        self.addCleanup(lambda: (workloads.REGISTRY.clear(),
                                 workloads.REGISTRY.update(saved)))

        @workloads.register
        class Extra(workloads.Workload):
            name = 'extra-test'
        self.assertIs(Extra, workloads.REGISTRY['extra-test'])
        self.assertEqual('extra-test', list(workloads.REGISTRY)[-1])

    def test_disk_facts(self):
        self.assertEqual({'cluster': '64 KiB ext-L2',
                          'cache': 'cache-size 1 MiB', 'format': 'qcow2'},
                         workloads.disk_facts(disk(
                             cache_size=units.Mi, cluster_size=64 * units.Ki,
                             extended=True)))
        self.assertEqual({'cluster': '-', 'cache': 'QEMU default',
                          'format': 'qcow2'}, workloads.disk_facts(disk()))
        self.assertEqual('-', workloads.cache_text(disk(fmt='raw')))
        self.assertEqual('256K asked', workloads.sweep_group('256K'))
