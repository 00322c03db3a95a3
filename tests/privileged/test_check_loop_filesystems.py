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

"""The filesystem and qemu-img checks on loop-mounted filesystems (root).

ext4 without extents answers fallocate(2) with EOPNOTSUPP, as ext3 does; a
small ext4 filled up with a file is really full. The kernel's answers are
read here independently (the fallocate command, statvfs).
"""

import errno
import os
import subprocess

from oslo_utils import units

from prealloc_backend.checks import filesystem
from prealloc_backend.checks import qemu_img
from prealloc_backend.checks import result
from tests import base
from tests import fixtures as pb_fixtures


def fill_up(directory):
    """Write a file until the filesystem refuses more (ENOSPC)."""
    chunk = b'\xa5' * units.Mi
    # Unbuffered: a buffered file would fail again when closed.
    with open(os.path.join(directory, 'filler'), 'wb', buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise


class LoopCase(base.CheckTestCase):

    def loop_instances(self, kind, size_mb):
        pb_fixtures.skip_unless_root(self)
        fs = self.useFixture(pb_fixtures.LoopFilesystem(kind, size_mb))
        self.instances = os.path.join(fs.path, 'instances')
        os.mkdir(self.instances)
        return self.instances

    def host(self, images_type=None, disk_size=4 * units.Mi, **options):
        return self.check_host(self.nova_conf(images_type, **options),
                               disk_size=disk_size)


class TestWithoutFallocate(LoopCase):

    def setUp(self):
        super().setUp()
        self.loop_instances('ext4-noextents', 64)
        # The kernel agrees: no fallocate(2) there.
        probe = os.path.join(self.instances, 'x')
        proc = subprocess.run(['fallocate', '-l', '64K', probe],
                              capture_output=True, text=True)
        self.assertNotEqual(0, proc.returncode)
        self.assertIn('not supported', proc.stderr)
        os.unlink(probe)

    def test_warn(self):
        vfs = os.statvfs(self.instances)
        host = self.host()
        res = filesystem.check_filesystem(host)
        self.assertEqual(result.Code.WARNING, res.code, res.details)
        self.assertEqual('ext4', res.facts['fs_type'])
        self.assertFalse(res.facts['fallocate'])
        self.assertIn('NOT supported', res.details)
        self.assertIn('fallocate_unsupported = zero-fill', res.fix)
        # Nothing else writes to this filesystem.
        self.assertAlmostEqual(vfs.f_bavail * vfs.f_frsize,
                               res.facts['free_bytes'], delta=64 * units.Ki)
        # What the backend does there: metadata instead of falloc.
        res = qemu_img.check_qemu_img(host)
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        self.assertEqual('metadata', res.facts['preallocation'])
        self.assertEqual([], os.listdir(self.instances))

    def test_warn_raw_disks_stay_thin_so_need_no_room(self):
        # A disk larger than the filesystem: space + warn leaves it thin,
        # so free space must not refuse it.
        res = filesystem.check_free_space(self.host(
            images_type='raw', disk_size=10 * units.Gi))
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        self.assertEqual(0, res.facts['needed_bytes'])

    def test_fail(self):
        host = self.host(fallocate_unsupported='fail')
        res = filesystem.check_filesystem(host)
        self.assertEqual(result.Code.FAILURE, res.code)
        self.assertIn('every spawn fails', res.details)
        self.assertIn('fallocate_unsupported = zero-fill', res.fix)
        self.assertIn('xfs', res.fix)
        res = filesystem.check_free_space(host)
        self.assertEqual(result.Code.FAILURE, res.code)
        self.assertIn('does not support fallocate(2)', res.details)
        self.assertEqual([], os.listdir(self.instances))

    def test_fail_only_warns_in_other_modes(self):
        res = filesystem.check_filesystem(self.host(
            fallocate_unsupported='fail', mode='none'))
        self.assertEqual(result.Code.WARNING, res.code)
        self.assertIn('prealloc:mode=space will fail', res.details)


class TestFull(LoopCase):

    def test_full_filesystem(self):
        self.loop_instances('ext4', 16)
        fill_up(self.instances)
        vfs = os.statvfs(self.instances)
        free = vfs.f_bavail * vfs.f_frsize
        self.assertLess(free, filesystem.MIN_FREE_BYTES)
        host = self.host(mode='none')
        res = filesystem.check_free_space(host)
        self.assertEqual(result.Code.FAILURE, res.code, res.details)
        self.assertAlmostEqual(free, res.facts['free_bytes'],
                               delta=64 * units.Ki)
        self.assertIn('Not enough space to preallocate disk', res.details)
        self.assertIn('Free space on that filesystem', res.fix)
        res = filesystem.check_filesystem(host)
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        # No room for the test overlay: not made, said so.
        res = qemu_img.check_qemu_img(host)
        self.assertEqual(result.Code.WARNING, res.code)
        self.assertIn('no test overlay created', res.details)
        self.assertEqual(['filler'], os.listdir(self.instances))
