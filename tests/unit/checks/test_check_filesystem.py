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

"""The filesystem checks on the test's real temporary filesystem.

fallocate(2) support and the type are read here independently (the
fallocate command, findmnt); free space is checked against what statvfs
answered the check, and a disk larger than the filesystem stands for a full
one. Filesystems without fallocate(2) and really full ones need loop
mounts: tests/privileged.
"""

import json
import os
import subprocess

from oslo_utils import units

from prealloc_backend.checks import filesystem
from prealloc_backend.checks import result
from tests import base
from tests import fixtures as pb_fixtures


def findmnt_fstype(path):
    return subprocess.run(['findmnt', '-n', '-o', 'FSTYPE', '-T', path],
                          check=True, capture_output=True,
                          text=True).stdout.strip()


class FilesystemCase(base.CheckTestCase):

    def host(self, disk_size=64 * units.Mi, images_type=None, **options):
        return self.check_host(self.nova_conf(images_type, **options),
                               disk_size=disk_size)


class TestFilesystem(FilesystemCase):

    def test_fallocate_supported(self):
        probe = os.path.join(self.tmp, 'probe')
        proc = subprocess.run(['fallocate', '-l', '64K', probe],
                              capture_output=True, text=True)
        if proc.returncode:
            self.skipTest('no fallocate(2) here: %s' % proc.stderr)
        res = filesystem.check_filesystem(self.host())
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        self.assertTrue(res.facts['fallocate'])
        self.assertEqual(findmnt_fstype(self.instances), res.facts['fs_type'])
        self.assertEqual(self.instances, res.facts['instances_path'])
        self.assertTrue(res.facts['exists'])
        self.assertIn('fallocate(2) supported (probed)', res.details)
        # The probe leaves nothing behind.
        self.assertEqual([], os.listdir(self.instances))

    def test_instances_path_not_made_yet(self):
        self.instances = os.path.join(self.instances, 'not', 'yet')
        res = filesystem.check_filesystem(self.host())
        self.assertFalse(res.facts['exists'])
        self.assertEqual(os.path.join(self.tmp, 'instances'),
                         res.facts['directory'])
        self.assertIn('does not exist yet', res.details)


class TestFreeSpace(FilesystemCase):

    def test_room(self):
        host = self.host(images_type='raw')
        with pb_fixtures.StatvfsSeen() as statvfs:
            res = filesystem.check_free_space(host)
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        # Mode space, raw, fallocate(2): the whole disk is allocated.
        self.assertEqual(64 * units.Mi, res.facts['needed_bytes'])
        self.assertEqual(64 * units.Mi, res.facts['disk_bytes'])
        self.assertEqual('raw, fallocate', res.facts['allocation'])
        # The free space of the instances filesystem, as measured.
        self.assertEqual(os.statvfs(self.instances).f_fsid,
                         statvfs.seen[0].f_fsid)
        self.assertEqual(statvfs.free_bytes(), res.facts['free_bytes'])
        self.assertIn('room for', res.details)

    def test_qcow2_falloc_needs_what_qemu_img_measures(self):
        res = filesystem.check_free_space(self.host())
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        self.assertEqual('qcow2 preallocation=falloc',
                         res.facts['allocation'])
        # The default layout: 128K clusters, extended_l2.
        measured = json.loads(subprocess.run(
            ['qemu-img', 'measure', '--output=json', '-O', 'qcow2', '-o',
             'cluster_size=131072,extended_l2=on,preallocation=falloc',
             '--size', str(64 * units.Mi)], check=True, capture_output=True,
            text=True).stdout)
        self.assertEqual(measured['fully-allocated'],
                         res.facts['needed_bytes'])

    def test_disk_larger_than_the_filesystem(self):
        vfs = os.statvfs(self.instances)
        size = 2 * vfs.f_blocks * vfs.f_frsize
        res = filesystem.check_free_space(self.host(disk_size=size))
        self.assertEqual(result.Code.FAILURE, res.code, res.details)
        # qcow2, falloc: at least the data area.
        self.assertGreaterEqual(res.facts['needed_bytes'], size)
        self.assertLess(res.facts['free_bytes'], size)
        self.assertIn('Not enough space to preallocate disk', res.details)
        self.assertIn('Free space on that filesystem', res.fix)

    def test_thin_disks_need_only_a_little(self):
        vfs = os.statvfs(self.instances)
        size = 2 * vfs.f_blocks * vfs.f_frsize
        res = filesystem.check_free_space(self.host(
            disk_size=size, images_type='raw', mode='none'))
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        self.assertEqual(0, res.facts['needed_bytes'])
        self.assertEqual(size, res.facts['needed_bytes_full'])
        self.assertIn('0 with a flavor asking prealloc:mode=full',
                      res.details)

    def test_disks_not_in_instances_path(self):
        res = filesystem.check_free_space(self.host(images_type='rbd'))
        self.assertEqual(result.Code.SUCCESS, res.code)
        self.assertNotIn('needed_bytes', res.facts)
        self.assertIn('not files in instances_path', res.details)
