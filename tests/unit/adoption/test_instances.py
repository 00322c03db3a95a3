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

"""prealloc_backend.adoption.instances: which disks adopt looks at, the
claim, an instance's and a disk's adoption, the run.

Real overlays, qemu-img and image locks; the domains, the connection and
nova's instances are stand-ins (no libvirtd in this tier). The same work
against nova and a real libvirtd: tests/functional/real/test_adopt.py.
The command's arguments and report: tests/unit/cmd/test_cmd_adopt.py.
"""

import hashlib
import io
import json
import os
import signal
import subprocess
import types
from unittest import mock

import fixtures
from nova import exception as nova_exception
from oslo_utils import units

from prealloc_backend.adoption import instances
from prealloc_backend.adoption import recovery
from prealloc_backend.cmd import adopt as adopt_cmd
from prealloc_backend.planner import diskplan
from prealloc_backend.system import fileops
from prealloc_backend.system import stopping
from tests import base

XML = '''<domain><devices>
  <disk type='file' device='disk'><driver name='qemu' type='qcow2'/>
    <source file='%(d)s/disk'/><target dev='vda'/></disk>
  <disk type='file' device='disk'><source file='%(d)s/disk.eph0'/>
    <target dev='vdb'/></disk>
  <disk type='file' device='cdrom'><source file='%(d)s/disk.config'/>
    <target dev='hda'/></disk>
  <disk type='file' device='disk'><source file='/elsewhere/disk'/>
    <target dev='vdc'/></disk>
  <disk type='file' device='disk'><source file='%(d)s/console.log'/>
    <target dev='vdd'/></disk>
  <disk type='block' device='disk'><source dev='/dev/sdb'/>
    <target dev='vde'/></disk>
</devices></domain>'''


class Domain:
    """libvirt's domain as adopt reads it: its XML, and its block info
    (capacity, allocation, physical) per target dev.
    """

    def __init__(self, xml, capacity=None, active=False):
        self.xml = xml
        self.capacity = capacity or {}
        self.active = active
        self.calls = []

    def XMLDesc(self, flags):
        return self.xml

    def blockInfo(self, dev, flags=0):
        self.calls.append(('blockInfo', dev))
        return [self.capacity[dev], 0, 0]

    def isActive(self):
        self.calls.append(('isActive',))
        return self.active


class TestCandidateDisks(base.TestCase):

    def test_only_nova_disks_of_the_instance_directory(self):
        root = self.useFixture(fixtures.TempDir()).path
        self.flags(instances_path=root)
        d = os.path.join(root, 'uuid')
        found = instances.candidate_disks(Domain(XML % {'d': d}), 'uuid')
        # With the format the domain gives QEMU (<driver type>).
        self.assertEqual([('vda', d + '/disk', 'qcow2'),
                          ('vdb', d + '/disk.eph0', None)], found)


class TestRoomAcrossDisks(base.TestCase):
    """An instance's disks share its directory's filesystem: each
    replacement is judged against the room the ones before it take. Real
    overlays (qemu-img); the free space is the figure the test gives
    (fsprobe.facts patched), the domain and instance are stand-ins.
    """

    def test_second_disk_judged_against_what_the_first_leaves(self):
        root = self.useFixture(fixtures.TempDir()).path
        self.flags(instances_path=root, host='h1')
        self.flags(group='prealloc_backend', mode='space')
        os.mkdir(os.path.join(root, '_base'))
        base_file = os.path.join(root, '_base', 'img')
        with open(base_file, 'wb') as f:
            f.truncate(units.Mi)
        d = os.path.join(root, 'uuid')
        os.mkdir(d)
        for name in ('disk', 'disk.eph0'):
            subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-b',
                            base_file, '-F', 'raw', os.path.join(d, name),
                            str(units.Gi)], check=True)
        record(d, disk='qcow2', **{'disk.eph0': 'qcow2'})
        xml = """<domain><devices>
          <disk type='file' device='disk'><driver type='qcow2'/>
            <source file='%(d)s/disk'/><target dev='vda'/></disk>
          <disk type='file' device='disk'><driver type='qcow2'/>
            <source file='%(d)s/disk.eph0'/><target dev='vdb'/></disk>
          </devices></domain>""" % {'d': d}
        domain = Domain(xml, {'vda': units.Gi, 'vdb': units.Gi})
        conn = types.SimpleNamespace(lookup=lambda uuid: domain)
        instance = types.SimpleNamespace(
            uuid='uuid', host='h1', task_state=None, vm_state='active',
            flavor=types.SimpleNamespace(extra_specs={}))
        # Room for one 1 GiB reservation, not two.
        self.useFixture(fixtures.MockPatch(
            'prealloc_backend.disk.fsprobe.facts',
            return_value=diskplan.FsFacts(True, 'xfs',
                                          free_bytes=units.Gi * 3 // 2)))
        report = adopt_cmd.Report(out=io.StringIO())
        instances.adopt_instance(None, conn, instance, report, dry_run=True)
        lines = report.out.getvalue().splitlines()
        self.assertIn('vda: would adopt', lines[0])
        self.assertIn('vdb: not adopted', lines[1])
        self.assertIn('bytes free', lines[1])


def record(directory, **formats):
    """nova's disk.info in ``directory``: {path: format} of its disks."""
    with open(os.path.join(directory, 'disk.info'), 'w') as f:
        json.dump({os.path.join(directory, name): fmt
                   for name, fmt in formats.items()}, f)


def sha256(path):
    with open(path, 'rb') as f:
        return hashlib.sha256(f.read()).hexdigest()


class _InstanceDir(base.TestCase):
    """An instance directory in instances_path, nova's image cache beside
    it, and what adopt reports.
    """

    def setUp(self):
        super().setUp()
        self.root = self.useFixture(fixtures.TempDir()).path
        self.flags(instances_path=self.root, host='h1')
        os.mkdir(os.path.join(self.root, '_base'))
        # nova's swap base: a name a guest can guess.
        self.swap_base = os.path.join(self.root, '_base', 'swap_64')
        with open(self.swap_base, 'wb') as f:
            f.truncate(64 * units.Mi)
        self.dir = os.path.join(self.root, 'uuid')
        os.mkdir(self.dir)
        self.disk = os.path.join(self.dir, 'disk')
        self.report = adopt_cmd.Report(out=io.StringIO())

    def guest_wrote_a_header(self, size=64 * units.Mi):
        """A raw disk of ``size`` bytes of its guest's data, whose first
        bytes its guest made a qcow2 header naming ../_base/swap_64 as its
        backing file, with a virtual size of 2 GiB.
        """
        with open(self.disk, 'wb') as f:
            for i in range(size // units.Mi):
                f.write(bytes([i % 251 + 1]) * units.Mi)
        header = os.path.join(self.root, 'header.qcow2')
        subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-b',
                        '../_base/swap_64', '-F', 'raw', '-u', header,
                        str(2 * units.Gi)], check=True)
        with open(header, 'rb') as src, open(self.disk, 'r+b') as dst:
            dst.write(src.read(65536))
        os.unlink(header)

    def overlay(self, size=units.Gi):
        subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-b',
                        self.swap_base, '-F', 'raw', self.disk, str(size)],
                       check=True)

    def domain(self, fmt, capacity, active=False):
        xml = ("<domain><devices><disk type='file' device='disk'>"
               "<driver name='qemu' type='%s'/><source file='%s'/>"
               "<target dev='vda'/></disk></devices></domain>"
               % (fmt, self.disk))
        return Domain(xml, {'vda': capacity}, active=active)

    def adopt(self, domain, mode='space', dry_run=False, root_gb=0,
              vm_state='stopped', swap=0):
        self.flags(group='prealloc_backend', mode=mode)
        conn = types.SimpleNamespace(lookup=lambda uuid: domain)
        inst = Instance()
        inst.host = 'h1'
        inst.vm_state = vm_state
        inst.flavor = types.SimpleNamespace(extra_specs={}, root_gb=root_gb,
                                            ephemeral_gb=0, swap=swap)
        instances.adopt_instance(None, conn, inst, self.report,
                                 dry_run=dry_run)
        self.claims = inst.saved
        return self.report.out.getvalue()

    def assert_left_alone(self, before):
        self.assertEqual(1, self.report.status)
        self.assertEqual([], self.claims)
        self.assertEqual(before, sha256(self.disk))
        self.assertEqual(['disk', 'disk.info'], sorted(os.listdir(self.dir)))


class TestNovaRecordsDecide(_InstanceDir):
    """adopt acts only on disks nova's records say are qcow2 overlays:
    disk.info and the domain's <driver type> both qcow2, the header agreeing
    with them, the virtual size libvirt's and the flavor's. Real files and
    real qemu-img; the domain and the instance are stand-ins (no libvirtd
    or nova services in this tier; tests/functional/real/test_adopt.py
    has a real guest's raw disk refused).
    """

    def test_raw_disk_with_a_guest_written_header_is_refused(self):
        # Offline (stopped) and live (active: the refusal comes before any
        # libvirt call but the XML and the block info), each mode.
        self.guest_wrote_a_header()
        record(self.dir, disk='raw')
        before = sha256(self.disk)
        for mode in ('metadata', 'space', 'full'):
            for active, vm_state in ((False, 'stopped'), (True, 'active')):
                self.report = adopt_cmd.Report(out=io.StringIO())
                domain = self.domain('raw', 64 * units.Mi, active=active)
                out = self.adopt(domain, mode=mode, vm_state=vm_state)
                self.assertIn('%s: a raw disk (%s says raw, the domain\'s '
                              '<driver type> raw): adopt rewrites qcow2 '
                              'overlays only: left as it is'
                              % (self.disk, os.path.join(self.dir,
                                                         'disk.info')), out)
                self.assert_left_alone(before)
                self.assertEqual([], domain.calls)

    def test_records_that_disagree_are_refused_naming_both(self):
        self.guest_wrote_a_header()
        before = sha256(self.disk)
        for info_fmt, xml_fmt in (('qcow2', 'raw'), ('raw', 'qcow2'),
                                  (None, 'qcow2')):
            self.report = adopt_cmd.Report(out=io.StringIO())
            if info_fmt:
                record(self.dir, disk=info_fmt)
            else:
                os.unlink(os.path.join(self.dir, 'disk.info'))
                record(self.dir)
            out = self.adopt(self.domain(xml_fmt, 64 * units.Mi))
            self.assertIn("not a qcow2 overlay by nova's records (%s says "
                          "%s, the domain's <driver type> %s)"
                          % (os.path.join(self.dir, 'disk.info'),
                             info_fmt or 'nothing of it', xml_fmt), out)
            self.assert_left_alone(before)

    def test_header_that_disagrees_with_the_records_is_refused(self):
        with open(self.disk, 'wb') as f:
            f.write(b'\xaa' * units.Mi)
        record(self.dir, disk='qcow2')
        before = sha256(self.disk)
        out = self.adopt(self.domain('qcow2', units.Mi))
        self.assertIn('record qcow2, but its header says raw', out)
        self.assert_left_alone(before)

    def test_virtual_size_is_libvirts_and_the_flavors(self):
        self.overlay(units.Gi)
        record(self.dir, disk='qcow2')
        before = sha256(self.disk)
        # The header says 1 GiB, libvirt another size: refused.
        out = self.adopt(self.domain('qcow2', 2 * units.Gi))
        self.assertIn("its sizes disagree: libvirt's block info says %d "
                      "bytes, its header %d" % (2 * units.Gi, units.Gi), out)
        self.assert_left_alone(before)
        # libvirt and the header agree, the flavor's root_gb does not.
        self.report = adopt_cmd.Report(out=io.StringIO())
        out = self.adopt(self.domain('qcow2', units.Gi), root_gb=2)
        self.assertIn('its flavor %d' % (2 * units.Gi), out)
        self.assert_left_alone(before)

    def test_swap_and_ephemeral_sizes_are_their_mappings(self):
        # A swap block device mapping of 512 MiB on a flavor of 1 GiB of
        # swap (nova's API allows any size up to it): judged, not refused.
        self.disk = os.path.join(self.dir, 'disk.swap')
        self.overlay(512 * units.Mi)
        record(self.dir, **{'disk.swap': 'qcow2'})
        self.assertIsNone(instances.flavor_size(
            types.SimpleNamespace(root_gb=1, ephemeral_gb=2, swap=1024),
            'disk.swap'))
        out = self.adopt(self.domain('qcow2', 512 * units.Mi), root_gb=1,
                         swap=1024, dry_run=True)
        self.assertIn('would adopt %s' % self.disk, out)

    def test_an_overlay_by_every_record_is_judged(self):
        self.overlay(units.Gi)
        record(self.dir, disk='qcow2')
        out = self.adopt(self.domain('qcow2', units.Gi), root_gb=1,
                         dry_run=True)
        self.assertIn('vda: would adopt %s (mode space' % self.disk, out)
        # --dry-run: a disk would be adopted, so it is not at policy: 1.
        self.assertEqual(1, self.report.status)
        self.assertEqual([], self.claims)


class Instance:
    """nova's Instance as _claim uses it: save() is the compare-and-swap
    on task_state; refresh() reads what nova has now.
    """

    def __init__(self, task_state=None, fail=None, now=None):
        self.uuid = 'uuid'
        self.task_state = task_state
        self.fail = fail
        self.now = now
        self.saved = []
        self.refreshed = 0

    def save(self, expected_task_state=None):
        self.saved.append((self.task_state, expected_task_state))
        if self.fail:
            raise self.fail

    def refresh(self):
        self.refreshed += 1
        if self.now is not None:
            self.task_state = self.now


class TestClaim(base.TestCase):

    def test_claimed_only_if_nova_has_no_task_state(self):
        inst = Instance()
        self.assertTrue(instances.claim(inst))
        self.assertEqual([(instances.TASK_STATE, [None])], inst.saved)
        # Its host and state are checked from a read after the claim.
        self.assertEqual(1, inst.refreshed)

    def test_busy_instance_is_not_claimed_and_says_its_state(self):
        busy = nova_exception.UnexpectedTaskStateError(
            instance_uuid='uuid', expected=[None], actual='resize_prep')
        inst = Instance(fail=busy, now='resize_prep')
        self.assertFalse(instances.claim(inst))
        self.assertEqual('resize_prep', inst.task_state)

    def test_deleted_instance_is_not_claimed(self):
        gone = nova_exception.InstanceNotFound(instance_id='uuid')
        self.assertFalse(instances.claim(Instance(fail=gone)))


class NoDomain(Exception):
    def get_error_code(self):
        return recovery.VIR_ERR_NO_DOMAIN


class TestInstancesLeftAlone(base.TestCase):

    def setUp(self):
        super().setUp()
        self.flags(host='h1')
        self.conn = mock.Mock()
        # Were it asked: no domain, which would also leave it alone.
        self.conn.lookupByUUIDString.side_effect = NoDomain()

    def left(self, host='h1', task_state=None, vm_state='active'):
        inst = Instance(task_state)
        inst.host = host
        inst.vm_state = vm_state
        report = adopt_cmd.Report(io.StringIO())
        instances.adopt_instance(None, self.conn, inst, report)
        self.assertEqual(1, report.status)
        self.assertEqual([], inst.saved)
        self.assertEqual([], self.conn.mock_calls)
        return report.out.getvalue()

    def test_another_hosts_instance(self):
        self.assertIn('on host h2, not this one (h1)', self.left(host='h2'))

    def test_busy_instance(self):
        self.assertIn('task_state resize_prep: busy',
                      self.left(task_state='resize_prep'))

    def test_neither_active_nor_stopped(self):
        self.assertIn('vm_state paused: only active and stopped',
                      self.left(vm_state='paused'))


class BusyGuestDomain(Domain):
    """A running guest's domain whose block copy never comes into step
    (its bytes left grow at each look: the guest writes faster than the
    copy's rate). What QEMU would do with the files (hold the disk, close
    the copy's target on the abort) is done on the real files.
    """

    def __init__(self, xml, capacity):
        super().__init__(xml, capacity, active=True)
        self.job = False
        self.looks = 0

    def info(self):
        return [1]

    def ID(self):
        return 7

    def state(self):
        return [1, 1]

    def connect(self):
        return self

    def getLibVersion(self):
        return 9000000

    def blockCopy(self, dev, dest, params, flags):
        self.calls.append(('blockCopy', dev, dict(params)))
        self.job = True

    def blockJobInfo(self, dev, flags):
        if not self.job:
            return {}
        self.looks += 1
        return {'cur': 0, 'end': units.Mi * self.looks}

    def blockJobAbort(self, dev, flags):
        self.calls.append(('blockJobAbort', dev, flags))
        self.job = False

    def XMLDesc(self, flags):
        if not self.job:
            return self.xml
        return self.xml.replace('</disk>', "<mirror ready='no'/></disk>", 1)


class Conn:
    def __init__(self, domains):
        self.domains = domains

    def getURI(self):
        return 'test:///'

    def getLibVersion(self):
        return 9000000

    def lookupByUUIDString(self, uuid):
        return self.domains[uuid]


class TestCopyThatDoesNotConverge(_InstanceDir):
    """--all goes on after a running guest's copy that did not come into
    step, undone: the guest on its original disk, its claim released.
    Real overlays, qemu-img and image locks; the domains and nova's
    instance list are stand-ins.
    """

    def instance(self, uuid, vm_state):
        inst = Instance()
        inst.uuid = uuid
        inst.host = 'h1'
        inst.vm_state = vm_state
        inst.flavor = types.SimpleNamespace(extra_specs={}, root_gb=1,
                                            ephemeral_gb=0, swap=0)
        return inst

    def test_all_goes_on_after_a_copy_given_up(self):
        self.flags(group='prealloc_backend', mode='space')
        self.overlay(units.Gi)
        record(self.dir, disk='qcow2')
        before = sha256(self.disk)
        # QEMU's image lock on the disk it runs.
        fd = os.open(self.disk, os.O_RDONLY)
        self.addCleanup(os.close, fd)
        fileops.ofd_lock_shared(fd, fileops.QEMU_WRITER_BYTE)
        busy = BusyGuestDomain(self.domain('qcow2', units.Gi).xml,
                               {'vda': units.Gi})
        # A second instance, stopped, at policy already (mode none's
        # flavor): looked at after the first.
        other_dir = os.path.join(self.root, 'other')
        os.mkdir(other_dir)
        subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-b',
                        self.swap_base, '-F', 'raw',
                        os.path.join(other_dir, 'disk'), str(units.Gi)],
                       check=True)
        record(other_dir, disk='qcow2')
        other = Domain(("<domain><devices><disk type='file' device='disk'>"
                        "<driver type='qcow2'/><source file='%s/disk'/>"
                        "<target dev='vda'/></disk></devices></domain>"
                        % other_dir), {'vda': units.Gi})
        first = self.instance('uuid', 'active')
        second = self.instance('other', 'stopped')
        second.flavor.extra_specs = {'prealloc:mode': 'none'}
        with mock.patch('nova.objects.InstanceList.get_by_host',
                        return_value=[first, second]):
            report = instances.adopt(None, Conn({'uuid': busy,
                                                 'other': other}),
                                     self.report, bandwidth=None, stall=1)
        out = report.out.getvalue()
        self.assertIn('instance uuid vda: not adopted: %s: the block copy '
                      'of vda did not come into step: no new low of the '
                      'bytes left for 1 s'
                      % self.disk, out)
        self.assertIn('the copy was undone, the guest stays on its '
                      'original disk', out)
        self.assertIn('instance other vda: mode none', out)
        self.assertEqual(1, report.status)
        # The claim taken, then given back.
        self.assertEqual([(instances.TASK_STATE, [None]),
                          (None, [instances.TASK_STATE])], first.saved)
        self.assertIn(('blockJobAbort', 'vda', 0), busy.calls)
        self.assertEqual(before, sha256(self.disk))
        self.assertEqual(['disk', 'disk.info'], sorted(os.listdir(self.dir)))
        # Not left holding the host's lock.
        os.close(recovery.host_lock(self.root, 'h1'))


class PivotingDomain(BusyGuestDomain):
    """A running guest's domain whose copy comes into step at once; while
    the adoption has it paused for the pivot, SIGINT comes (``stop`` is
    requested). At the pivot it does what QEMU does with the files: it
    takes its image lock on the new file and drops the original's.
    """

    def __init__(self, xml, capacity, path, held_fd, stop):
        super().__init__(xml, capacity)
        self.path = path
        self.held = [held_fd]
        self.stop = stop
        self.paused = False

    def info(self):
        return [3 if self.paused else 1]

    def state(self):
        return [3, 1] if self.paused else [1, 1]

    def blockJobInfo(self, dev, flags):
        return {'cur': units.Mi, 'end': units.Mi} if self.job else {}

    def XMLDesc(self, flags):
        if not self.job:
            return self.xml
        return self.xml.replace('</disk>', "<mirror ready='yes'/></disk>", 1)

    def blockJobSetSpeed(self, dev, bandwidth, flags):
        self.calls.append(('blockJobSetSpeed', dev, bandwidth))

    def suspend(self):
        self.paused = True
        self.stop.request(signal.SIGINT)

    def resume(self):
        self.calls.append(('resume',))
        self.paused = False

    def blockJobAbort(self, dev, flags):
        self.calls.append(('blockJobAbort', dev, flags))
        self.job = False
        fd = os.open(self.path, os.O_RDONLY)
        fileops.ofd_lock_shared(fd, fileops.QEMU_WRITER_BYTE)
        os.close(self.held.pop())
        self.held.append(fd)


class TestCancelAfterThePivot(_InstanceDir):
    """A SIGINT that comes once the copy is in step: the pivot completes,
    the disk's line says adopted (the command then exits 130, as the cli
    page says). Real files, qemu-img and image locks; the domain is a
    stand-in.
    """

    def test_disk_reported_adopted(self):
        self.flags(group='prealloc_backend', mode='space')
        self.overlay(units.Gi)
        record(self.dir, disk='qcow2')
        fd = os.open(self.disk, os.O_RDONLY)
        fileops.ofd_lock_shared(fd, fileops.QEMU_WRITER_BYTE)
        stop = stopping.Stop()
        domain = PivotingDomain(self.domain('qcow2', units.Gi).xml,
                                {'vda': units.Gi}, self.disk, fd, stop)
        self.addCleanup(lambda: [os.close(f) for f in domain.held])
        inst = Instance()
        inst.host = 'h1'
        inst.vm_state = 'active'
        inst.flavor = types.SimpleNamespace(extra_specs={}, root_gb=1,
                                            ephemeral_gb=0, swap=0)
        instances.adopt_instance(None, types.SimpleNamespace(
            lookup=lambda uuid: domain), inst, self.report, stop=stop)
        out = self.report.out.getvalue()
        self.assertTrue(stop.requested)
        self.assertIn('instance uuid vda: adopted live', out)
        self.assertNotIn('cancelled', out)
        self.assertEqual(0, self.report.status)
        self.assertIn(('blockJobAbort', 'vda', 2), domain.calls)
        self.assertIn(('resume',), domain.calls)
        self.assertEqual(['disk', 'disk.info'], sorted(os.listdir(self.dir)))
        info = subprocess.run(['qemu-img', 'info', '--output=json', '-U',
                               self.disk], capture_output=True, check=True)
        self.assertTrue(json.loads(info.stdout)['format-specific']['data']
                        ['extended-l2'])
