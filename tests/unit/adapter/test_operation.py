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

"""prealloc_backend.adapter.operation: one nova call, its facts read once,
one plan; the record of a migration being finished; the raw allocation
with its fallback and cancellation. Real qemu-img and real files (the
privileged calls run in-process, tests/base.py).
"""

import logging
import os
import subprocess
import threading
import traceback

import fixtures
from nova.compute import task_states
from nova.tests.fixtures import libvirt as fakelibvirt
from nova.virt import fake as fake_virt
from oslo_concurrency import processutils
from oslo_utils import units

from prealloc_backend.adapter import driver
from prealloc_backend.adapter import operation
from prealloc_backend.disk import allocate
from prealloc_backend.disk import formats
from prealloc_backend.disk import fsprobe
from prealloc_backend.disk import journal
from prealloc_backend.disk import qemu
from prealloc_backend import exception
from prealloc_backend.planner import diskplan
from prealloc_backend.planner.modes import Mode
from prealloc_backend.planner import qcow2_layout
from tests import base
from tests import fixtures as pb_fixtures


class Counter(fixtures.Fixture):
    """Counts the calls of ``module.name`` (the real one still runs)."""

    def __init__(self, module, name):
        super().__init__()
        self.module, self.name = module, name
        self.calls = []

    def _setUp(self):
        real = getattr(self.module, self.name)

        def counted(*args, **kwargs):
            self.calls.append(args)
            return real(*args, **kwargs)
        self.useFixture(fixtures.MockPatchObject(self.module, self.name,
                                                 counted))


class TestOneQcow2Resize(base.BackendTestCase):
    """A qcow2 resize (nova's cache() of a larger size): the disk's format
    decided once, its ``qemu-img info`` read once for the check (with its
    qcow2 backing file's), the growth verified from its header, one plan.
    """

    def _counters(self):
        return (self.useFixture(Counter(qemu, 'info')),
                self.useFixture(Counter(formats, 'checked_format')),
                self.useFixture(Counter(diskplan, 'make_plan')))

    def assert_one_grow(self, img, base_path):
        """nova's cache() of twice the size: one format decision, the
        disk's (and its qcow2 base's) info for the check, one plan; grown,
        allocated, same data.
        """
        infos, decisions, plans = self._counters()
        self.cache(img, fmt='qcow2', size=2 * base.DISK)
        self.assertEqual(1, len(decisions.calls))
        self.assertEqual([img.path, base_path],
                         [args[0] for args in infos.calls])
        self.assertEqual(1, len(plans.calls))
        self.assertEqual(2 * base.DISK, img.plan.virtual_size)
        self.assertEqual(2 * base.DISK,
                         pb_fixtures.qemu_img_info(img.path)['virtual-size'])
        self.assertGreaterEqual(pb_fixtures.allocated(img.path),
                                2 * base.DISK)
        self.assert_same_content(img.path, base_path)

    def test_grow_in_mode_space(self):
        img = self.image('qcow2', 'space')
        self.assert_one_grow(img, self.cache(img, fmt='qcow2'))

    def test_relayout_then_grow_by_one_plan(self):
        # nova's own overlay (mode none), grown in mode space: rewritten
        # with extended_l2, then grown, by one plan of the new size.
        img = self.image('qcow2', 'none')
        base_path = self.cache(img, fmt='qcow2')
        self.flags(mode='space', group='prealloc_backend')
        img = self.image('qcow2', instance=self.instance)
        self.assert_one_grow(img, base_path)
        info = pb_fixtures.qemu_img_info(img.path)
        self.assertTrue(info['format-specific']['data']['extended-l2'])

    def test_copied_overlay_refilled_without_a_second_plan(self):
        # A disk nova copied sparsely (resize), then grown: the growth
        # plan counted its holes (st_blocks) and refills them.
        img = self.image('qcow2', 'space')
        base_path = self.cache(img, fmt='qcow2')
        copy = img.path + '.copy'
        subprocess.run(['cp', '--sparse=always', img.path, copy], check=True)
        os.rename(copy, img.path)
        self.assertLess(pb_fixtures.allocated(img.path), base.DISK // 2)
        _infos, _decisions, plans = self._counters()
        self.cache(img, fmt='qcow2', size=2 * base.DISK)
        self.assertEqual(1, len(plans.calls))
        self.assertGreaterEqual(pb_fixtures.allocated(img.path),
                                2 * base.DISK)
        self.assert_same_content(img.path, base_path)


class QemuImgInfos(fixtures.Fixture):
    """Every ``qemu-img info`` process started in this process (the
    plugin's and nova's, all through oslo.concurrency's processutils; the
    real ones still run), as (file relative to instances_path, whose):
    'nova' for nova's own Image.cache() asking a base's size that the
    operation has not read (the plugin's get_disk_size handing it on),
    'plugin' for every other. An overlay's temporary name counts as the
    disk's.
    """

    def __init__(self, instances_path):
        super().__init__()
        self.top = instances_path

    def _setUp(self):
        self.calls = []
        real = processutils.execute

        def counted(*cmd, **kwargs):
            if 'qemu-img' in cmd and 'info' in cmd:
                path = [a for a in cmd if str(a).startswith(self.top)][-1]
                name = os.path.relpath(path, self.top)
                self.calls.append((name.replace(journal.TMP_SUFFIX, ''),
                                   self._whose()))
            return real(*cmd, **kwargs)
        self.useFixture(fixtures.MockPatchObject(processutils, 'execute',
                                                 counted))

    @staticmethod
    def _whose():
        stack = traceback.extract_stack()[:-2]
        for index in range(len(stack) - 1, 0, -1):
            if '/prealloc_backend/' in stack[index].filename:
                caller = stack[index - 1]
                if (stack[index].name == 'get_disk_size' and
                        caller.name == 'cache' and
                        caller.filename.endswith('imagebackend.py')):
                    return 'nova'
                return 'plugin'
        return 'nova'

    def take(self):
        calls, self.calls = self.calls, []
        return calls


class TestQemuImgInfoPerNovaCall(base.BackendTestCase):
    """At most one ``qemu-img info`` per file per nova call on the
    plugin's side, counted on the real processes: what the operation
    made or read is handed on, never read again. On 32c177c a new qcow2
    instance's cache() ran 6 (the base 4 times: the check, nova's
    verify_base_size, nova's cache(), the new disk's check; the disk twice:
    made, then checked again by a growth that had nothing to do), a qcow2
    resize 4.
    """

    def disk(self):
        return '%s/disk' % self.instance.uuid

    def test_a_new_qcow2_instance(self):
        img = self.image('qcow2', 'space')
        infos = self.useFixture(QemuImgInfos(self.instances_path))
        self.cache(img, fmt='qcow2')
        # The base once (formats.checked_base), the new disk once (made:
        # qemu.check_overlay); nova's cache() asks the base's size of the
        # operation, verify_base_size is given it.
        self.assertEqual([('_base/base-image', 'plugin'),
                          (self.disk(), 'plugin')], infos.take())
        self.image('qcow2', instance=self.instance).libvirt_info('none', {})
        self.assertEqual([(self.disk(), 'plugin')], infos.take())

    def test_a_qcow2_resize(self):
        img = self.image('qcow2', 'space')
        self.cache(img, fmt='qcow2')
        infos = self.useFixture(QemuImgInfos(self.instances_path))
        self.cache(self.image('qcow2', instance=self.instance), fmt='qcow2',
                   size=2 * base.DISK)
        # nova's cache() reads the base's size first; the disk is checked
        # (with its qcow2 base) once, its growth verified from its header.
        self.assertEqual([('_base/base-image', 'nova'),
                          (self.disk(), 'plugin'),
                          ('_base/base-image', 'plugin')], infos.take())

    def test_a_raw_disk_migrated_to_a_qcow2_host(self):
        self.useFixture(fakelibvirt.LibvirtFixture())
        img = self.image('raw', 'space', use_cow=False)
        self.cache(img, fmt='raw')
        formats.record_format(img.path, 'raw')
        drv = driver.LibvirtDriver(fake_virt.FakeVirtAPI())
        infos = self.useFixture(QemuImgInfos(self.instances_path))
        with operation.MIGRATIONS.finishing(self.instance, {'disk': 'raw'}):
            self.cache(self.image('qcow2', instance=self.instance),
                       fmt='raw', size=2 * base.DISK)
            self.assertEqual([('_base/base-image', 'nova')], infos.take())
            drv._disk_raw_to_qcow2(img.path)
            self.assertEqual([], infos.take())
        self.image('qcow2', instance=self.instance).libvirt_info('none', {})
        self.assertEqual([(self.disk(), 'plugin')], infos.take())
        self.assertEqual('qcow2',
                         pb_fixtures.qemu_img_info(img.path)['format'])


class TestFacts(base.BackendTestCase):

    def _op(self, path, **kwargs):
        return operation.DiskOperation(path, {}, made_as='qcow2', **kwargs)

    def test_mode_decided_once(self):
        decided = self.useFixture(Counter(operation.modes, 'disk_mode'))
        self.flags(mode='space', group='prealloc_backend')
        op = self._op(os.path.join(self.instances_path, 'x', 'disk'))
        self.flags(mode='metadata', group='prealloc_backend')
        self.assertIs(Mode.SPACE, op.mode)
        self.assertEqual(1, len(decided.calls))

    def test_filesystem_probed_once_then_again_without_fallocate(self):
        self.flags(mode='space', fallocate_unsupported='warn',
                   group='prealloc_backend')
        path = os.path.join(self.instances_path, 'disk')
        with open(path, 'wb') as f:
            f.truncate(units.Mi)
        probes = self.useFixture(Counter(fsprobe, 'facts'))
        op = self._op(path)
        op.make_plan(diskplan.DiskFormat.RAW, units.Mi)
        op.make_plan(diskplan.DiskFormat.RAW, units.Mi)
        self.assertEqual(1, len(probes.calls))
        fsprobe.record_unsupported(self.instances_path)
        self.addCleanup(fsprobe.forget)
        plan = op.replan_without_fallocate()
        self.assertEqual(2, len(probes.calls))
        self.assertIs(diskplan.RawAction.NOTHING, plan.raw_action)
        self.assertIn('without fallocate(2)', plan.warning)

    def test_replanned_without_fallocate_as_it_was_planned(self):
        # A standalone qcow2 disk (no backing file, no extended_l2) planned
        # again once fallocate(2) proved unsupported: still standalone, so
        # fallocate_unsupported = zero-fill gives preallocation=full (an
        # overlay's plan would stay thin: no extended_l2).
        self.flags(mode='space', fallocate_unsupported='zero-fill',
                   group='prealloc_backend')
        path = os.path.join(self.instances_path, 'disk')
        subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-o',
                        'extended_l2=off', path, str(units.Mi)], check=True)
        op = self._op(path)
        plan = op.make_plan(diskplan.DiskFormat.QCOW2, units.Mi,
                            existing=op.qcow2_existing(), backing=False)
        self.assertIs(qcow2_layout.Qcow2Preallocation.FALLOC,
                      plan.preallocation)
        fsprobe.record_unsupported(self.instances_path)
        self.addCleanup(fsprobe.forget)
        plan = op.replan_without_fallocate()
        self.assertIs(qcow2_layout.Qcow2Preallocation.FULL,
                      plan.preallocation)
        self.assertIs(diskplan.RawAction.ZERO_FILL,
                      operation.raw_action(plan))

    def test_refusal_decided_once_and_logged_once(self):
        path = os.path.join(self.instances_path, 'disk')
        with open(path, 'wb') as f:
            f.truncate(units.Mi)   # zeros: a raw header, recorded qcow2
        logs = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        reads = self.useFixture(Counter(formats, 'checked_format'))
        op = self._op(path)
        self.assertRaises(exception.DiskFormatMismatch, op.disk_format)
        self.assertIsNone(op.existing_format())
        self.assertIsNone(op.existing_format())
        self.assertEqual(1, len(reads.calls))
        self.assertEqual(1, logs.output.count('left as it is'))

    def test_no_room_names_the_figures(self):
        self.flags(mode='space', group='prealloc_backend')
        path = os.path.join(self.instances_path, 'disk')
        op = self._op(path)
        self.useFixture(fixtures.MockPatchObject(
            fsprobe, 'facts', return_value=diskplan.FsFacts(
                fallocate_ok=True, fstype='xfs', free_bytes=units.Mi)))
        exc = self.assertRaises(exception.InsufficientDiskSpace,
                                op.make_plan, diskplan.DiskFormat.RAW,
                                units.Gi)
        self.assertIn(str(units.Mi), exc.format_message())
        self.assertIs(op.plan, op.plan)
        self.assertFalse(op.plan.fits)


class TestAllocateRaw(base.BackendTestCase):

    def setUp(self):
        super().setUp()
        self.path = os.path.join(self.instances_path, 'disk')
        with open(self.path, 'wb') as f:
            f.truncate(4 * units.Mi)

    def _plan(self, mode, **flags):
        self.flags(mode=mode, group='prealloc_backend', **flags)
        op = operation.DiskOperation(self.path, {}, made_as='raw')
        return op, op.make_plan(diskplan.DiskFormat.RAW, 4 * units.Mi)

    def _no_fallocate(self):
        # What a filesystem without fallocate(2) (ext3) answers: the
        # executor records it, the operation plans again.
        def unsupported(path):
            fsprobe.record_unsupported(os.path.dirname(path))
            return False
        self.addCleanup(fsprobe.forget)
        self.useFixture(fixtures.MockPatchObject(allocate, 'fallocate_file',
                                                 unsupported))

    def test_nothing_leaves_the_holes(self):
        op, plan = self._plan('metadata')
        op.allocate_raw(plan)
        self.assertEqual(0, pb_fixtures.allocated(self.path))

    def test_space_fallocates(self):
        op, plan = self._plan('space')
        op.allocate_raw(plan)
        self.assertGreaterEqual(pb_fixtures.allocated(self.path),
                                4 * units.Mi)

    def test_no_fallocate_zero_fills_by_policy(self):
        op, plan = self._plan('space', fallocate_unsupported='zero-fill')
        self._no_fallocate()
        op.allocate_raw(plan)
        self.assertIs(diskplan.RawAction.ZERO_FILL, op.plan.raw_action)
        self.assertEqual(0, pb_fixtures.hole_bytes(self.path))

    def test_no_fallocate_left_thin_by_policy(self):
        op, plan = self._plan('space', fallocate_unsupported='warn')
        self._no_fallocate()
        op.allocate_raw(plan)
        self.assertIs(diskplan.RawAction.NOTHING, op.plan.raw_action)
        self.assertEqual(0, pb_fixtures.allocated(self.path))

    def test_zero_fill_checks_the_instance_at_each_progress(self):
        instance = self.make_instance()
        op, plan = self._plan('full')
        op.instance = instance
        checked = []

        def progress(path, size, timeout, interval):
            # allocate.zero_fill yields every progress_interval
            # (tests/unit/disk/test_allocate.py): two intervals here.
            yield size // 2
            yield size

        def deleting(inst, path):
            checked.append(inst)
            if len(checked) == 2:
                raise exception.AllocationCancelled(
                    path=path, reason='the instance is being deleted')
        self.useFixture(fixtures.MockPatchObject(allocate, 'zero_fill',
                                                 progress))
        self.useFixture(fixtures.MockPatchObject(
            operation, 'check_not_deleted', deleting))
        self.assertRaises(exception.AllocationCancelled, op.allocate_raw,
                          plan)
        self.assertEqual([instance, instance], checked)

    def test_qcow2_growth_plan_fills_as_its_preallocation(self):
        self.assertIs(diskplan.RawAction.FALLOCATE, operation.raw_action(
            _qcow2_plan(qcow2_layout.Qcow2Preallocation.FALLOC)))
        self.assertIs(diskplan.RawAction.ZERO_FILL, operation.raw_action(
            _qcow2_plan(qcow2_layout.Qcow2Preallocation.FULL)))
        self.assertIs(diskplan.RawAction.NOTHING, operation.raw_action(
            _qcow2_plan(qcow2_layout.Qcow2Preallocation.METADATA)))


def _qcow2_plan(preallocation):
    return diskplan.DiskPlan(
        mode=Mode.SPACE, fmt=diskplan.DiskFormat.QCOW2,
        virtual_size=units.Gi, raw_action=None, preallocation=preallocation,
        cluster_size=128 * units.Ki, extended_l2=True, needed_bytes=0,
        metadata_cache_bytes=None, warning=None, existing=True)


class TestCheckNotDeleted(base.TestCase):

    def test_deleting_or_gone_cancels(self):
        instance = self.make_instance()
        instance._context = object()
        current = self.make_instance()
        current.uuid = instance.uuid
        current.task_state = task_states.DELETING
        current.deleted = False
        self.useFixture(fixtures.MockPatch(
            'nova.objects.Instance.get_by_uuid', return_value=current))
        self.assertRaises(exception.AllocationCancelled,
                          operation.check_not_deleted, instance, '/i/disk')
        current.task_state = None
        operation.check_not_deleted(instance, '/i/disk')

    def test_without_a_context_nothing_is_asked(self):
        asked = self.useFixture(fixtures.MockPatch(
            'nova.objects.Instance.get_by_uuid')).mock
        operation.check_not_deleted(self.make_instance(), '/i/disk')
        operation.check_not_deleted(None, '/i/disk')
        asked.assert_not_called()


class TestMigrations(base.TestCase):

    def setUp(self):
        super().setUp()
        self.migrations = operation.Migrations()
        self.instance = self.make_instance()
        self.disk = '/i/%s/disk' % self.instance.uuid

    def test_only_this_instance_and_only_while_it_runs(self):
        with self.migrations.finishing(self.instance, {'disk': 'qcow2'}):
            migration = self.migrations.of_path(self.disk)
            self.assertIs(self.instance, migration.instance)
            self.assertEqual('qcow2', migration.format_of(self.disk))
            self.assertIsNone(migration.format_of(self.disk + '.x'))
            self.assertIsNone(self.migrations.of_path('/i/other/disk'))
            self.assertIsNone(migration.format_of('/i/other/disk'))
        self.assertIsNone(self.migrations.of_path(self.disk))

    def test_converted_updates_the_record(self):
        with self.migrations.finishing(self.instance, {'disk': 'raw'}):
            migration = self.migrations.of_path(self.disk)
            migration.converted(self.disk, 'qcow2')
            migration.converted('/i/other/disk', 'qcow2')
            self.assertEqual('qcow2', migration.format_of(self.disk))
            self.assertEqual({'disk': 'qcow2'}, migration.formats)

    def test_seen_from_nova_s_other_threads(self):
        # nova may run a disk's step in another thread than
        # finish_migration's: the record is the instance's, not the
        # thread's.
        seen = []
        with self.migrations.finishing(self.instance, {'disk': 'raw'}):
            thread = threading.Thread(target=lambda: seen.append(
                self.migrations.of_path(self.disk).format_of(self.disk)))
            thread.start()
            thread.join()
        self.assertEqual(['raw'], seen)
