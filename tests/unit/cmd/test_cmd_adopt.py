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

"""prealloc-backend adopt: its arguments and which disks it looks at.

Its work against nova and a real libvirtd: tests/functional/real/
test_adopt.py.
"""

import argparse
import io
import os
import subprocess
import types
from unittest import mock

import fixtures
from nova import exception as nova_exception
from oslo_utils import units

from prealloc_backend.adoption import recovery
from prealloc_backend.cmd import adopt
from prealloc_backend.planner import diskplan
from tests import base

XML = '''<domain><devices>
  <disk type='file' device='disk'><source file='%(d)s/disk'/>
    <target dev='vda'/></disk>
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
    def __init__(self, xml):
        self.xml = xml

    def XMLDesc(self, flags):
        return self.xml


class TestArguments(base.TestCase):

    def parse(self, *argv):
        parser = argparse.ArgumentParser()
        adopt.add_arguments(parser)
        return parser.parse_args(argv)

    def test_rate_in_mib_per_second(self):
        self.assertEqual(16 * 1024 * 1024,
                         self.parse('--all', '--max-rate', '16').max_rate)
        self.assertEqual(512 * 1024,
                         self.parse('--all', '--max-rate', '0.5').max_rate)

    def test_bad_rate_is_refused_naming_it(self):
        for bad in ('0', '-3', 'fast', 'inf', 'nan', '1e-9', '1e300'):
            err = self.assertRaises(SystemExit, self.parse, '--all',
                                    '--max-rate', bad)
            self.assertEqual(2, err.code)

    def test_instance_or_all_required(self):
        self.assertRaises(SystemExit, self.parse)
        self.assertRaises(SystemExit, self.parse, '--all', '--instance',
                          'x')


class TestCandidateDisks(base.TestCase):

    def test_only_nova_disks_of_the_instance_directory(self):
        root = self.useFixture(fixtures.TempDir()).path
        self.flags(instances_path=root)
        d = os.path.join(root, 'uuid')
        found = adopt.candidate_disks(Domain(XML % {'d': d}), 'uuid')
        self.assertEqual([('vda', d + '/disk'), ('vdb', d + '/disk.eph0')],
                         found)


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
        xml = """<domain><devices>
          <disk type='file' device='disk'><source file='%(d)s/disk'/>
            <target dev='vda'/></disk>
          <disk type='file' device='disk'><source file='%(d)s/disk.eph0'/>
            <target dev='vdb'/></disk></devices></domain>""" % {'d': d}
        domain = Domain(xml)
        conn = types.SimpleNamespace(lookup=lambda uuid: domain)
        instance = types.SimpleNamespace(
            uuid='uuid', host='h1', task_state=None, vm_state='active',
            flavor=types.SimpleNamespace(extra_specs={}))
        # Room for one 1 GiB reservation, not two.
        self.useFixture(fixtures.MockPatch(
            'prealloc_backend.disk.fsprobe.facts',
            return_value=diskplan.FsFacts(True, 'xfs',
                                          free_bytes=units.Gi * 3 // 2)))
        report = adopt.Report(out=io.StringIO())
        adopt.adopt_instance(None, conn, instance, report, dry_run=True)
        lines = report.out.getvalue().splitlines()
        self.assertIn('vda: would adopt', lines[0])
        self.assertIn('vdb: not adopted', lines[1])
        self.assertIn('bytes free', lines[1])


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
        self.assertTrue(adopt._claim(inst))
        self.assertEqual([(adopt.TASK_STATE, [None])], inst.saved)
        # Its host and state are checked from a read after the claim.
        self.assertEqual(1, inst.refreshed)

    def test_busy_instance_is_not_claimed_and_says_its_state(self):
        busy = nova_exception.UnexpectedTaskStateError(
            instance_uuid='uuid', expected=[None], actual='resize_prep')
        inst = Instance(fail=busy, now='resize_prep')
        self.assertFalse(adopt._claim(inst))
        self.assertEqual('resize_prep', inst.task_state)

    def test_deleted_instance_is_not_claimed(self):
        gone = nova_exception.InstanceNotFound(instance_id='uuid')
        self.assertFalse(adopt._claim(Instance(fail=gone)))


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
        report = adopt.Report(io.StringIO())
        adopt.adopt_instance(None, self.conn, inst, report)
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


class TestExitStatus(base.TestCase):

    def test_highest_of_left_and_failed(self):
        report = adopt.Report(io.StringIO())
        self.assertEqual(0, report.status)
        report.left('busy')
        self.assertEqual(1, report.status)
        report.failed('copy failed')
        report.left('busy')
        self.assertEqual(2, report.status)
        self.assertEqual('busy\ncopy failed\nbusy\n', report.out.getvalue())

    def test_another_adopt_running_is_an_error_of_the_command(self):
        args = argparse.Namespace(verbose=False)
        with mock.patch.object(adopt, '_run', side_effect=(
                recovery.AlreadyRunning('locked'))), \
                mock.patch('sys.stdout', new_callable=io.StringIO) as out:
            self.assertEqual(255, adopt.run(args))
        self.assertEqual('Error: locked\n', out.getvalue())
