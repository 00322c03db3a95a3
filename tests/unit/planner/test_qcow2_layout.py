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

"""The qcow2 layout formulas: cluster size, metadata cache, needed bytes.

Needed bytes are compared with what qemu-img itself measures and creates
(qemu-img runs here without root).
"""

import json
import os
import subprocess

import fixtures
from oslo_utils import units
import testscenarios

from prealloc_backend import exception
from prealloc_backend.planner.modes import Mode
from prealloc_backend.planner import qcow2_layout
from prealloc_backend.planner.qcow2_layout import Qcow2Preallocation as P
from tests import base
from tests.unit.planner.test_diskplan import PlanTestCase
from tests.unit.planner.test_diskplan import RAW

load_tests = testscenarios.load_tests_apply_scenarios

GROUP = 'prealloc_backend'


def qemu_measure(size, cluster, extended_l2, preallocation):
    out = subprocess.run(
        ['qemu-img', 'measure', '--output=json', '-O', 'qcow2', '-o',
         'cluster_size=%d,extended_l2=%s,preallocation=%s'
         % (cluster, 'on' if extended_l2 else 'off', preallocation),
         '--size', str(size)], check=True, capture_output=True,
        text=True).stdout
    return json.loads(out)


class TestClusterSize(PlanTestCase):

    def test_128k_at_every_size(self):
        for size in (units.Mi, units.Gi, 128 * units.Gi + 1, units.Ti,
                     64 * units.Ti):
            for mode in (Mode.METADATA, Mode.SPACE, Mode.FULL):
                plan = self.plan(mode, size=size)
                self.assertEqual(128 * units.Ki, plan.cluster_size)
                self.assertTrue(plan.extended_l2)

    def test_option_chooses(self):
        for name, size in qcow2_layout.CLUSTER_SIZES.items():
            self.flags(group=GROUP, qcow2_cluster_size=name)
            self.assertEqual(size, self.plan(Mode.SPACE).cluster_size)

    def test_flavor_overrides_option(self):
        self.flags(group=GROUP, qcow2_cluster_size='256K')
        plan = self.plan(Mode.SPACE, specs={'prealloc:cluster_size': '2M'})
        self.assertEqual(2 * units.Mi, plan.cluster_size)
        plan = self.plan(Mode.SPACE, specs={'prealloc:cluster_size': '64K'})
        self.assertEqual(64 * units.Ki, plan.cluster_size)

    def test_bad_flavor_value_names_key_and_choices(self):
        exc = self.assertRaises(exception.InvalidFlavorPolicy, self.plan,
                                Mode.SPACE,
                                specs={'prealloc:cluster_size': '3K'})
        self.assertIn("'3K'", str(exc))
        self.assertIn('prealloc:cluster_size', str(exc))
        self.assertIn('64K, 128K, 256K, 512K, 1M, 2M', str(exc))

    def test_option_refuses_auto(self):
        # The former per-size choice made large disks 3-8x slower.
        self.assertRaises(ValueError, self.flags, group=GROUP,
                          qcow2_cluster_size='auto')


class TestMetadataCache(PlanTestCase):

    def test_default_cache_covers_small_disks(self):
        # QEMU's 32 MiB of 16-byte entries maps 256 GiB of 128K clusters.
        self.assertIsNone(self.plan(Mode.METADATA,
                                    size=256 * units.Gi).metadata_cache_bytes)

    def test_covers_the_whole_disk(self):
        # 1 TiB / 128K = 8 Mi entries x 16 B = 128 MiB, + 4 clusters.
        self.assertEqual(128 * units.Mi + 4 * 128 * units.Ki,
                         self.plan(Mode.SPACE,
                                   size=units.Ti).metadata_cache_bytes)
        # 257 GiB: one more 128K L2 table (8192 entries) than 256 GiB.
        self.assertEqual(32 * units.Mi + 128 * units.Ki + 4 * 128 * units.Ki,
                         self.plan(Mode.METADATA, size=257 * units.Gi)
                         .metadata_cache_bytes)

    def test_partial_cover_is_none_and_logged_once(self):
        log = self.useFixture(fixtures.FakeLogger(
            name='prealloc_backend.planner.qcow2_layout'))
        self.flags(group=GROUP, qcow2_metadata_cache_max_mb=128)
        self.assertIsNone(self.plan(Mode.SPACE, size=units.Ti)
                          .metadata_cache_bytes)
        self.assertIsNone(self.plan(Mode.METADATA, size=units.Ti)
                          .metadata_cache_bytes)
        self.assertEqual(1, log.output.count('partial cover is slower'))
        self.assertIn('qcow2_metadata_cache_max_mb = 128', log.output)
        # One MiB more and it covers.
        self.flags(group=GROUP, qcow2_metadata_cache_max_mb=129)
        self.assertIsNotNone(self.plan(Mode.SPACE, size=units.Ti)
                             .metadata_cache_bytes)

    def test_qemu_default_emits_nothing(self):
        self.flags(group=GROUP, qcow2_l2_cache='qemu-default')
        self.assertIsNone(self.plan(Mode.SPACE,
                                    size=units.Ti).metadata_cache_bytes)

    def test_raw_has_none(self):
        self.assertIsNone(self.plan(Mode.SPACE, RAW,
                                    size=units.Ti).metadata_cache_bytes)


class TestNeededBytesAgainstQemu(base.TestCase):
    """make_plan's pure formula against qemu-img's own figures."""
    scenarios = testscenarios.multiply_scenarios(
        [('1M', {'size': units.Mi}),
         ('3G+1', {'size': 3 * units.Gi + 1}),
         ('100G', {'size': 100 * units.Gi}),
         ('1T', {'size': units.Ti}),
         ('16T', {'size': 16 * units.Ti})],
        [('64K', {'cluster': 64 * units.Ki}),
         ('128K', {'cluster': 128 * units.Ki}),
         ('2M', {'cluster': 2 * units.Mi})],
        [('xl2', {'xl2': True}), ('plain', {'xl2': False})])

    def test_metadata_and_full(self):
        for prealloc, key in ((P.METADATA, 'required'),
                              (P.FALLOC, 'fully-allocated'),
                              (P.FULL, 'fully-allocated')):
            measured = qemu_measure(self.size, self.cluster, self.xl2,
                                    prealloc.value)[key]
            self.assertEqual(measured, qcow2_layout.qcow2_needed_bytes(
                self.size, prealloc, self.cluster, self.xl2))

    def test_thin_within_a_cluster_of_what_qemu_img_creates(self):
        if self.size > units.Ti:
            self.skipTest('a thin 16T image is the same, only slower')
        path = os.path.join(self.instances_path, 'thin.qcow2')
        subprocess.run(
            ['qemu-img', 'create', '-q', '-f', 'qcow2', '-o',
             'cluster_size=%d,extended_l2=%s'
             % (self.cluster, 'on' if self.xl2 else 'off'), path,
             str(self.size)], check=True)
        made = os.stat(path).st_size
        needed = qcow2_layout.qcow2_needed_bytes(self.size, P.OFF,
                                                 self.cluster, self.xl2)
        self.assertGreaterEqual(needed, made)
        self.assertLess(needed - made, self.cluster)
