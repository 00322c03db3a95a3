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

"""prealloc_backend/checks/host.py: the Host the checks read, from a real
nova.conf and the real filesystem of a temporary instances_path.
"""

import os

import fixtures
from oslo_utils import units

from prealloc_backend.checks import host as check_host
from prealloc_backend.checks import owner
from prealloc_backend.disk import fsprobe
from prealloc_backend.planner import diskplan
from prealloc_backend.planner import modes
from tests import base
from tests import fixtures as pb_fixtures


class HostTestCase(base.CheckTestCase):

    def test_disk_format(self):
        cases = [('qcow2', None, diskplan.DiskFormat.QCOW2),
                 ('raw', None, diskplan.DiskFormat.RAW),
                 ('flat', None, diskplan.DiskFormat.RAW),
                 ('default', 'True', diskplan.DiskFormat.QCOW2),
                 ('default', 'False', diskplan.DiskFormat.RAW),
                 ('rbd', None, None), ('lvm', None, None)]
        for images_type, cow, expected in cases:
            sections = self.nova_conf(images_type=images_type)
            if cow is not None:
                sections['DEFAULT']['use_cow_images'] = cow
            host = self.check_host(sections)
            self.assertEqual(expected, host.disk_format, images_type)

    def test_mode(self):
        host = self.check_host(self.nova_conf(mode='metadata'))
        self.assertEqual(modes.Mode.METADATA, host.mode)

    def test_filesystem_facts_measured_once(self):
        host = self.check_host(self.nova_conf())
        with pb_fixtures.StatvfsSeen() as statvfs:
            fs = host.filesystem()
        vfs = os.statvfs(self.instances)
        self.assertEqual(self.instances, fs['instances_path'])
        self.assertTrue(fs['exists'])
        self.assertEqual(fsprobe.fs_type(self.instances), fs['fs_type'])
        self.assertEqual(fsprobe.supports_fallocate(self.instances),
                         fs['fallocate'])
        # f_bavail * f_frsize, measured on the instances filesystem.
        self.assertEqual(1, len(statvfs.seen))
        self.assertEqual(vfs.f_fsid, statvfs.seen[0].f_fsid)
        self.assertEqual(statvfs.free_bytes(), fs['free_bytes'])
        self.assertIs(fs, host.filesystem())
        # The probe leaves nothing behind in instances_path.
        self.assertEqual([], os.listdir(self.instances))
        facts = host.fs_facts()
        self.assertEqual((fs['fallocate'], fs['fs_type'], fs['free_bytes']),
                         (facts.fallocate_ok, facts.fstype,
                          facts.free_bytes))

    def test_failed_probe_run_once(self):
        # A probe the nova user killed or stopped: every check that needs
        # the facts gets the same failure, the step is not run again.
        host = self.check_host(self.nova_conf())
        runs = []

        def run_in(fd, path, step, *args, **kwargs):
            runs.append(kwargs)
            raise owner.StepTimedOut('Timeout', 'the fallocate(2) probe '
                                     'did not end', 'nova')

        self.useFixture(fixtures.MockPatchObject(owner, 'run_in', run_in))
        first = self.assertRaises(owner.StepTimedOut, host.filesystem)
        again = self.assertRaises(owner.StepTimedOut, host.fs_facts)
        self.assertIs(first, again)
        self.assertEqual(1, len(runs))
        self.assertEqual(check_host.FALLOCATE_DEADLINE,
                         runs[0]['deadline'])
        self.assertEqual('the fallocate(2) probe', runs[0]['what'])

    def test_missing_instances_path_measured_where_it_would_be(self):
        sections = self.nova_conf()
        missing = os.path.join(self.instances, 'not', 'yet')
        sections['DEFAULT']['instances_path'] = missing
        fs = self.check_host(sections).filesystem()
        self.assertEqual((missing, False, self.instances),
                         (fs['instances_path'], fs['exists'],
                          fs['directory']))

    def test_plan_for_the_host_and_for_a_flavor(self):
        host = self.check_host(self.nova_conf(mode='space',
                                              fallocate_unsupported='warn'),
                               disk_size=units.Gi)
        plan = host.plan(units.Gi)
        expected = diskplan.make_plan(
            host.conf.prealloc_backend, {}, modes.Mode.SPACE,
            host.disk_format, units.Gi, host.fs_facts(),
            path=self.instances)
        self.assertEqual(expected, plan)
        flavor = host.plan(units.Gi, mode=modes.Mode.NONE,
                           fmt=diskplan.DiskFormat.RAW)
        self.assertEqual(diskplan.make_plan(
            host.conf.prealloc_backend, {}, modes.Mode.NONE,
            diskplan.DiskFormat.RAW, units.Gi, host.fs_facts(),
            path=self.instances), flavor)

    def test_probe_fallocate_in_a_held_directory(self):
        fd = os.open(self.instances, os.O_RDONLY | os.O_DIRECTORY)
        self.addCleanup(os.close, fd)
        self.assertEqual(fsprobe.supports_fallocate(self.instances),
                         check_host.probe_fallocate(fd, self.instances))
