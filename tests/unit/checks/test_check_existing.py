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

"""The existing-disks check on real overlays made by qemu-img."""

import json
import os
import subprocess

from oslo_utils import units

from prealloc_backend.checks import existing
from prealloc_backend.checks import result
from tests import base


class TestExistingDisks(base.CheckTestCase):

    def setUp(self):
        super().setUp()
        self.base_file = os.path.join(self.instances, '_base', 'img')
        os.makedirs(os.path.dirname(self.base_file))
        subprocess.run(['qemu-img', 'create', '-q', '-f', 'raw',
                        self.base_file, '4M'], check=True)

    def overlay(self, uuid, name='disk', plugin=False):
        os.makedirs(os.path.join(self.instances, uuid), exist_ok=True)
        path = os.path.join(self.instances, uuid, name)
        opts = 'backing_file=%s,backing_fmt=raw' % self.base_file
        if plugin:
            opts += (',cluster_size=128k,extended_l2=on,'
                     'preallocation=falloc')
        subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-o',
                        opts, path, '1G'], check=True)
        self.record(path, 'qcow2')
        return path

    def record(self, path, fmt):
        """nova's disk.info beside ``path`` says ``fmt`` of it."""
        info = os.path.join(os.path.dirname(path), 'disk.info')
        try:
            with open(info) as f:
                record = json.load(f)
        except FileNotFoundError:
            record = {}
        record[path] = fmt
        with open(info, 'w') as f:
            json.dump(record, f)

    def check(self, **prealloc):
        host = self.check_host(self.nova_conf(**prealloc))
        return existing.check_existing_disks(host)

    def test_counts_disks_not_at_policy(self):
        self.overlay('a')
        self.overlay('a', 'disk.eph0')
        self.overlay('b', plugin=True)
        res = self.check(mode='space')
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        self.assertEqual(['a/disk', 'a/disk.eph0'], res.facts['disks'])
        self.assertEqual(1, res.facts['at_policy'])
        self.assertEqual(2 * units.Gi, res.facts['virtual_bytes'])
        # Each replacement reserves its whole virtual size and its tables.
        self.assertGreater(res.facts['would_reserve_bytes'], 2 * units.Gi)
        self.assertIn('2 existing overlay(s)', res.details)
        self.assertIn('not at the policy of mode space', res.details)

    def test_metadata_mode_judges_the_layout_only(self):
        self.overlay('a')
        self.overlay('b', plugin=True)
        res = self.check(mode='metadata')
        self.assertEqual(['a/disk'], res.facts['disks'])
        self.assertLess(res.facts['would_reserve_bytes'], 64 * units.Mi)

    def test_mode_none_has_nothing_to_adopt(self):
        self.overlay('a')
        res = self.check(mode='none')
        self.assertIn('nothing to adopt', res.details)

    def test_nothing_is_followed(self):
        # A symlink, a FIFO and a directory named like disks, a symlinked
        # instance directory, a file that is not qcow2: none is read.
        target = self.overlay('real')
        os.makedirs(os.path.join(self.instances, 'c'))
        os.symlink(target, os.path.join(self.instances, 'c', 'disk'))
        os.mkfifo(os.path.join(self.instances, 'c', 'disk.local'))
        os.mkdir(os.path.join(self.instances, 'c', 'disk.swap'))
        os.symlink(os.path.join(self.instances, 'real'),
                   os.path.join(self.instances, 'linked'))
        with open(os.path.join(self.instances, 'c', 'disk.eph0'), 'wb') as f:
            f.write(b'not qcow2' * 100)
        res = self.check(mode='space')
        self.assertEqual(['real/disk'], res.facts['disks'])

    def test_adoption_leftovers_are_not_disks(self):
        path = self.overlay('a')
        os.link(path, path + '.prealloc-adopt-orig')
        res = self.check(mode='space')
        self.assertEqual(['a/disk'], res.facts['disks'])

    def test_blocks_the_file_holds_are_not_reserved_again(self):
        path = self.overlay('a')
        small = self.check(mode='space').facts['would_reserve_bytes']
        # The guest wrote 512 MiB (blocks past the header the check reads).
        before = os.stat(path).st_blocks * 512
        fd = os.open(path, os.O_WRONLY)
        try:
            os.posix_fallocate(fd, units.Mi, 512 * units.Mi)
        finally:
            os.close(fd)
        grown = os.stat(path).st_blocks * 512 - before
        self.assertGreaterEqual(grown, 512 * units.Mi)
        res = self.check(mode='space')
        self.assertEqual(['a/disk'], res.facts['disks'])
        self.assertEqual(small - grown, res.facts['would_reserve_bytes'])

    def test_qcow2_without_backing_file_is_not_counted(self):
        # adopt rewrites overlays of nova's image cache only.
        self.overlay('a')
        subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2',
                        os.path.join(self.instances, 'a', 'disk.local'),
                        '1G'], check=True)
        res = self.check(mode='space')
        self.assertEqual(['a/disk'], res.facts['disks'])

    def test_leftovers_of_an_ephemeral_disk_are_not_disks(self):
        path = self.overlay('a', 'disk.eph0')
        os.link(path, path + '.prealloc-adopt-orig')
        os.link(path, path + '.prealloc-adopt-new')
        res = self.check(mode='space')
        self.assertEqual(['a/disk.eph0'], res.facts['disks'])

    def test_instances_path_swapped_for_a_symlink_is_not_read(self):
        self.overlay('a')
        host = self.check_host(self.nova_conf(mode='space'))
        real = self.instances + '.real'
        os.rename(self.instances, real)
        os.symlink(real, self.instances)
        res = existing.check_existing_disks(host)
        self.assertEqual(result.Code.SUCCESS, res.code)
        self.assertIn('not read', res.details)
        self.assertNotIn('disks', res.facts)

    def test_only_disks_nova_records_as_qcow2_count(self):
        # A raw disk whose guest wrote a qcow2 header (adopt leaves it as
        # it is), and an overlay disk.info does not list.
        raw = self.overlay('a')
        self.record(raw, 'raw')
        unlisted = self.overlay('b')
        os.unlink(os.path.join(os.path.dirname(unlisted), 'disk.info'))
        self.overlay('c')
        res = self.check(mode='space')
        self.assertEqual(['c/disk'], res.facts['disks'])
