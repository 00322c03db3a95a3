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

"""prealloc_backend/disk/fsprobe.py on this machine's own filesystem.

Filesystems without fallocate(2) (ext4 without extents, ext3) need a loop
mount, so root: tests/privileged/test_loop_filesystems.py probes them for
real. Here the probe's verdicts on an unsupported or failing fallocate(2)
come from a patched fileops.fallocate (the one thing that cannot be made to
fail without root), everything else is real.
"""

import errno
import os

import fixtures

from prealloc_backend.disk import fsprobe
from tests import base


class FallocateProbeTestCase(base.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        fsprobe.forget()
        self.addCleanup(fsprobe.forget)

    def fallocate_fails(self, err):
        def fail(*args, **kwargs):
            raise OSError(err, os.strerror(err))
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_backend.system.fileops.fallocate', fail))

    def test_real_probe_leaves_nothing(self):
        self.assertTrue(fsprobe.supports_fallocate(self.dir))
        self.assertEqual([], os.listdir(self.dir))

    def test_answer_cached_per_filesystem(self):
        self.assertTrue(fsprobe.supports_fallocate(self.dir))
        other = self.useFixture(fixtures.TempDir(rootdir=self.dir)).path
        # Same filesystem: no second probe, even one that would fail.
        self.fallocate_fails(errno.EOPNOTSUPP)
        self.assertTrue(fsprobe.supports_fallocate(other))
        fsprobe.forget(other)
        self.assertFalse(fsprobe.supports_fallocate(self.dir))

    def test_unsupported_is_cached(self):
        self.fallocate_fails(errno.EOPNOTSUPP)
        self.assertFalse(fsprobe.supports_fallocate(self.dir))
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_backend.system.fileops.fallocate',
            lambda *a, **k: self.fail('probed twice')))
        self.assertFalse(fsprobe.supports_fallocate(self.dir))
        self.assertEqual([], os.listdir(self.dir))

    def test_other_errors_answer_yes_uncached(self):
        # A full filesystem: the allocation itself will say so.
        self.fallocate_fails(errno.ENOSPC)
        self.assertTrue(fsprobe.supports_fallocate(self.dir))
        self.fallocate_fails(errno.EOPNOTSUPP)
        self.assertFalse(fsprobe.supports_fallocate(self.dir))

    def test_record_unsupported(self):
        self.assertTrue(fsprobe.supports_fallocate(self.dir))
        fsprobe.record_unsupported(self.dir)
        self.assertFalse(fsprobe.supports_fallocate(self.dir))
        self.assertFalse(fsprobe.facts(self.dir).fallocate_ok)


class FreeSpaceTestCase(base.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        self.disk = os.path.join(self.dir, 'disk')

    def test_free_bytes_is_what_an_unprivileged_user_may_use(self):
        self.assertGreater(fsprobe.free_bytes(self.dir), 0)
        # Free space moves under a shared machine: a fixed statvfs answer
        # (root's reserved blocks are f_bfree - f_bavail) decides here.
        vfs = os.statvfs_result((4096, 4096, 1000, 300, 200, 0, 0, 0, 0,
                                 255))
        self.useFixture(fixtures.MockPatch('os.statvfs',
                                           return_value=vfs))
        self.assertEqual(200 * 4096, fsprobe.free_bytes(self.dir))


class FsTypeTestCase(base.TestCase):

    def test_mount_points(self):
        self.assertEqual('proc', fsprobe.fs_type('/proc/self'))
        self.assertEqual('sysfs', fsprobe.fs_type('/sys/kernel'))
        self.assertNotEqual('unknown', fsprobe.fs_type(
            self.useFixture(fixtures.TempDir()).path))
