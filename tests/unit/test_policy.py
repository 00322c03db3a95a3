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

"""The pure decisions: cluster size, cache size, layouts, raw plans."""

from oslo_utils import units
import testscenarios
import testtools

from prealloc_backend import exception
from prealloc_backend.modes import Mode
from prealloc_backend import policy

load_tests = testscenarios.load_tests_apply_scenarios


class TestAutoClusterSize(testtools.TestCase):
    # (virtual size, expected cluster) with extended_l2: QEMU's default
    # 32 MiB cache of 16-byte entries maps 2 Mi clusters.
    scenarios = [
        ('1G', {'size': units.Gi, 'cluster': 64 * units.Ki}),
        ('128G', {'size': 128 * units.Gi, 'cluster': 64 * units.Ki}),
        ('128G+1', {'size': 128 * units.Gi + 1, 'cluster': 128 * units.Ki}),
        ('256G', {'size': 256 * units.Gi, 'cluster': 128 * units.Ki}),
        ('500G', {'size': 500 * units.Gi, 'cluster': 256 * units.Ki}),
        ('1T', {'size': units.Ti, 'cluster': 512 * units.Ki}),
        ('2T', {'size': 2 * units.Ti, 'cluster': units.Mi}),
        ('3T', {'size': 3 * units.Ti, 'cluster': 2 * units.Mi}),
        ('64T', {'size': 64 * units.Ti, 'cluster': 2 * units.Mi}),
    ]

    def test_auto(self):
        cluster = policy.cluster_size('auto', self.size, extended_l2=True)
        self.assertEqual(self.cluster, cluster)
        if self.size <= 4 * units.Ti:
            # The point of the choice: the default cache covers the disk.
            self.assertGreaterEqual(policy.l2_coverage(cluster, True),
                                    self.size)


class TestClusterSize(testtools.TestCase):

    def test_without_extended_l2_entries_are_8_bytes(self):
        self.assertEqual(64 * units.Ki,
                         policy.cluster_size('auto', 256 * units.Gi, False))
        self.assertEqual(128 * units.Ki,
                         policy.cluster_size('auto', 257 * units.Gi, False))

    def test_fixed(self):
        for name, size in policy.CLUSTER_SIZES.items():
            self.assertEqual(size, policy.cluster_size(name, units.Ti, True))

    def test_unknown_setting_names_value_and_choices(self):
        exc = self.assertRaises(exception.ConflictingOptions,
                                policy.cluster_size, '3K', units.Gi, True)
        self.assertIn("'3K'", str(exc))
        self.assertIn('auto, 64K', str(exc))


class TestMetadataCache(testtools.TestCase):

    def test_full_coverage_1t_512k(self):
        # 2 Mi entries x 16 B = 32 MiB of L2 tables + 4 refcount clusters.
        self.assertEqual(32 * units.Mi + 4 * 512 * units.Ki,
                         policy.metadata_cache_bytes(
                             'full-coverage', 64, units.Ti, 512 * units.Ki,
                             True))

    def test_partial_tables_round_up_to_a_cluster(self):
        # 1 GiB at 64K: 16384 entries x 16 B = 256 KiB = 4 tables.
        self.assertEqual(256 * units.Ki + 4 * 64 * units.Ki,
                         policy.metadata_cache_bytes(
                             'full-coverage', 64, units.Gi, 64 * units.Ki,
                             True))
        # 1 MiB disk: one 64K table, not 1 KiB.
        self.assertEqual(64 * units.Ki + 4 * 64 * units.Ki,
                         policy.metadata_cache_bytes(
                             'full-coverage', 64, units.Mi, 64 * units.Ki,
                             True))

    def test_capped(self):
        self.assertEqual(64 * units.Mi, policy.metadata_cache_bytes(
            'full-coverage', 64, 16 * units.Ti, 64 * units.Ki, True))

    def test_qemu_default_emits_nothing(self):
        self.assertIsNone(policy.metadata_cache_bytes(
            'qemu-default', 64, units.Ti, 512 * units.Ki, True))


class TestQcow2Layout(testtools.TestCase):

    def layout(self, mode, fallocate_ok=True, fallocate_policy='warn',
               extended_l2=True, size=units.Gi):
        return policy.qcow2_overlay_layout(
            mode, size, extended_l2, 'auto', fallocate_ok,
            fallocate_policy, '/i/disk', 'ext4')

    def test_modes(self):
        for mode, prealloc in (
                (Mode.NONE, 'off'), (Mode.METADATA, 'metadata'),
                (Mode.SPACE, 'falloc'), (Mode.FULL, 'full')):
            layout = self.layout(mode)
            self.assertEqual(prealloc, layout.preallocation)
            self.assertTrue(layout.extended_l2)
            self.assertIsNone(layout.warning)

    def test_no_fallocate_warn_uses_metadata(self):
        layout = self.layout(Mode.SPACE, fallocate_ok=False)
        self.assertEqual('metadata', layout.preallocation)
        self.assertIn('fallocate_unsupported=warn', layout.warning)

    def test_no_fallocate_zero_fill_uses_full(self):
        layout = self.layout(Mode.SPACE, False, 'zero-fill')
        self.assertEqual('full', layout.preallocation)

    def test_no_fallocate_fail(self):
        exc = self.assertRaises(exception.FallocateUnsupported,
                                self.layout, Mode.SPACE, False, 'fail')
        self.assertIn('/i/disk', str(exc))
        self.assertIn('ext4', str(exc))

    def test_full_ignores_fallocate_support(self):
        self.assertEqual('full',
                         self.layout(Mode.FULL, False, 'fail').preallocation)

    def test_without_extended_l2_overlays_stay_thin(self):
        layout = self.layout(Mode.SPACE, extended_l2=False)
        self.assertEqual('off', layout.preallocation)
        self.assertIn('qcow2_extended_l2 is off', layout.warning)

    def test_resize_preallocation(self):
        self.assertEqual('falloc', policy.qcow2_resize_preallocation(
            Mode.SPACE, True, 'warn', '/p'))
        self.assertEqual('metadata', policy.qcow2_resize_preallocation(
            Mode.SPACE, False, 'warn', '/p'))
        self.assertEqual('full', policy.qcow2_resize_preallocation(
            Mode.SPACE, False, 'zero-fill', '/p'))
        self.assertRaises(exception.FallocateUnsupported,
                          policy.qcow2_resize_preallocation,
                          Mode.SPACE, False, 'fail', '/p')


class TestRawPlan(testtools.TestCase):
    # (mode, fallocate supported, policy) -> action
    scenarios = [
        ('none', {'mode': Mode.NONE, 'ok': True, 'pol': 'warn',
                  'action': policy.RAW_NOTHING}),
        ('metadata', {'mode': Mode.METADATA, 'ok': True, 'pol': 'warn',
                      'action': policy.RAW_NOTHING}),
        ('space', {'mode': Mode.SPACE, 'ok': True, 'pol': 'fail',
                   'action': policy.RAW_FALLOCATE}),
        ('full', {'mode': Mode.FULL, 'ok': True, 'pol': 'warn',
                  'action': policy.RAW_ZERO_FILL}),
        ('full-nofalloc', {'mode': Mode.FULL, 'ok': False, 'pol': 'fail',
                           'action': policy.RAW_ZERO_FILL}),
        ('space-nofalloc-warn', {'mode': Mode.SPACE, 'ok': False,
                                 'pol': 'warn',
                                 'action': policy.RAW_NOTHING}),
        ('space-nofalloc-zero', {'mode': Mode.SPACE, 'ok': False,
                                 'pol': 'zero-fill',
                                 'action': policy.RAW_ZERO_FILL}),
    ]

    def test_plan(self):
        plan = policy.raw_plan(self.mode, self.ok, self.pol, '/p')
        self.assertEqual(self.action, plan.action)
        if self.mode is Mode.SPACE and not self.ok and self.pol == 'warn':
            self.assertIn('left thin', plan.warning)

    def test_fail(self):
        if self.mode is Mode.SPACE:
            self.assertRaises(exception.FallocateUnsupported,
                              policy.raw_plan, self.mode, False, 'fail', '/p')
