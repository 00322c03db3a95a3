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

"""Each format x mode with real files, real qemu-img and real fallocate.

Disks are made the way nova's libvirt driver makes them: through
``Backend.by_name(...).cache(fetch_func, filename, size, ...)``. Only the
fetch from Glance is replaced, by a function writing a real base image with
non-zero content. Every assertion reads the real file: st_blocks, qemu-img
info / map / compare.
"""

import hashlib
import json
import logging
import os
import subprocess

import fixtures
from lxml import etree
from nova import exception as nova_exception
from nova import objects
from nova.virt.libvirt import imagebackend
from oslo_utils import units
from oslo_utils import uuidutils
import testscenarios

from prealloc_backend.adapter import backend
from prealloc_backend.adapter import operation
from prealloc_backend.disk import allocate
from prealloc_backend.disk import formats
from prealloc_backend.disk import hostcaps
from prealloc_backend.disk import journal
from prealloc_backend.disk import qemu
from prealloc_backend import exception
from prealloc_backend.planner import qcow2_layout
from tests import base
from tests import fixtures as pb_fixtures

load_tests = testscenarios.load_tests_apply_scenarios


class TestQcow2Overlay(base.BackendTestCase):
    """qcow2 copy-on-write overlays, per mode."""

    scenarios = [
        ('none', {'mode': 'none', 'min_alloc': 0, 'max_alloc': units.Mi}),
        ('metadata', {'mode': 'metadata', 'min_alloc': 300 * units.Ki,
                      'max_alloc': 2 * units.Mi}),
        ('space', {'mode': 'space', 'min_alloc': base.DISK,
                   'max_alloc': base.DISK + 4 * units.Mi}),
        ('full', {'mode': 'full', 'min_alloc': base.DISK,
                  'max_alloc': base.DISK + 4 * units.Mi}),
    ]

    def test_create(self):
        img = self.image('qcow2', self.mode)
        base_path = self.cache(img, fmt='qcow2')
        info = pb_fixtures.qemu_img_info(img.path)
        self.assertEqual('qcow2', info['format'])
        self.assertEqual(base.DISK, info['virtual-size'])
        self.assertEqual(base_path, info['backing-filename'])
        # Mode none: nova's own overlay (QEMU's 64K, no extended_l2).
        none = self.mode == 'none'
        self.assertEqual(not none,
                         info['format-specific']['data']['extended-l2'])
        self.assertEqual(64 * units.Ki if none else 128 * units.Ki,
                         info['cluster-size'])
        alloc = pb_fixtures.allocated(img.path)
        self.assertGreaterEqual(alloc, self.min_alloc)
        self.assertLessEqual(alloc, self.max_alloc)
        # The backing file's data stays visible through the overlay.
        self.assert_same_content(img.path, base_path)
        self.assert_no_leftovers(img.path)
        # nova's 'fallocate -n' step is off: a metadata overlay stays small.
        self.assertFalse(img.preallocate)
        img.libvirt_info('none', {})
        self.assertEqual(None if none else 'native', img.driver_io)

    def test_guest_sees_base_then_zeros(self):
        img = self.image('qcow2', self.mode)
        base_path = self.cache(img, fmt='qcow2')
        out = subprocess.run(['qemu-img', 'map', '--output=json',
                              img.path], check=True, capture_output=True,
                             text=True).stdout
        extents = json.loads(out)
        # The base's data range is read from the backing file (depth 1),
        # never shadowed by zeros of the overlay.
        first = extents[0]
        self.assertEqual(0, first['start'])
        self.assertEqual(1, first['depth'])
        self.assertTrue(first['data'])
        self.assertEqual(base.DISK,
                         extents[-1]['start'] + extents[-1]['length'])
        self.assert_same_content(img.path, base_path)

    def test_grow_keeps_mode_and_data(self):
        img = self.image('qcow2', self.mode)
        base_path = self.cache(img, fmt='qcow2')
        self.cache(img, fmt='qcow2', size=2 * base.DISK)
        info = pb_fixtures.qemu_img_info(img.path)
        self.assertEqual(2 * base.DISK, info['virtual-size'])
        alloc = pb_fixtures.allocated(img.path)
        if self.mode in ('space', 'full'):
            self.assertGreaterEqual(alloc, 2 * base.DISK)
        else:
            self.assertLess(alloc, base.DISK)
        self.assert_same_content(img.path, base_path)
        self.assertEqual(1, len(self.fetches))
        self.assert_no_leftovers(img.path)


class TestSparseCopy(base.BackendTestCase):
    """nova copies a resized or migrated instance's disks sparsely."""

    scenarios = [('qcow2', {'fmt': 'qcow2'}), ('raw', {'fmt': 'raw'})]

    def test_reallocated_after_sparse_copy(self):
        img = self.image(self.fmt, 'space')
        base_path = self.cache(img, fmt=self.fmt)
        # What 'cp -r' / 'rsync --sparse' of migrate_disk_and_power_off
        # does to the reserved blocks.
        copy = img.path + '.copy'
        subprocess.run(['cp', '--sparse=always', img.path, copy], check=True)
        os.rename(copy, img.path)
        self.assertLess(pb_fixtures.allocated(img.path), base.DISK // 2)
        self.cache(img, fmt=self.fmt)
        self.assertGreaterEqual(pb_fixtures.allocated(img.path), base.DISK)
        self.assert_same_content(img.path, base_path)
        self.assert_no_leftovers(img.path)


class TestRaw(base.BackendTestCase):
    """raw (flat) disks copied from a raw base, per mode."""

    scenarios = [
        ('none', {'mode': 'none', 'full': False}),
        ('metadata', {'mode': 'metadata', 'full': False}),
        ('space', {'mode': 'space', 'full': True}),
        ('full', {'mode': 'full', 'full': True}),
    ]

    def test_create(self):
        img = self.image('raw', self.mode)
        base_path = self.cache(img, fmt='raw')
        self.assertEqual(base.DISK, os.path.getsize(img.path))
        alloc = pb_fixtures.allocated(img.path)
        if self.full:
            self.assertGreaterEqual(alloc, base.DISK)
        else:
            self.assertLess(alloc, 8 * units.Mi)
        self.assert_same_content(img.path, base_path)
        self.assert_no_leftovers(img.path)

    def test_grow_allocates_tail_and_keeps_data(self):
        img = self.image('raw', self.mode)
        base_path = self.cache(img, fmt='raw')
        with open(img.path, 'r+b') as f:
            f.seek(base.DISK - 4096)
            f.write(b'\x5a' * 4096)  # data written by the guest
        self.cache(img, fmt='raw', size=2 * base.DISK)
        self.assertEqual(2 * base.DISK, os.path.getsize(img.path))
        alloc = pb_fixtures.allocated(img.path)
        if self.full:
            self.assertGreaterEqual(alloc, 2 * base.DISK)
        else:
            self.assertLess(alloc, 8 * units.Mi)
        with open(img.path, 'rb') as f:
            f.seek(base.DISK - 4096)
            self.assertEqual(b'\x5a' * 4096, f.read(4096))
            self.assertEqual(bytes(4096), f.read(4096))
        with open(base_path, 'rb') as src, open(img.path, 'rb') as dst:
            self.assertEqual(src.read(), dst.read(base.BASE))


class TestGeneratedDisks(base.BackendTestCase):
    """Ephemeral and swap disks: generated by nova, not fetched."""

    def ephemeral(self, target, *args, **kwargs):
        # What nova's _create_ephemeral/_create_swap do, less mkfs:
        # 'qemu-img create -f raw'.
        subprocess.run(['qemu-img', 'create', '-f', 'raw', target,
                        str(kwargs['ephemeral_size'] * units.Gi)],
                       check=True, capture_output=True)

    def test_raw_ephemeral_space(self):
        img = self.image('raw', 'space', name='disk.eph0')
        img.cache(fetch_func=self.ephemeral, filename='ephemeral_1_0706d66',
                  size=units.Gi, ephemeral_size=1, safe=True)
        self.assertGreaterEqual(pb_fixtures.allocated(img.path), units.Gi)

    def test_qcow2_ephemeral_metadata(self):
        img = self.image('qcow2', 'metadata', name='disk.local')
        img.cache(fetch_func=self.ephemeral, filename='ephemeral_1_0706d66',
                  size=units.Gi, ephemeral_size=1, safe=True)
        info = pb_fixtures.qemu_img_info(img.path)
        self.assertTrue(info['format-specific']['data']['extended-l2'])
        self.assertEqual(os.path.join(self.instances_path, '_base',
                                      'ephemeral_1_0706d66'),
                         info['backing-filename'])
        # metadata only: L2 tables written, no data clusters.
        alloc = pb_fixtures.allocated(img.path)
        self.assertGreater(alloc, 256 * units.Ki)
        self.assertLess(alloc, 2 * units.Mi)

    def test_rescue_disk_without_size(self):
        img = self.image('qcow2', 'space', name='disk.rescue')
        img.cache(fetch_func=self.fetch('qcow2'), filename='rescue-image',
                  image_id='rescue-image')
        base_path = os.path.join(self.instances_path, '_base',
                                 'rescue-image')
        # qcow2 rounds the base's size up to a 512-byte sector.
        base_size = pb_fixtures.qemu_img_info(base_path)['virtual-size']
        info = pb_fixtures.qemu_img_info(img.path)
        self.assertEqual(base_size, info['virtual-size'])
        self.assertGreaterEqual(pb_fixtures.allocated(img.path), base_size)
        self.assert_same_content(img.path, base_path)

    def test_kernel_is_not_allocated(self):
        img = self.image('raw', 'full', name='kernel')
        img.cache(fetch_func=self.fetch('raw'), filename='kernel-id',
                  image_id='kernel-id')
        self.assertLess(pb_fixtures.allocated(img.path), base.BASE)


class TestFlavorOverride(base.BackendTestCase):

    def test_flavor_mode_beats_host_mode(self):
        self.flags(preallocate_images='space')
        img = self.image('qcow2', extra_specs={'prealloc:mode': 'metadata'})
        self.cache(img, fmt='qcow2')
        self.assertLess(pb_fixtures.allocated(img.path), 2 * units.Mi)

    def test_preallocate_images_alone(self):
        # The one-line setup: nothing in [prealloc_backend].
        self.flags(preallocate_images='space')
        img = self.image('qcow2')
        self.cache(img, fmt='qcow2')
        self.assertGreaterEqual(pb_fixtures.allocated(img.path), base.DISK)

    def test_bad_flavor_value_fails_creation_only(self):
        img = self.image('qcow2', extra_specs={'prealloc:mode': 'turbo'})
        # Looking at the disk (cleanup, XML of an existing guest) works...
        self.assertIsNone(img.driver_io)
        # ...making one says what is wrong.
        exc = self.assertRaises(exception.InvalidFlavorPolicy, self.cache,
                                img, 'qcow2')
        self.assertIn('turbo', str(exc))
        self.assertFalse(os.path.exists(img.path))


class TestGuestXML(base.BackendTestCase):

    def disk_xml(self, img):
        return etree.fromstring(img.libvirt_info('none', {}).to_xml())

    def test_qcow2_metadata_cache(self):
        img = self.image('qcow2', 'space')
        self.cache(img, fmt='qcow2')
        dev = self.disk_xml(img)
        driver = dev.find('driver')
        self.assertEqual('qcow2', driver.get('type'))
        self.assertEqual('native', driver.get('io'))
        # QEMU's default cache covers the disk: no element.
        self.assertIsNone(driver.find('metadata_cache'))

    def test_qemu_default_policy(self):
        self.flags(qcow2_l2_cache='qemu-default', group='prealloc_backend')
        img = self.image('qcow2', 'space')
        self.cache(img, fmt='qcow2')
        self.assertIsNone(self.disk_xml(img).find('driver/metadata_cache'))

    def test_raw_has_none(self):
        img = self.image('raw', 'space')
        self.cache(img, fmt='raw')
        self.assertIsNone(self.disk_xml(img).find('driver/metadata_cache'))


class TestGuestDiscard(base.BackendTestCase):
    """The <driver discard=...> each disk gets with nova's
    hw_disk_discard = unmap (what a guest's TRIM does on the host), on a
    host without discard-no-unref (mocked: this tier runs on whichever
    QEMU the machine has; TestGuestDiscardNoUnref has the other answer).
    """

    def setUp(self):
        super().setUp()
        self.useFixture(fixtures.MockPatch(
            'prealloc_backend.disk.hostcaps.discard_no_unref',
            return_value=hostcaps.Answer(False, 'mocked')))

    def discard(self, fmt, mode, **flags):
        self.flags(hw_disk_discard='unmap', group='libvirt')
        if flags:
            self.flags(group='prealloc_backend', **flags)
        img = self.image(fmt, mode)
        # One base per format: a raw host copies a qcow2 base as qcow2.
        self.cache(img, fmt=fmt, filename='base-' + fmt)
        dev = etree.fromstring(img.libvirt_info('none', {}).to_xml())
        self.assertEqual(fmt, dev.find('driver').get('type'))
        return dev.find('driver').get('discard')

    def test_preallocated_disks_ignore_discards(self):
        for fmt, mode in (('qcow2', 'metadata'), ('qcow2', 'space'),
                          ('qcow2', 'full'), ('raw', 'space'),
                          ('raw', 'full')):
            self.assertEqual('ignore', self.discard(fmt, mode),
                             '%s %s' % (fmt, mode))

    def test_thin_disks_keep_novas_value(self):
        for fmt, mode in (('qcow2', 'none'), ('raw', 'none'),
                          ('raw', 'metadata')):
            self.assertEqual('unmap', self.discard(fmt, mode),
                             '%s %s' % (fmt, mode))

    def test_reclaim_keeps_novas_value(self):
        for fmt in ('qcow2', 'raw'):
            self.assertEqual('unmap', self.discard(fmt, 'space',
                                                   guest_discard='reclaim'))

    def test_nova_default_is_left_alone(self):
        # hw_disk_discard unset: no discard attribute at all (QEMU's
        # default, 'ignore').
        img = self.image('qcow2', 'space')
        self.cache(img, fmt='qcow2')
        dev = etree.fromstring(img.libvirt_info('none', {}).to_xml())
        self.assertIsNone(dev.find('driver').get('discard'))


def discard_attributes(img):
    """(discard, discard_no_unref) of the <driver> libvirt_info writes."""
    dev = etree.fromstring(img.libvirt_info('none', {}).to_xml())
    driver = dev.find('driver')
    return driver.get('discard'), driver.get('discard_no_unref')


class TestGuestDiscardNoUnref(base.BackendTestCase):
    """discard-no-unref where the host has it. The host's answer
    (disk.hostcaps) is mocked: this tier runs on one QEMU and libvirt and
    must see both answers; the real probe and a real guest's TRIM run in
    the real tier on both platforms (tests/functional/real/test_trim.py).
    """

    def setUp(self):
        super().setUp()
        self.flags(hw_disk_discard='unmap', group='libvirt')
        self.probe = self.useFixture(fixtures.MockPatch(
            'prealloc_backend.disk.hostcaps.discard_no_unref',
            return_value=hostcaps.Answer(True, 'mocked'))).mock

    def driver(self, img):
        return discard_attributes(img)

    def test_keep_uses_it_for_metadata_only(self):
        for mode, want in (('metadata', ('unmap', 'on')),
                           ('space', ('ignore', None)),
                           ('full', ('ignore', None))):
            img = self.image('qcow2', mode)
            self.cache(img, fmt='qcow2')
            self.assertEqual(want, self.driver(img), mode)

    def test_host_without_it(self):
        self.probe.return_value = hostcaps.Answer(False, 'mocked')
        self.flags(guest_discard='zero', group='prealloc_backend')
        img = self.image('qcow2', 'metadata')
        self.cache(img, fmt='qcow2')
        self.assertEqual(('ignore', None), self.driver(img))

    def test_zero_reserves_the_trimmed_blocks_again(self):
        self.flags(guest_discard='zero', group='prealloc_backend')
        img = self.image('qcow2', 'space')
        self.cache(img, fmt='qcow2')
        before = pb_fixtures.allocated(img.path)
        # What QEMU does to the file under a guest's discard with
        # discard-no-unref: a hole (the clusters keep their place).
        size = os.path.getsize(img.path)
        subprocess.run(['fallocate', '--punch-hole', '--keep-size',
                        '--offset', str(size - 8 * units.Mi), '--length',
                        str(4 * units.Mi), img.path], check=True)
        self.assertLess(pb_fixtures.allocated(img.path), before)
        with open(img.path, 'rb') as f:
            content = hashlib.md5(f.read()).hexdigest()
        self.assertEqual(('unmap', 'on'), self.driver(img))
        self.assertGreaterEqual(pb_fixtures.allocated(img.path), before)
        with open(img.path, 'rb') as f:
            self.assertEqual(content, hashlib.md5(f.read()).hexdigest())

    def test_not_asked_where_it_cannot_matter(self):
        for fmt, mode, flags in (('raw', 'space', {}),
                                 ('qcow2', 'none', {}),
                                 ('qcow2', 'space',
                                  {'guest_discard': 'reclaim'})):
            self.flags(group='prealloc_backend', **flags)
            img = self.image(fmt, mode)
            self.cache(img, fmt=fmt, filename='base-' + fmt)
            self.assertIsNone(self.driver(img)[1])
        self.probe.assert_not_called()


class TestFailures(base.BackendTestCase):

    def test_not_enough_space_raw(self):
        img = self.image('raw', 'space')
        exc = self.assertRaises(exception.InsufficientDiskSpace, self.cache,
                                img, 'raw', 64 * units.Pi)
        message = str(exc)
        self.assertIn(img.path, message)
        self.assertIn('%d bytes needed' % (64 * units.Pi), message)
        self.assertIn('bytes free', message)
        self.assertFalse(os.path.exists(img.path))
        self.assert_no_leftovers(img.path)

    def test_not_enough_space_qcow2(self):
        img = self.image('qcow2', 'space')
        exc = self.assertRaises(exception.InsufficientDiskSpace, self.cache,
                                img, 'qcow2', 64 * units.Pi)
        self.assertIn(img.path, str(exc))
        self.assertFalse(os.path.exists(img.path))
        self.assert_no_leftovers(img.path)

    def test_thin_modes_need_no_space(self):
        img = self.image('qcow2', 'none')
        self.cache(img, fmt='qcow2', size=64 * units.Ti)
        self.assertEqual(64 * units.Ti,
                         pb_fixtures.qemu_img_info(img.path)['virtual-size'])

    def test_interrupted_creation_is_not_reused(self):
        img = self.image('raw', 'space')
        os.makedirs(os.path.dirname(img.path), exist_ok=True)
        # What a crash mid-creation leaves: a short disk and its journal.
        with open(img.path, 'wb') as f:
            f.write(b'half')
        with open(img.path + backend.JOURNAL_SUFFIX, 'w') as f:
            json.dump({'created': True}, f)
        base_path = self.cache(img, fmt='raw')
        self.assertEqual(base.DISK, os.path.getsize(img.path))
        self.assert_same_content(img.path, base_path)
        self.assert_no_leftovers(img.path)

    def test_interrupted_growth_keeps_the_disk(self):
        img = self.image('raw', 'none')
        self.cache(img, fmt='raw')
        with open(img.path, 'r+b') as f:
            f.write(b'guest data')
        with open(img.path + backend.JOURNAL_SUFFIX, 'w') as f:
            json.dump({'created': False}, f)
        self.cache(img, fmt='raw')
        with open(img.path, 'rb') as f:
            self.assertEqual(b'guest data', f.read(10))
        self.assert_no_leftovers(img.path)

    def test_stale_tmp_overlay_removed(self):
        img = self.image('qcow2', 'space')
        os.makedirs(os.path.dirname(img.path), exist_ok=True)
        with open(img.path + backend.TMP_SUFFIX, 'wb') as f:
            f.write(b'partial overlay')
        self.cache(img, fmt='qcow2')
        self.assert_no_leftovers(img.path)
        self.assertTrue(pb_fixtures.qemu_img_info(img.path)['format-specific']
                        ['data']['extended-l2'])

    def test_failed_qemu_img_leaves_nothing(self):
        img = self.image('qcow2', 'space')
        # A base whose format qemu-img reads but cannot back an overlay of
        # with these options: a qcow2 claiming a missing data file.
        self.useFixture(fixtures.EnvironmentVariable('LC_ALL', 'C'))
        self.flags(allocation_timeout=0, group='prealloc_backend')
        bad_cluster = self.useFixture(fixtures.MockPatchObject(
            qcow2_layout, 'chosen_cluster_size', return_value=4096))
        exc = self.assertRaises(exception.QemuImgError, self.cache, img,
                                'qcow2')
        self.assertTrue(bad_cluster.mock.called)
        self.assertIn('extended_l2', str(exc))
        self.assertIsNotNone(exc.exit_code)
        self.assertFalse(os.path.exists(img.path))
        self.assert_no_leftovers(img.path)


class TestLongZeroFill(base.BackendTestCase):
    """Timeout and cancellation between zero-fill calls."""

    def setUp(self):
        super().setUp()
        self.useFixture(fixtures.MockPatchObject(
            allocate, 'ZERO_FILL_CALL_BYTES', 16 * units.Mi))
        # A clock that jumps 10 s per reading, so that 'minutes of
        # zero-filling' happen in a unit test without a timing assertion.
        clock = iter(range(0, 10 ** 6, 10))
        self.useFixture(fixtures.MockPatch(
            'prealloc_backend.disk.allocate.time.monotonic',
            side_effect=lambda: next(clock)))

    def test_timeout_removes_the_disk(self):
        self.flags(allocation_timeout=5, group='prealloc_backend')
        img = self.image('raw', 'full')
        exc = self.assertRaises(exception.AllocationTimeout, self.cache,
                                img, 'raw', 64 * units.Mi)
        self.assertIn('5 s', str(exc))
        self.assertFalse(os.path.exists(img.path))
        self.assert_no_leftovers(img.path)

    def test_deleted_instance_cancels(self):
        img = self.image('raw', 'full')
        self.instance._context = mock_context = object()
        deleting = objects.Instance(uuid=self.instance.uuid,
                                    task_state='deleting', deleted=False)
        # No database in the unit tier: the lookup nova's conductor
        # would answer is replaced (the functional tier deletes for real).
        lookup = self.useFixture(fixtures.MockPatchObject(
            objects.Instance, 'get_by_uuid', return_value=deleting)).mock
        exc = self.assertRaises(exception.AllocationCancelled, self.cache,
                                img, 'raw', 64 * units.Mi)
        lookup.assert_called_with(mock_context, self.instance.uuid,
                                  expected_attrs=[])
        self.assertIn('being deleted', str(exc))
        self.assertFalse(os.path.exists(img.path))
        self.assert_no_leftovers(img.path)


class TestOtherBackends(base.BackendTestCase):

    def test_lvm_rbd_ploop_keep_nova_classes(self):
        be = backend.Backend(True)
        self.assertIs(imagebackend.Lvm, be.backend('lvm'))
        self.assertIs(imagebackend.Rbd, be.backend('rbd'))
        self.assertIs(imagebackend.Ploop, be.backend('ploop'))
        self.assertIs(backend.Qcow2, be.backend('default'))
        self.assertIs(backend.Flat, backend.Backend(False).backend('default'))
        self.assertIs(backend.Flat, be.backend('raw'))
        self.assertIs(backend.Flat, be.backend('flat'))
        # isinstance checks in nova's driver still hold.
        self.assertTrue(issubclass(backend.Qcow2, imagebackend.Qcow2))
        self.assertTrue(issubclass(backend.Flat, imagebackend.Flat))


class TestConstructors(base.BackendTestCase):
    """A disk object only records its arguments, as nova's do."""

    def test_no_flavor_load_no_probe_no_qemu_img(self):
        self.flags(mode='space', group='prealloc_backend')
        # An instance without a context and without a loaded flavor:
        # reading instance.flavor would lazy-load and raise
        # OrphanedObjectError.
        instance = objects.Instance(uuid=uuidutils.generate_uuid())
        # A spy, not a stand-in: any qemu-img run fails the test.
        qemu_calls = self.useFixture(fixtures.MockPatchObject(
            qemu, 'execute', side_effect=AssertionError('qemu-img')))
        for images_type in ('qcow2', 'raw'):
            img = backend.Backend(True).by_name(
                instance, 'disk', images_type, disk_info_mapping=base.MAPPING)
            self.assertFalse(img.preallocate)
        self.assertFalse(qemu_calls.mock.called)
        self.assertEqual([], [f for f in os.listdir(self.instances_path)
                              if f.startswith('.prealloc-probe')])
        self.assertFalse(instance.obj_attr_is_set('flavor'))


class TestFormatAwareGrowth(base.BackendTestCase):

    def test_raw_file_handed_to_qcow2_grows_as_raw(self):
        # What finish_migration does after a copy from a raw host: the
        # destination's Qcow2 object grows a file that is still raw.
        img = self.image('qcow2', 'space')
        os.makedirs(os.path.dirname(img.path), exist_ok=True)
        pb_fixtures.make_base(img.path, 'raw', base.BASE, 7)
        with open(img.path, 'rb') as f:
            before = f.read(base.BASE)
        # The record finish_migration holds: the source's domain XML said
        # raw (nova's Qcow2 constructor wrote 'qcow2' in disk.info for the
        # disk before it existed).
        with operation.MIGRATIONS.finishing(self.instance, {'disk': 'raw'}):
            img.resize_image(base.DISK)
        info = pb_fixtures.qemu_img_info(img.path)
        self.assertEqual('raw', info['format'])
        self.assertEqual(base.DISK, info['virtual-size'])
        with open(img.path, 'rb') as f:
            self.assertEqual(before, f.read(base.BASE))


class TestFormatFromRecords(base.BackendTestCase):
    """A disk's format comes from nova's records; a guest-written header
    is refused where it disagrees with them, and a qcow2 disk whose header
    names a file outside the image cache or a data-file is refused before
    any qemu-img command but ``info -f`` runs on it.
    """

    SECRET = b'HOST-SECRET-' * 64

    def setUp(self):
        super().setUp()
        self.scratch = self.useFixture(fixtures.TempDir()).path
        self.secret = os.path.join(self.scratch, 'secret')
        with open(self.secret, 'wb') as f:
            f.write(self.SECRET)
        # A spy on every qemu-img the plugin runs (they still run).
        self.qemu_cmds = []
        real = qemu.execute

        def spy(*args, **kwargs):
            self.qemu_cmds.append(args)
            return real(*args, **kwargs)

        self.useFixture(fixtures.MockPatchObject(qemu, 'execute', spy))

    def _raw_disk(self, images_type='raw', **header):
        """A raw instance disk (nova's disk.info says raw) whose guest wrote
        a qcow2 header naming ``header``'s backing file or data-file.
        """
        img = self.image(images_type, 'space', use_cow=images_type != 'raw')
        os.makedirs(os.path.dirname(img.path), exist_ok=True)
        pb_fixtures.make_base(img.path, 'raw', base.BASE, 3)
        formats.record_format(img.path, 'raw')
        # The header claims 1 GiB: code believing it would not grow the
        # 64 MiB disk.
        written = pb_fixtures.write_guest_qcow2_header(
            img.path, self.scratch, units.Gi, **header)
        return img, written

    def _qcow2_disk(self, backing=None, backing_fmt='raw', data_file=None,
                    size=base.BASE):
        """A qcow2 instance disk recorded qcow2, made with this header."""
        img = self.image('qcow2', 'space')
        os.makedirs(os.path.dirname(img.path), exist_ok=True)
        cmd = ['qemu-img', 'create', '-f', 'qcow2']
        if backing:
            cmd += ['-u', '-b', backing, '-F', backing_fmt]
        if data_file:
            cmd += ['-o', 'data_file=%s' % data_file]
        subprocess.run(cmd + [img.path, str(size)], check=True,
                       capture_output=True)
        self.assertEqual('qcow2', formats.disk_info_format(
            img.disk_info_path, img.path))
        return img

    def assertOnlyInfo(self):
        for cmd in self.qemu_cmds:
            self.assertEqual('info', cmd[0], cmd)
            self.assertIn('-f', cmd, cmd)

    def assertSecretIntact(self):
        with open(self.secret, 'rb') as f:
            self.assertEqual(self.SECRET, f.read())

    # -- raw disks: the record wins, the header is the guest's data -------

    def test_raw_with_guest_header_grows_as_raw(self):
        img, written = self._raw_disk(backing=self.secret)
        img.resize_image(base.DISK)
        self.assertEqual(base.DISK, os.path.getsize(img.path))
        with open(img.path, 'rb') as f:
            self.assertEqual(written, f.read(len(written)))
        self.assertFalse(pb_fixtures.contains(img.path, self.SECRET[:24]))
        for cmd in self.qemu_cmds:
            self.assertIn('raw', cmd, cmd)
        self.assertEqual('raw', img.driver_format)

    def test_raw_with_data_file_header_on_qcow2_host(self):
        data_file = os.path.join(self.scratch, 'data-file')
        img, _written = self._raw_disk('qcow2', data_file=data_file)
        with open(data_file, 'wb') as f:
            f.write(self.SECRET)
        with operation.MIGRATIONS.finishing(self.instance, {'disk': 'raw'}):
            img.resize_image(base.DISK)
        self.assertEqual(base.DISK, os.path.getsize(img.path))
        with open(data_file, 'rb') as f:
            self.assertEqual(self.SECRET, f.read())

    def test_flat_without_record_keeps_raw(self):
        img, _written = self._raw_disk(backing=self.secret)
        os.unlink(img.disk_info_path)
        logs = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        flat = backend.Backend(False).by_name(
            self.instance, 'disk', 'raw', disk_info_mapping=base.MAPPING)
        # nova's Flat would record the header's 'qcow2' (qemu-img info
        # without -f) and hand the disk to QEMU as qcow2.
        self.assertEqual('raw', flat.driver_format)
        self.assertEqual('raw', formats.disk_info_format(
            flat.disk_info_path, flat.path))
        self.assertEqual([], self.qemu_cmds)
        self.assertIn(img.path, logs.output)
        self.assertIn('header says qcow2: handled as raw', logs.output)

    def test_migration_record_beats_stale_disk_info(self):
        img, _written = self._raw_disk(backing=self.secret)
        formats.record_format(img.path, 'qcow2')  # stale or forged
        with operation.MIGRATIONS.finishing(self.instance, {'disk': 'raw'}):
            flat = backend.Backend(False).by_name(
                self.instance, 'disk', 'raw', disk_info_mapping=base.MAPPING)
            self.assertEqual('raw', flat.driver_format)
        self.assertEqual('raw', formats.disk_info_format(
            flat.disk_info_path, flat.path))

    def test_migration_record_qcow2_with_raw_header_refused(self):
        img, _written = self._raw_disk()
        with open(img.path, 'r+b') as f:
            f.write(b'\0' * 512)
        with operation.MIGRATIONS.finishing(self.instance, {'disk': 'qcow2'}):
            exc = self.assertRaises(
                exception.DiskFormatMismatch, backend.Backend(False).by_name,
                self.instance, 'disk', 'raw', disk_info_mapping=base.MAPPING)
        self.assertIn(img.path, exc.format_message())
        self.assertIn("source host's domain XML", exc.format_message())

    # -- qcow2 disks: refused unless the header is what the record says,
    # -- backed by the image cache only, without data-file -----------------

    def test_recorded_qcow2_with_raw_header_refused(self):
        img = self.image('qcow2', 'space')
        os.makedirs(os.path.dirname(img.path), exist_ok=True)
        pb_fixtures.make_base(img.path, 'raw', base.BASE, 3)
        exc = self.assertRaises(exception.DiskFormatMismatch,
                                img.resize_image, base.DISK)
        self.assertIn(img.path, exc.format_message())
        self.assertIn('header says raw', exc.format_message())
        self.assertEqual([], self.qemu_cmds)

    def _refused(self, img, *expected):
        exc = self.assertRaises(exception.UnsafeDiskHeader,
                                img.resize_image, base.DISK)
        self.assertIsInstance(exc, nova_exception.InvalidDiskInfo)
        for text in (img.path,) + expected:
            self.assertIn(text, exc.format_message())
        self.assertOnlyInfo()
        self.assertSecretIntact()
        return exc

    def test_backing_outside_image_cache_refused(self):
        img = self._qcow2_disk(backing=self.secret)
        self._refused(img, repr(self.secret), 'is not a file beneath')

    def test_relative_backing_escaping_image_cache_refused(self):
        img = self._qcow2_disk(backing='../_base/../../%s' % os.path.relpath(
            self.secret, os.path.dirname(self.instances_path)))
        self._refused(img, 'is not a file beneath')

    def test_symlink_in_image_cache_to_host_file_refused(self):
        link = self.base_path('looks-cached')
        os.symlink(self.secret, link)
        img = self._qcow2_disk(backing=link)
        self._refused(img, 'is not a file beneath')

    def test_protocol_backing_names_refused(self):
        # qemu reads these as protocols, not files; the second also looks,
        # by text, like a file beneath the image cache.
        sock = os.path.join(self.scratch, 'x.sock')
        for name in ('nbd:unix:%s:exportname=/../..' % sock,
                     'http://127.0.0.1:9/s?x=/../../../_base/cached'):
            img = self._qcow2_disk(backing=name)
            self._refused(img, 'is not a plain file name')
            self.qemu_cmds.clear()

    def test_dotdot_after_a_symlink_resolved_as_the_kernel_does(self):
        # By text 'lnk/../../_base/cached' is instances_path/_base/cached;
        # the kernel goes up from lnk's target: the scratch tree's copy.
        outside = os.path.join(self.scratch, 'a', 'b')
        os.makedirs(outside)
        os.makedirs(os.path.join(self.scratch, '_base'))
        with open(os.path.join(self.scratch, '_base', 'cached'), 'wb') as f:
            f.write(self.SECRET)
        pb_fixtures.make_base(self.base_path('cached'), 'raw', base.BASE)
        img = self._qcow2_disk(backing='lnk/../../_base/cached')
        os.symlink(outside, os.path.join(os.path.dirname(img.path), 'lnk'))
        self._refused(img, 'is not a file beneath')

    def test_existing_disk_refused_is_left_as_it_is(self):
        # A hard reboot (nova's cache() of an existing disk, which also asks
        # it to grow to the flavor's size): a refused disk already that
        # large is logged and left alone, never failing the instance's
        # start; growing it further is refused (the tests above).
        logs = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        img = self._qcow2_disk(backing=self.secret, size=base.DISK)
        before = pb_fixtures.sha256_of(img.path)
        self.cache(img, fmt='qcow2')
        self.assertEqual(before, pb_fixtures.sha256_of(img.path))
        self.assertIn('left as it is, not allocated', logs.output)
        self.assertOnlyInfo()
        self.assertSecretIntact()

    def test_backing_of_another_format_refused(self):
        cached = self.base_path('cached')
        pb_fixtures.make_base(cached, 'raw', base.BASE)
        img = self._qcow2_disk(backing=cached, backing_fmt='vmdk')
        self._refused(img, "format 'vmdk'")

    def test_data_file_refused_before_any_qemu_img(self):
        data_file = os.path.join(self.scratch, 'data-file')
        img = self._qcow2_disk(data_file=data_file)
        with open(data_file, 'wb') as f:
            f.write(self.SECRET)
        self._refused(img, 'data_file')
        self.assertEqual([], self.qemu_cmds)
        with open(data_file, 'rb') as f:
            self.assertEqual(self.SECRET, f.read())

    def test_backing_with_a_chain_of_its_own_refused(self):
        cached = self.base_path('cached.qcow2')
        subprocess.run(['qemu-img', 'create', '-f', 'qcow2', '-u', '-b',
                        self.secret, '-F', 'raw', cached, str(base.BASE)],
                       check=True, capture_output=True)
        img = self._qcow2_disk(backing=cached, backing_fmt='qcow2')
        self._refused(img, 'has a backing file or data-file of its own')

    def test_backing_with_a_data_file_refused(self):
        cached = self.base_path('cached.qcow2')
        data_file = os.path.join(self.scratch, 'data-file')
        subprocess.run(['qemu-img', 'create', '-f', 'qcow2', '-o',
                        'data_file=%s' % data_file, cached, str(base.BASE)],
                       check=True, capture_output=True)
        img = self._qcow2_disk(backing=cached, backing_fmt='qcow2')
        self._refused(img, 'data_file')

    def test_overlay_of_the_image_cache_grows(self):
        img = self.image('qcow2', 'space')
        base_file = self.cache(img, size=8 * units.Mi)
        self.qemu_cmds.clear()
        img.resize_image(base.DISK)
        self.assertEqual(base.DISK,
                         pb_fixtures.qemu_img_info(img.path)['virtual-size'])
        self.assertEqual(('info', '--output=json', '--force-share', '-f',
                          'qcow2', img.path), self.qemu_cmds[0])
        self.assertEqual(base_file, pb_fixtures.qemu_img_info(
            img.path)['backing-filename'])

    def test_qemu_info_needs_a_format(self):
        self.assertRaises(exception.QemuImgError, qemu.info, self.secret,
                          None)
        self.assertEqual([], self.qemu_cmds)


class InterruptedConversionTestCase(base.BackendTestCase):
    """A raw disk's conversion to qcow2 killed after the rename, before
    disk.info was rewritten (issue 31, finding 2): the backend reconciles
    before it reads the format, and never grows the qcow2 file as raw.
    """

    def test_converted_file_recorded_raw_is_finished_and_grown_as_qcow2(self):
        img = self.image('raw', 'space', use_cow=False)
        os.makedirs(os.path.dirname(img.path), exist_ok=True)
        pb_fixtures.make_base(img.path, 'raw', base.BASE, 3)
        formats.record_format(img.path, 'raw')
        tmp = img.path + journal.CONVERT_SUFFIX
        subprocess.run(['qemu-img', 'convert', '-f', 'raw', '-O', 'qcow2',
                        img.path, tmp], check=True, capture_output=True)
        with open(img.path + journal.JOURNAL_SUFFIX, 'w') as f:
            json.dump({'created': False, 'phase': journal.READY,
                       'process': 'killed'}, f)
        os.rename(tmp, img.path)
        flat = backend.Backend(False).by_name(
            self.instance, 'disk', 'raw', disk_info_mapping=base.MAPPING)
        self.assertEqual('qcow2', flat.driver_format)
        self.assertEqual('qcow2', formats.disk_info_format(
            flat.disk_info_path, flat.path))
        self.assertFalse(os.path.exists(img.path + journal.JOURNAL_SUFFIX))
        flat.resize_image(base.DISK)
        self.assertEqual(base.DISK,
                         pb_fixtures.qemu_img_info(img.path)['virtual-size'])


class TestReserveAgainNeverFails(base.BackendTestCase):
    """A failure of the re-reservation or of the probe never stops a
    guest's definition (an existing instance is never put in ERROR).
    The failures are mocked: a daemon that cannot start or a probe that
    raises cannot be produced on demand here.
    """

    def setUp(self):
        super().setUp()
        self.flags(hw_disk_discard='unmap', group='libvirt')
        self.flags(guest_discard='zero', group='prealloc_backend')
        self.probe = self.useFixture(fixtures.MockPatch(
            'prealloc_backend.disk.hostcaps.discard_no_unref',
            return_value=hostcaps.Answer(True, 'mocked'))).mock

    def driver(self, img):
        return discard_attributes(img)

    def test_daemon_failure(self):
        img = self.image('qcow2', 'space')
        self.cache(img, fmt='qcow2')
        self.useFixture(fixtures.MockPatchObject(
            allocate, 'fallocate_file',
            side_effect=RuntimeError('FailedToDropPrivileges')))
        self.assertEqual(('unmap', 'on'), self.driver(img))

    def test_probe_failure(self):
        img = self.image('qcow2', 'space')
        self.cache(img, fmt='qcow2')
        self.probe.side_effect = UnicodeDecodeError('utf-8', b'', 0, 1, 'x')
        self.assertEqual(('ignore', None), self.driver(img))
