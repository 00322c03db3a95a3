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

"""The disk plan: layout, raw actions, needed bytes, metadata cache.

Needed bytes are compared with what qemu-img itself measures and creates
(qemu-img runs here without root).
"""

import dataclasses

from oslo_utils import units
import testscenarios

from prealloc_backend import conf
from prealloc_backend import exception
from prealloc_backend.planner import diskplan
from prealloc_backend.planner.diskplan import DiskFormat
from prealloc_backend.planner.diskplan import RawAction
from prealloc_backend.planner.modes import Mode
from prealloc_backend.planner import qcow2_layout
from prealloc_backend.planner.qcow2_layout import Qcow2Preallocation as P
from tests import base

load_tests = testscenarios.load_tests_apply_scenarios

RAW = DiskFormat.RAW
QCOW2 = DiskFormat.QCOW2
ROOMY = diskplan.FsFacts(fallocate_ok=True, fstype='xfs', free_bytes=units.Pi)
NO_FALLOCATE = diskplan.FsFacts(fallocate_ok=False, fstype='ext3',
                              free_bytes=units.Pi)
GROUP = 'prealloc_backend'


class PlanTestCase(base.TestCase):

    def plan(self, mode, fmt=QCOW2, size=units.Gi, fs=ROOMY, specs=None,
             **kwargs):
        return diskplan.make_plan(base.CONF.prealloc_backend, specs, mode, fmt,
                                size, fs, path='/i/disk', **kwargs)


class TestQcow2Preallocation(PlanTestCase):
    scenarios = [
        ('metadata', {'mode': Mode.METADATA, 'fs': ROOMY, 'pol': 'fail',
                      'prealloc': P.METADATA, 'warn': None}),
        ('space', {'mode': Mode.SPACE, 'fs': ROOMY, 'pol': 'fail',
                   'prealloc': P.FALLOC, 'warn': None}),
        ('full', {'mode': Mode.FULL, 'fs': ROOMY, 'pol': 'warn',
                  'prealloc': P.FULL, 'warn': None}),
        ('full-nofalloc', {'mode': Mode.FULL, 'fs': NO_FALLOCATE,
                           'pol': 'fail', 'prealloc': P.FULL, 'warn': None}),
        ('space-nofalloc-warn', {'mode': Mode.SPACE, 'fs': NO_FALLOCATE,
                                 'pol': 'warn', 'prealloc': P.METADATA,
                                 'warn': 'fallocate_unsupported=warn'}),
        ('space-nofalloc-zero', {'mode': Mode.SPACE, 'fs': NO_FALLOCATE,
                                 'pol': 'zero-fill', 'prealloc': P.FULL,
                                 'warn': None}),
    ]

    def test_plan(self):
        self.flags(group=GROUP, fallocate_unsupported=self.pol)
        plan = self.plan(self.mode, fs=self.fs)
        self.assertIs(self.mode, plan.mode)
        self.assertIs(QCOW2, plan.fmt)
        self.assertIs(self.prealloc, plan.preallocation)
        self.assertIsNone(plan.raw_action)
        if self.warn is None:
            self.assertIsNone(plan.warning)
        else:
            self.assertIn(self.warn, plan.warning)
            self.assertIn('ext3', plan.warning)

    def test_without_extended_l2_overlays_stay_thin(self):
        self.flags(group=GROUP, qcow2_extended_l2=False,
                   fallocate_unsupported=self.pol)
        plan = self.plan(self.mode, fs=self.fs)
        self.assertIs(P.OFF, plan.preallocation)
        self.assertFalse(plan.extended_l2)
        self.assertIn('no extended_l2', plan.warning)
        # Without a backing file QEMU preallocates anyway.
        plan = self.plan(self.mode, fs=self.fs, backing=False)
        self.assertIs(self.prealloc, plan.preallocation)


class TestRawAction(PlanTestCase):
    # (mode, fallocate supported, policy) -> action
    scenarios = [
        ('none', {'mode': Mode.NONE, 'fs': ROOMY, 'pol': 'warn',
                  'action': RawAction.NOTHING}),
        ('metadata', {'mode': Mode.METADATA, 'fs': ROOMY, 'pol': 'warn',
                      'action': RawAction.NOTHING}),
        ('space', {'mode': Mode.SPACE, 'fs': ROOMY, 'pol': 'fail',
                   'action': RawAction.FALLOCATE}),
        ('full', {'mode': Mode.FULL, 'fs': ROOMY, 'pol': 'warn',
                  'action': RawAction.ZERO_FILL}),
        ('full-nofalloc', {'mode': Mode.FULL, 'fs': NO_FALLOCATE,
                           'pol': 'fail', 'action': RawAction.ZERO_FILL}),
        ('space-nofalloc-warn', {'mode': Mode.SPACE, 'fs': NO_FALLOCATE,
                                 'pol': 'warn',
                                 'action': RawAction.NOTHING}),
        ('space-nofalloc-zero', {'mode': Mode.SPACE, 'fs': NO_FALLOCATE,
                                 'pol': 'zero-fill',
                                 'action': RawAction.ZERO_FILL}),
    ]

    def test_plan(self):
        self.flags(group=GROUP, fallocate_unsupported=self.pol)
        plan = self.plan(self.mode, RAW, fs=self.fs)
        self.assertIs(self.action, plan.raw_action)
        self.assertIsNone(plan.preallocation)
        self.assertEqual(0 if self.action is RawAction.NOTHING else units.Gi,
                         plan.needed_bytes)
        if self.mode is Mode.SPACE and not self.fs.fallocate_ok:
            if self.pol == 'warn':
                self.assertIn('left thin', plan.warning)
        else:
            self.assertIsNone(plan.warning)

    def test_fail_policy(self):
        """With fallocate_unsupported=fail on a filesystem without it, only
        mode space refuses; every other mode plans what it plans anyway.
        """
        self.flags(group=GROUP, fallocate_unsupported='fail')
        if self.mode is Mode.SPACE:
            exc = self.assertRaises(exception.FallocateUnsupported,
                                    self.plan, self.mode, RAW,
                                    fs=NO_FALLOCATE)
            self.assertIn('/i/disk', str(exc))
            self.assertIn('ext3', str(exc))
        else:
            plan = self.plan(self.mode, RAW, fs=NO_FALLOCATE)
            self.assertIs(self.action, plan.raw_action)
            self.assertIsNone(plan.warning)


class TestSpace(PlanTestCase):

    def test_space_warn_without_fallocate_needs_only_a_thin_disk(self):
        # The case backend and policy used to disagree on: the raw disk
        # stays thin, so it needs nothing and fits on a full filesystem.
        full = dataclasses.replace(NO_FALLOCATE, free_bytes=0)
        plan = self.plan(Mode.SPACE, RAW, fs=full)
        self.assertIs(RawAction.NOTHING, plan.raw_action)
        self.assertEqual(0, plan.needed_bytes)
        self.assertEqual(0, plan.to_allocate)
        self.assertTrue(plan.fits)
        self.assertIn('left thin', plan.warning)

    def test_new_disk_that_does_not_fit(self):
        small = dataclasses.replace(ROOMY, free_bytes=units.Gi)
        plan = self.plan(Mode.SPACE, RAW, fs=small)
        self.assertTrue(plan.fits)
        plan = self.plan(Mode.SPACE, RAW, size=units.Gi + 1, fs=small)
        self.assertFalse(plan.fits)
        self.assertIs(RawAction.FALLOCATE, plan.raw_action)
        self.assertEqual(units.Gi + 1, plan.to_allocate)

    def test_existing_raw_needs_its_holes_only(self):
        existing = diskplan.ExistingDisk(allocated_bytes=units.Gi // 4,
                                       virtual_size=units.Gi)
        plan = self.plan(Mode.SPACE, RAW, existing=existing)
        self.assertTrue(plan.existing)
        self.assertEqual(units.Gi, plan.needed_bytes)
        self.assertEqual(units.Gi * 3 // 4, plan.to_allocate)

    def test_existing_disk_never_failed_for_space(self):
        existing = diskplan.ExistingDisk(allocated_bytes=0,
                                       virtual_size=units.Gi)
        full = dataclasses.replace(ROOMY, free_bytes=units.Mi)
        plan = self.plan(Mode.FULL, RAW, fs=full, existing=existing)
        self.assertTrue(plan.fits)
        self.assertIs(RawAction.NOTHING, plan.raw_action)
        self.assertEqual(0, plan.to_allocate)
        self.assertIn('left thin', plan.warning)
        self.assertIn('%d free' % units.Mi, plan.warning)
        qcow2 = diskplan.ExistingDisk(allocated_bytes=units.Mi,
                                    virtual_size=units.Gi,
                                    cluster_size=64 * units.Ki,
                                    extended_l2=True)
        plan = self.plan(Mode.SPACE, fs=full, size=2 * units.Gi,
                         existing=qcow2)
        self.assertTrue(plan.fits)
        self.assertIs(P.OFF, plan.preallocation)
        self.assertIn('left thin', plan.warning)

    def test_existing_disk_not_failed_by_fallocate_policy(self):
        self.flags(group=GROUP, fallocate_unsupported='fail')
        existing = diskplan.ExistingDisk(allocated_bytes=0,
                                       virtual_size=units.Gi)
        plan = self.plan(Mode.SPACE, RAW, fs=NO_FALLOCATE, existing=existing)
        self.assertIs(RawAction.NOTHING, plan.raw_action)
        self.assertIn('left thin', plan.warning)

    def test_existing_qcow2_keeps_its_layout(self):
        existing = diskplan.ExistingDisk(allocated_bytes=0,
                                       virtual_size=units.Gi,
                                       cluster_size=2 * units.Mi,
                                       extended_l2=True)
        plan = self.plan(Mode.SPACE, existing=existing)
        self.assertEqual(2 * units.Mi, plan.cluster_size)
        self.assertTrue(plan.extended_l2)

    def test_existing_overlay_without_extended_l2_grows_thin(self):
        existing = diskplan.ExistingDisk(allocated_bytes=units.Mi,
                                       virtual_size=units.Gi,
                                       cluster_size=64 * units.Ki)
        plan = self.plan(Mode.SPACE, size=2 * units.Gi, existing=existing)
        self.assertFalse(plan.extended_l2)
        self.assertIs(P.OFF, plan.preallocation)
        self.assertIn('no extended_l2', plan.warning)

    def test_growth_needs_at_least_the_new_metadata(self):
        # The file holds guest data beyond its metadata: what growing
        # still needs is the metadata of the new area.
        cluster = 128 * units.Ki
        existing = diskplan.ExistingDisk(allocated_bytes=units.Gi,
                                       virtual_size=units.Gi,
                                       cluster_size=cluster,
                                       extended_l2=True)
        plan = self.plan(Mode.METADATA, size=10 * units.Gi,
                         existing=existing)
        self.assertEqual(
            qcow2_layout.qcow2_metadata_bytes(10 * units.Gi, cluster, True) -
            qcow2_layout.qcow2_metadata_bytes(units.Gi, cluster, True),
            plan.to_allocate)
        self.assertGreater(plan.to_allocate, 0)


class TestModeNone(PlanTestCase):

    def test_qcow2_is_nova_s_overlay(self):
        self.flags(group=GROUP, qcow2_cluster_size='2M')
        plan = self.plan(Mode.NONE, size=units.Ti, fs=None,
                         specs={'prealloc:cluster_size': '256K'})
        self.assertIs(P.OFF, plan.preallocation)
        self.assertIsNone(plan.cluster_size)
        self.assertFalse(plan.extended_l2)
        self.assertIsNone(plan.metadata_cache_bytes)
        self.assertIsNone(plan.warning)
        self.assertTrue(plan.fits)
        self.assertTrue(plan.stock)

    def test_raw_is_left_alone(self):
        plan = self.plan(Mode.NONE, RAW, fs=None)
        self.assertIs(RawAction.NOTHING, plan.raw_action)
        self.assertEqual(0, plan.needed_bytes)

    def test_other_modes_need_filesystem_facts(self):
        self.assertRaises(ValueError, self.plan, Mode.SPACE, fs=None)

    def test_mode_is_the_callers_decision(self):
        # The disk's mode is decided once, by the caller (modes.disk_mode):
        # a flavor's prealloc:mode is not read again here.
        plan = self.plan(Mode.NONE, specs={'prealloc:mode': 'full'})
        self.assertIs(Mode.NONE, plan.mode)
        self.assertIsNone(plan.cluster_size)
        plan = self.plan(Mode.FULL, specs={'prealloc:mode': 'none'})
        self.assertIs(Mode.FULL, plan.mode)
        self.assertIs(P.FULL, plan.preallocation)

    def test_plan_is_frozen(self):
        plan = self.plan(Mode.SPACE)
        self.assertRaises(dataclasses.FrozenInstanceError, setattr, plan,
                          'needed_bytes', 0)


class TestGuestDiscard(base.TestCase):

    def test_every_case(self):
        q, r = DiskFormat.QCOW2, DiskFormat.RAW
        reserved = {(q, Mode.METADATA), (q, Mode.SPACE), (q, Mode.FULL),
                    (r, Mode.SPACE), (r, Mode.FULL)}
        for fmt in (q, r):
            for mode in Mode:
                for nova in (None, 'ignore', 'unmap'):
                    for choice in ('keep', 'zero', 'reclaim'):
                        for capable in (False, True):
                            if (fmt, mode) not in reserved or \
                                    nova != 'unmap' or choice == 'reclaim':
                                want = diskplan.GuestDiscard(nova)
                            elif capable and fmt is q and (
                                    mode is Mode.METADATA or
                                    choice == 'zero'):
                                want = diskplan.GuestDiscard(
                                    'unmap', no_unref=True,
                                    reserve_again=mode is not Mode.METADATA)
                            else:
                                want = diskplan.GuestDiscard('ignore')
                            self.assertEqual(
                                want,
                                diskplan.guest_discard(mode, fmt, nova,
                                                       choice,
                                                       no_unref=capable),
                                (fmt, mode, nova, choice, capable))

    def test_the_promises(self):
        # Whatever the host, keep never lets a TRIM free the blocks of a
        # space or full disk, and only zero reserves again.
        for fmt in DiskFormat:
            for capable in (False, True):
                for mode in (Mode.SPACE, Mode.FULL):
                    keep = diskplan.guest_discard(mode, fmt, 'unmap', 'keep',
                                                  no_unref=capable)
                    self.assertEqual('ignore', keep.discard)
                    self.assertFalse(keep.reserve_again)
        zero = diskplan.guest_discard(Mode.FULL, DiskFormat.QCOW2, 'unmap',
                                      'zero', no_unref=True)
        self.assertEqual(('unmap', True, True),
                         (zero.discard, zero.no_unref, zero.reserve_again))


class TestDiskAsIs(base.TestCase):
    """The plan libvirt_info reads: mode, format, <metadata_cache>."""

    def _existing(self, size=512 * units.Gi):
        return diskplan.ExistingDisk(allocated_bytes=0, virtual_size=size,
                                   cluster_size=64 * units.Ki,
                                   extended_l2=True)

    def test_qcow2_cache_as_make_plan_computes_it(self):
        opts = base.CONF.prealloc_backend
        plan = diskplan.disk_as_is(opts, Mode.SPACE, DiskFormat.QCOW2,
                                 self._existing())
        wanted = qcow2_layout.metadata_cache_for(opts, 512 * units.Gi,
                                           64 * units.Ki, True)
        self.assertIsNotNone(wanted)
        self.assertEqual(wanted, plan.metadata_cache_bytes)
        self.assertEqual((Mode.SPACE, DiskFormat.QCOW2, 512 * units.Gi),
                         (plan.mode, plan.fmt, plan.virtual_size))

    def test_no_cache_in_mode_none_for_raw_or_unread_layout(self):
        opts = base.CONF.prealloc_backend
        for mode, fmt, existing in (
                (Mode.NONE, DiskFormat.QCOW2, self._existing()),
                (Mode.SPACE, DiskFormat.RAW, self._existing()),
                (Mode.SPACE, DiskFormat.QCOW2, None)):
            plan = diskplan.disk_as_is(opts, mode, fmt, existing)
            self.assertIsNone(plan.metadata_cache_bytes)
            self.assertIs(mode, plan.mode)

    def test_layout_read_only_where_the_xml_shows_it(self):
        # layout_shown (backend._plan_as_is reads the disk only where it
        # says so) agrees with what disk_as_is does with a layout: a 512
        # GiB disk of 128K ext-L2 clusters gets both a <metadata_cache>
        # and a <blockio> where they are on.
        existing = diskplan.ExistingDisk(allocated_bytes=0,
                                       virtual_size=512 * units.Gi,
                                       cluster_size=128 * units.Ki,
                                       extended_l2=True)
        for cache, _help in conf.L2_CACHE_CHOICES:
            for advertise in (True, False):
                self.flags(group='prealloc_backend', qcow2_l2_cache=cache,
                           advertise_physical_block_size=advertise)
                opts = base.CONF.prealloc_backend
                for mode in Mode:
                    for fmt in DiskFormat:
                        shown = [(plan.metadata_cache_bytes,
                                  plan.physical_block_size)
                                 for plan in (
                                     diskplan.disk_as_is(opts, mode, fmt,
                                                       existing),
                                     diskplan.disk_as_is(opts, mode, fmt))]
                        self.assertEqual(
                            shown[0] != shown[1],
                            diskplan.layout_shown(opts, mode, fmt),
                            (cache, advertise, mode, fmt, shown))


class TestHostDiskFormat(base.TestCase):

    def test_agrees_with_nova_s_image_backends(self):
        # The format is nova's choice of image backend class, asked of
        # nova itself for every images_type it knows.
        from nova.virt.libvirt import imagebackend
        formats = {imagebackend.Qcow2: diskplan.DiskFormat.QCOW2,
                   imagebackend.Flat: diskplan.DiskFormat.RAW}
        for use_cow in (True, False):
            backends = imagebackend.Backend(use_cow).BACKEND
            self.assertEqual({'raw', 'flat', 'qcow2', 'lvm', 'rbd', 'ploop',
                              'default'}, set(backends))
            for images_type, cls in backends.items():
                self.assertIs(formats.get(cls),
                              diskplan.host_disk_format(images_type, use_cow),
                              (images_type, use_cow))


class TestMayUseNoUnref(base.TestCase):

    def test_asked_exactly_where_the_answer_matters(self):
        for fmt in DiskFormat:
            for mode in Mode:
                for nova in (None, 'ignore', 'unmap'):
                    for choice in ('keep', 'zero', 'reclaim'):
                        matters = (
                            diskplan.guest_discard(mode, fmt, nova, choice,
                                                   no_unref=True) !=
                            diskplan.guest_discard(mode, fmt, nova, choice,
                                                   no_unref=False))
                        may = diskplan.may_use_no_unref(mode, fmt, nova,
                                                        choice)
                        if matters:
                            self.assertTrue(may, (fmt, mode, nova, choice))
