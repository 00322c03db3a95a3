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

"""The instances directory as scan() reads it, against the real files:
disks made by the plugin's backend with real qemu-img and fallocate(2),
compared with st_blocks, ``qemu-img info`` and filefrag's extents.
"""

import json
import os

import fixtures

from oslo_utils import units

from prealloc_backend.disk import usage
from prealloc_backend.planner import capacity
from tests import base
from tests import fixtures as pb_fixtures


def filefrag_unwritten(path):
    """Bytes in unwritten extents, as filefrag (e2fsprogs) reports them."""
    size = os.stat(path).st_size
    total = 0
    for start, length, unwritten in pb_fixtures.extents(path):
        if unwritten:
            lo, hi = start * 4096, min((start + length) * 4096, size)
            total += max(0, hi - lo)
    return total


class TestScan(base.BackendTestCase):

    def make(self, images_type, mode, name='disk', fmt='raw'):
        img = self.image(images_type, mode, name=name)
        self.cache(img, fmt=fmt, filename='base-%s-%s' % (images_type, mode))
        return self.instance.uuid, img.path

    def scan(self, host_format='qcow2', **kwargs):
        return usage.scan_path(self.instances_path, host_format, **kwargs)

    def by_path(self, found):
        return {os.path.join(self.instances_path, d.instance, d.name): d
                for d in found.disks}

    def assertMatchesFile(self, disk, path):
        info = pb_fixtures.qemu_img_info(path)
        st = os.stat(path)
        self.assertEqual(info['format'], disk.fmt, path)
        self.assertEqual(info['virtual-size'], disk.virtual_size, path)
        self.assertEqual(st.st_blocks * 512, disk.allocated, path)
        self.assertEqual(st.st_size, disk.size, path)
        if disk.fmt == 'qcow2':
            self.assertEqual(info['cluster-size'], disk.cluster_size)
            specific = info['format-specific']['data']
            self.assertEqual(specific.get('extended-l2', False),
                             disk.extended_l2)
            self.assertEqual('backing-filename' in info, disk.backing)

    def test_disks_of_every_mode_match_their_files(self):
        made = {}
        for images_type, mode in (('qcow2', 'space'), ('qcow2', 'full'),
                                  ('qcow2', 'metadata'), ('qcow2', 'none'),
                                  ('raw', 'space'), ('raw', 'full'),
                                  ('raw', 'none')):
            made[(images_type, mode)] = self.make(images_type, mode)[1]
        found = self.scan(fiemap=True)
        self.assertEqual([], found.problems)
        disks = self.by_path(found)
        self.assertEqual(sorted(made.values()), sorted(disks))
        for (images_type, mode), path in made.items():
            disk = disks[path]
            self.assertMatchesFile(disk, path)
            # The extent map, read independently by filefrag.
            self.assertEqual(filefrag_unwritten(path), disk.unwritten,
                             (images_type, mode))
        # fallocate(2): reserved, not written; full: zeros written.
        self.assertGreaterEqual(disks[made[('raw', 'space')]].unwritten,
                                base.DISK - base.BASE - units.Mi)
        self.assertEqual(0, disks[made[('raw', 'full')]].unwritten)
        self.assertGreaterEqual(disks[made[('qcow2', 'space')]].unwritten,
                                base.DISK - base.BASE)
        self.assertEqual(0, disks[made[('qcow2', 'full')]].unwritten)
        # The eventual size: raw its size; qcow2 its data and metadata.
        self.assertEqual(base.DISK, disks[made[('raw', 'none')]].eventual)
        space = disks[made[('qcow2', 'space')]]
        self.assertGreaterEqual(space.eventual, space.allocated - units.Mi)

    def test_base_images_and_filesystem(self):
        self.make('qcow2', 'space')
        found = self.scan()
        base_dir = os.path.join(self.instances_path, '_base')
        names = os.listdir(base_dir)
        self.assertEqual(len(names), found.base_files)
        self.assertEqual(sum(pb_fixtures.allocated(os.path.join(base_dir, n))
                             for n in names), found.base_bytes)
        vfs = os.statvfs(self.instances_path)
        self.assertEqual(vfs.f_blocks * vfs.f_frsize, found.fs.size)
        # Read a moment apart: another writer may have moved it a little.
        self.assertAlmostEqual(vfs.f_bavail * vfs.f_frsize,
                               found.fs.available, delta=64 * units.Mi)
        # No fiemap asked: no extent read.
        self.assertIsNone(found.disks[0].unwritten)

    def test_only_flavor_disks_of_instance_directories(self):
        uuid, path = self.make('qcow2', 'space')
        directory = os.path.dirname(path)
        # Files that are no flavor disk, a directory that is no instance's,
        # a symlink named like a disk: none of them read.
        for name in ('disk.config', 'console.log', 'disk.rescue'):
            with open(os.path.join(directory, name), 'wb') as f:
                f.write(b'x' * 4096)
        os.symlink(path, os.path.join(directory, 'disk.local'))
        other = os.path.join(self.instances_path, uuid + '_resize')
        os.mkdir(other)
        os.symlink(path, os.path.join(other, 'disk'))
        os.makedirs(os.path.join(self.instances_path, 'locks'), exist_ok=True)
        os.symlink(directory, os.path.join(
            self.instances_path, '33333333-3333-3333-3333-333333333333'))
        found = self.scan()
        self.assertEqual([(uuid, 'disk')],
                         [(d.instance, d.name) for d in found.disks])
        # Named, never followed: the symlinked directory and the symlink
        # named like a disk.
        self.assertEqual(
            sorted(['33333333-3333-3333-3333-333333333333',
                    '%s/disk.local' % uuid]),
            sorted(p.split(': ')[0] for p in found.problems), found.problems)

    def test_raw_record_never_reads_the_header(self):
        # A raw disk whose guest wrote a qcow2 header claiming 1 PiB: nova's
        # record (disk.info) says raw, so its size is the file's.
        uuid, path = self.make('raw', 'none')
        scratch = self.useFixture(fixtures.TempDir()).path
        pb_fixtures.write_guest_qcow2_header(path, scratch, units.Pi)
        found = self.scan(host_format='qcow2')
        disk, = found.disks
        self.assertEqual('raw', disk.fmt)
        self.assertEqual(os.stat(path).st_size, disk.virtual_size)
        # Without a record, the host's format is believed, header checked.
        os.unlink(os.path.join(os.path.dirname(path), 'disk.info'))
        disk, = self.scan(host_format='qcow2').disks
        self.assertEqual('qcow2', disk.fmt)
        disk, = self.scan(host_format='raw').disks
        self.assertEqual('raw', disk.fmt)

    def test_disk_info_nested_past_the_parser(self):
        # The nova user writes disk.info: 64 KiB of '[' is no record (the
        # host's format is believed), never an error out of the scan.
        uuid, path = self.make('raw', 'none')
        with open(os.path.join(os.path.dirname(path), 'disk.info'),
                  'w') as f:
            f.write('[' * usage.DISK_INFO_MAX)
        disk, = self.scan(host_format='raw').disks
        self.assertEqual('raw', disk.fmt)

    def test_disk_made_during_the_walk_is_in_the_filesystem_figures(self):
        # A disk created while the scan walks the directories is in the
        # disks' blocks: the filesystem's figures must count it too, or
        # the room left looks larger than it is by the whole disk.
        self.make('qcow2', 'space')
        made = 512 * units.Mi
        walk = usage._instance_disks

        def walk_and_create(*args, **kwargs):
            if not os.path.exists(self.created):
                with open(self.created, 'wb') as f:
                    os.posix_fallocate(f.fileno(), 0, made)
            return walk(*args, **kwargs)

        self.created = os.path.join(self.instances_path, 'made-meanwhile')
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_backend.disk.usage._instance_disks', walk_and_create))
        vfs = os.statvfs(self.instances_path)
        found = self.scan()
        self.assertLessEqual(found.fs.available,
                             vfs.f_bavail * vfs.f_frsize - made // 2)

    def test_qcow2_record_with_another_header_is_its_size(self):
        uuid, path = self.make('raw', 'none')
        info = os.path.join(os.path.dirname(path), 'disk.info')
        with open(info, 'w') as f:
            json.dump({path: 'qcow2'}, f)
        disk, = self.scan(host_format='raw').disks
        self.assertEqual('raw', disk.fmt)
        self.assertEqual(os.stat(path).st_size, disk.virtual_size)

    def test_extent_limit_gives_a_lower_bound(self):
        uuid, path = self.make('raw', 'space')
        # Many extents: a written block every 256 KiB splits the unwritten
        # ones.
        fd = os.open(path, os.O_WRONLY)
        try:
            for offset in range(0, base.DISK, 256 * units.Ki):
                os.pwrite(fd, b'y' * 4096, offset)
            os.fsync(fd)
        finally:
            os.close(fd)
        whole = self.scan(fiemap=True).disks[0]
        self.assertFalse(whole.partial)
        self.assertEqual(filefrag_unwritten(path), whole.unwritten)
        part = self.scan(fiemap=True, max_extents=10)
        disk = part.disks[0]
        self.assertTrue(disk.partial)
        self.assertLess(disk.unwritten, whole.unwritten)
        self.assertIn('more than 10 extents', part.problems[0])

    def test_round_trip_through_json(self):
        self.make('qcow2', 'space')
        found = self.scan(fiemap=True)
        again = usage.Scan.from_dict(json.loads(json.dumps(found.to_dict())))
        self.assertEqual(found, again)
        self.assertIsInstance(again.disks[0].use(), capacity.DiskUse)
