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

"""The backend on real loop-mounted filesystems (root only): ext4 without
extents, xfs, a filesystem too small for the disk.
"""

import os

from oslo_utils import units

from prealloc_backend.disk import fsprobe
from prealloc_backend import exception
from tests import base
from tests import fixtures as pb_fixtures


class TestFilesystems(base.BackendTestCase):
    """Real loop-mounted filesystems (root only)."""

    def test_ext4_without_extents_policies(self):
        self.use_loop_fs('ext4-noextents', 80)
        self.assertFalse(fsprobe.supports_fallocate(self.instances_path))
        self.flags(preallocate_images='space')
        size = 16 * units.Mi
        # warn: raw stays thin, qcow2 gets metadata preallocation.
        raw = self.image('raw')
        self.cache(raw, 'raw', size=size, filename='b1')
        self.assertLess(pb_fixtures.allocated(raw.path), size // 2)
        qcow = self.image('qcow2')
        self.cache(qcow, 'qcow2', size=size, filename='b2')
        self.assertLess(pb_fixtures.allocated(qcow.path), size // 2)
        # fail: a clear error, no disk left.
        self.flags(fallocate_unsupported='fail', group='prealloc_backend')
        for fmt in ('raw', 'qcow2'):
            img = self.image(fmt)
            exc = self.assertRaises(exception.FallocateUnsupported,
                                    self.cache, img, fmt, size, 'b3')
            self.assertIn('ext4', str(exc))
            self.assertFalse(os.path.exists(img.path))
        # zero-fill: allocated by writing zeros, content intact.
        self.flags(fallocate_unsupported='zero-fill',
                   group='prealloc_backend')
        for fmt in ('raw', 'qcow2'):
            img = self.image(fmt)
            base_path = self.cache(img, fmt, size=size, filename='b4' + fmt)
            self.assertGreaterEqual(pb_fixtures.allocated(img.path), size)
            self.assert_same_content(img.path, base_path)

    def test_probe_is_per_filesystem(self):
        tmp = self.instances_path
        self.assertTrue(fsprobe.supports_fallocate(tmp))
        self.use_loop_fs('ext4-noextents', 16)
        self.assertFalse(fsprobe.supports_fallocate(self.instances_path))
        self.assertTrue(fsprobe.supports_fallocate(tmp))
        self.assertEqual('ext4', fsprobe.fs_type(self.instances_path))

    def test_xfs_space(self):
        self.use_loop_fs('xfs', 300)
        self.flags(preallocate_images='space')
        for fmt in ('raw', 'qcow2'):
            img = self.image(fmt)
            base_path = self.cache(img, fmt, size=64 * units.Mi,
                                   filename='x' + fmt)
            self.assertGreaterEqual(pb_fixtures.allocated(img.path),
                                    64 * units.Mi)
            self.assert_same_content(img.path, base_path)

    def test_small_filesystem_refuses_before_writing(self):
        fs = self.use_loop_fs('ext4', 64)
        self.flags(preallocate_images='space')
        img = self.image('qcow2')
        before = fsprobe.free_bytes(fs.path)
        exc = self.assertRaises(exception.InsufficientDiskSpace, self.cache,
                                img, 'qcow2', 256 * units.Mi)
        self.assertIn(img.path, str(exc))
        self.assertFalse(os.path.exists(img.path))
        # Only the base image (a few MiB) was written.
        self.assertGreater(fsprobe.free_bytes(fs.path), before - 8 * units.Mi)
