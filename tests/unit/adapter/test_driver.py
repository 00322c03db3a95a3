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

"""The driver: loaded the documented way, nova's signatures kept.

The wrapper nova-compute runs and what importing the driver loads need a
fresh Python each: tests/integration/test_driver_loading.py.
"""

import inspect
import json
import os
import subprocess
import sys
import time
from unittest import mock

import fixtures
from nova import exception as nova_exception
from nova.tests.fixtures import libvirt as fakelibvirt
from nova.virt import driver as nova_driver
from nova.virt import fake as fake_virt
from nova.virt.libvirt import driver as libvirt_driver
from oslo_utils import units

from prealloc_backend.adapter import backend
from prealloc_backend.adapter import driver
from prealloc_backend.adapter import operation
from prealloc_backend.adoption import live
from prealloc_backend.adoption import recovery
from prealloc_backend.disk import formats
from prealloc_backend.disk import hostcaps
from prealloc_backend import exception
from tests import base


def migration_format(path):
    """The format the migration being finished records for ``path``."""
    migration = operation.MIGRATIONS.of_path(path)
    return migration.format_of(path) if migration is not None else None


class TestLoading(base.TestCase):

    def setUp(self):
        super().setUp()
        # No hypervisor in the unit tier: nova's fake libvirt module
        # stands in for libvirt-python (the real-hypervisor tier uses the
        # real one).
        self.useFixture(fakelibvirt.LibvirtFixture())

    def test_load_compute_driver_with_documented_config(self):
        # The documented setup: compute_driver =
        # prealloc_backend.LibvirtDriver, run by prealloc-nova-compute, which
        # calls driver.register() first.
        driver.register()
        self.flags(compute_driver='prealloc_backend.LibvirtDriver')
        loaded = nova_driver.load_compute_driver(fake_virt.FakeVirtAPI())
        self.assertIsInstance(loaded, driver.LibvirtDriver)
        self.assertIsInstance(loaded, libvirt_driver.LibvirtDriver)
        self.assertIsInstance(loaded.image_backend, backend.Backend)

    def test_module_path_is_not_loadable_by_nova(self):
        # Why the wrapper exists: nova prefixes 'nova.virt.'.
        self.flags(
            compute_driver='prealloc_backend.adapter.driver.LibvirtDriver')
        self.assertRaises(SystemExit, nova_driver.load_compute_driver,
                          fake_virt.FakeVirtAPI())

    def test_contradiction_refused_at_start(self):
        self.flags(preallocate_images='space')
        self.flags(qcow2_extended_l2=False, group='prealloc_backend')
        exc = self.assertRaises(exception.ConflictingOptions,
                                driver.LibvirtDriver,
                                fake_virt.FakeVirtAPI())
        self.assertIn('qcow2_extended_l2', str(exc))
        self.assertIn('mode = none', str(exc))
        # The same options are fine where disks are raw.
        self.flags(images_type='raw', group='libvirt')
        driver.LibvirtDriver(fake_virt.FakeVirtAPI())

    def test_bad_mode_refused_at_start(self):
        self.flags_fixture.load_raw_values(group='prealloc_backend',
                                           mode='quick')
        self.assertRaises(ValueError, driver.LibvirtDriver,
                          fake_virt.FakeVirtAPI())

    def _failed_spawn(self, error, vm_state):
        drv = driver.LibvirtDriver(fake_virt.FakeVirtAPI())
        instance = self.make_instance()
        instance.vm_state = vm_state
        # spawn itself needs a hypervisor; only nova's spawn is
        # replaced, to raise what the backend raises.
        self.useFixture(fixtures.MockPatchObject(
            libvirt_driver.LibvirtDriver, 'spawn', side_effect=error))
        return instance, lambda: drv.spawn(None, instance, None, [], None,
                                           {})

    def test_spawn_failure_reschedules_build_with_reason(self):
        error = exception.InsufficientDiskSpace(
            path='/i/disk', needed=10, free=1, directory='/i')
        _instance, spawn = self._failed_spawn(error, 'building')
        exc = self.assertRaises(nova_exception.ComputeResourcesUnavailable,
                                spawn)
        self.assertIn('Not enough space to preallocate: 10 bytes needed, 1 '
                      'bytes free (disk /i/disk)', exc.format_message())

    def test_invalid_policy_aborts_build(self):
        error = exception.InvalidFlavorPolicy(
            value='x', key='hw:prealloc', reason='no such mode')
        instance, spawn = self._failed_spawn(error, 'building')
        exc = self.assertRaises(nova_exception.BuildAbortException, spawn)
        self.assertIn(instance.uuid, exc.format_message())

    def test_spawn_failure_not_building_is_nova_s(self):
        error = exception.InsufficientDiskSpace(
            path='/i/disk', needed=10, free=1, directory='/i')
        _instance, spawn = self._failed_spawn(error, 'active')
        self.assertRaises(exception.InsufficientDiskSpace, spawn)


class TestSignatures(base.TestCase):

    def test_overridden_public_methods_keep_nova_signatures(self):
        checked = 0
        for name, method in vars(driver.LibvirtDriver).items():
            if not callable(method) or (name.startswith('_') and
                                        name != '__init__'):
                continue
            nova_method = getattr(libvirt_driver.LibvirtDriver, name)
            self.assertEqual(inspect.signature(nova_method),
                             inspect.signature(method), name)
            checked += 1
        self.assertGreaterEqual(checked, 3)

    def test_overridden_private_methods_keep_nova_signatures(self):
        # nova's own code calls these with its arguments (pre_live_migration
        # and hard reboot call _create_images_and_backing).
        for name in ('_create_images_and_backing',):
            self.assertIn(name, vars(driver.LibvirtDriver))
            self.assertEqual(
                inspect.signature(getattr(libvirt_driver.LibvirtDriver,
                                          name)),
                inspect.signature(getattr(driver.LibvirtDriver, name)),
                name)

    def test_image_methods_keep_nova_signatures(self):
        from nova.virt.libvirt import imagebackend
        pairs = ((backend.Flat, imagebackend.Flat),
                 (backend.Qcow2, imagebackend.Qcow2),
                 (backend.Backend, imagebackend.Backend))
        for ours, novas in pairs:
            for name, method in vars(ours).items():
                if name.startswith('_') and name != '__init__':
                    continue
                if not callable(method) or not hasattr(novas, name):
                    continue
                self.assertEqual(inspect.signature(getattr(novas, name)),
                                 inspect.signature(method),
                                 '%s.%s' % (ours.__name__, name))
        for name in ('cache', 'libvirt_info'):
            self.assertEqual(
                inspect.signature(getattr(imagebackend.Image, name)),
                inspect.signature(getattr(backend._PreallocImage, name)))


class TestFormatRecords(base.TestCase):
    """finish_migration hands the source's record of each disk's format to
    the backend; a disk converted on arrival is recorded qcow2.
    """

    def setUp(self):
        super().setUp()
        # nova's fake libvirt module stands in for libvirt-python.
        self.useFixture(fakelibvirt.LibvirtFixture())
        self.drv = driver.LibvirtDriver(fake_virt.FakeVirtAPI())
        self.instance = self.make_instance()
        self.inst_dir = os.path.join(self.instances_path, self.instance.uuid)
        os.makedirs(self.inst_dir)
        self.disk = os.path.join(self.inst_dir, 'disk')

    def test_finish_migration_hands_the_source_formats_on(self):
        seen = []

        def nova_finish(drv, context, migration, instance, disk_info,
                        *args, **kwargs):
            # What the backend's disks see while nova finishes the move.
            seen.append((migration_format(self.disk),
                         migration_format(self.disk + '.local')))

        self.useFixture(fixtures.MonkeyPatch(
            'nova.virt.libvirt.driver.LibvirtDriver.finish_migration',
            nova_finish))
        disk_info = json.dumps([
            {'path': '/elsewhere/%s/disk' % self.instance.uuid,
             'type': 'raw'},
            {'path': '/elsewhere/%s/disk.local' % self.instance.uuid,
             'type': 'qcow2'}])
        self.drv.finish_migration(None, None, self.instance, disk_info,
                                  None, None, True, {})
        self.assertEqual([('raw', 'qcow2')], seen)
        # Only while it runs.
        self.assertIsNone(migration_format(self.disk))

    def test_converted_disk_is_recorded_qcow2(self):
        self.flags(preallocate_images='none')
        with open(self.disk, 'wb') as f:
            f.truncate(units.Mi)
        formats.record_format(self.disk, 'raw')
        with operation.MIGRATIONS.finishing(self.instance, {'disk': 'raw'}):
            self.drv._disk_raw_to_qcow2(self.disk)
            self.assertEqual('qcow2', migration_format(self.disk))
        with open(os.path.join(self.inst_dir, 'disk.info')) as f:
            self.assertEqual({self.disk: 'qcow2'}, json.load(f))
        with open(self.disk, 'rb') as f:
            self.assertEqual(b'QFI\xfb', f.read(4))


class TestRecordConnection(base.TestCase):
    """init_host records the connection's libvirt and QEMU versions for
    discard-no-unref. The connection is a stub: the versions are what is
    under test, and no libvirtd runs in this tier (the real tier's driver
    records real ones).
    """

    class _Conn:

        def __init__(self, lib, emulator, fail=False):
            self.lib, self.emulator, self.fail = lib, emulator, fail

        def getLibVersion(self):
            if self.fail:
                raise RuntimeError('connection lost')
            return self.lib

        def getVersion(self):
            return self.emulator

    def record(self, conn):
        host = type('Host', (), {'get_connection': lambda self: conn})()
        drv = type('Drv', (), {'_host': host})()
        driver.LibvirtDriver._record_connection(drv)

    def setUp(self):
        super().setUp()
        hostcaps.forget()
        self.addCleanup(hostcaps.forget)
        self.useFixture(fixtures.MockPatchObject(
            hostcaps, '_host_discard_no_unref',
            return_value=[hostcaps.Answer(True, 'y')]))

    def test_recorded(self):
        self.record(self._Conn(9000000, 7002022))
        answer = hostcaps.discard_no_unref()
        self.assertFalse(answer.supported)
        self.assertIn('9.0.0', answer.reason)
        self.record(self._Conn(11003000, 10000013))
        self.assertTrue(hostcaps.discard_no_unref().supported)

    def test_failure_never_stops_nova_compute(self):
        self.record(self._Conn(0, 0, fail=True))
        self.assertIn('not asked', hostcaps.discard_no_unref().reason)


# Holds the host's adopt lock, as a running adopt does (its own process),
# for argv[2] seconds.
LOCK_HOLDER = '''
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print('held', flush=True)
time.sleep(float(sys.argv[2]))
'''


class InactiveDomain:
    """The domain of a guest not running (the host has just booted)."""

    def isActive(self):
        return False

    def ID(self):
        return -1


class TestRecoveryAtStart(base.TestCase):
    """nova-compute's start recovers what an adoption a power cut
    interrupted before nova starts any guest, also while an adopt holds
    the host's lock (an adopt timer that took it first at boot). Real
    files and a real flock held by another process; libvirt's connection
    and nova's instance list are stand-ins (no libvirtd or database in this
    tier).
    """

    def setUp(self):
        super().setUp()
        self.top = self.useFixture(fixtures.TempDir()).path
        self.flags(instances_path=self.top)
        d = os.path.join(self.top, 'uuid')
        os.mkdir(d)
        self.disk = os.path.join(d, 'disk')
        # Cut between the swap and the pivot: the disk's name is the
        # half-made copy, the guest's disk beside it.
        for path, text in ((self.disk, 'half-made copy'),
                           (self.disk + live.ORIG_SUFFIX, 'guest')):
            with open(path, 'w') as f:
                f.write(text)
        with open(live.journal_path(self.disk), 'w') as f:
            json.dump({'phase': live.SWAPPED, 'dev': 'vda'}, f)
        conn = mock.Mock()
        conn.lookupByUUIDString.return_value = InactiveDomain()
        self.driver = mock.Mock()
        self.driver._host.get_connection.return_value = conn
        self.useFixture(fixtures.MockPatch(
            'nova.objects.InstanceList.get_by_host', return_value=[]))
        self.log = self.useFixture(fixtures.FakeLogger(
            name='prealloc_backend'))

    def hold_lock(self, seconds):
        proc = subprocess.Popen(
            [sys.executable, '-c', LOCK_HOLDER,
             recovery.lock_path(self.top, 'h1'), str(seconds)],
            stdout=subprocess.PIPE, text=True)
        self.addCleanup(proc.wait)
        self.addCleanup(proc.kill)
        self.assertEqual('held', proc.stdout.readline().strip())
        return proc

    def read_disk(self):
        with open(self.disk) as f:
            return f.read()

    def test_waits_for_the_adopt_then_recovers(self):
        proc = self.hold_lock(2)
        driver.LibvirtDriver._recover_adoptions(self.driver, 'h1')
        self.assertIsNotNone(proc.poll())
        self.assertIn('waiting up to %d s' % recovery.RECOVERY_WAIT,
                      self.log.output)
        self.assertEqual('guest', self.read_disk())
        self.assertEqual(['disk'], os.listdir(os.path.dirname(self.disk)))
        self.assertTrue(recovery.recovered_this_boot(self.top, 'h1'))

    def test_an_adopt_that_recovered_this_boot_is_not_waited_for(self):
        self.hold_lock(60)
        recovery.mark_recovered(self.top, 'h1')
        started = time.monotonic()
        driver.LibvirtDriver._recover_adoptions(self.driver, 'h1')
        self.assertLess(time.monotonic() - started, 30)
        self.assertIn('has recovered', self.log.output)
        # Whatever is beside the disk is the running adopt's.
        self.assertEqual('half-made copy', self.read_disk())

    def test_a_record_of_another_boot_is_not_taken(self):
        self.hold_lock(60)
        with open(recovery.recovered_path(self.top, 'h1'), 'w') as f:
            f.write('another boot')
        self.useFixture(fixtures.MockPatch(
            'prealloc_backend.adoption.recovery.RECOVERY_WAIT', 1))
        driver.LibvirtDriver._recover_adoptions(self.driver, 'h1')
        self.assertIn('is not recovered', self.log.output)
        self.assertIn('without recovering since this boot', self.log.output)
        self.assertEqual('half-made copy', self.read_disk())
