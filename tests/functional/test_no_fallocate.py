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

"""Scenario 7: filesystems and fallocate(2).

instances_path on a real loop-mounted ext4 made without extents, where
fallocate(2) answers EOPNOTSUPP (as on ext3): each
``[prealloc_backend] fallocate_unsupported`` policy behaves as its help says
for ``preallocate_images = space``. And on xfs, which has fallocate(2),
space mode allocates as on ext4.
"""

import os

from oslo_utils import units

from tests.functional import base

# Room for one 1 GiB disk written with zeros, the image cache and metadata.
FS_SIZE_MB = 1280


class TestExt4WithoutExtents(base.ServersTestBase):

    def _boot(self, fmt, policy, expected_state='ACTIVE'):
        self.use_loop_instances_path('ext4-noextents', FS_SIZE_MB)
        self.start_host(fmt, preallocate_images='space',
                        fallocate_unsupported=policy)
        self.image_id, self.image_path = self.upload_image('raw')
        server = self.boot(self.image_id, self.create_flavor(disk=1),
                           expected_state=expected_state)
        return server

    def _check_warning(self, text):
        self.assertIn(text, self.stdlog.logger.output)

    def test_warn_raw_stays_thin(self):
        server = self._boot('raw', 'warn')
        # The host's mode (space) still picks io=native.
        self.assertServerDisks(server, 'raw', 'none', self.image_id,
                               self.image_path, io='native')
        self._check_warning('filesystem without fallocate(2) (ext4): disk '
                            'left thin')

    def test_warn_qcow2_gets_metadata_preallocation(self):
        server = self._boot('qcow2', 'warn')
        self.assertServerDisks(server, 'qcow2', 'metadata', self.image_id,
                               self.image_path)
        self._check_warning('created with preallocation=metadata instead '
                            'of falloc')

    def _test_fail(self, fmt):
        # One host, one attempt: the build is rescheduled (the host cannot
        # make the disk), and with max_attempts spent nova's fault keeps
        # the host's reason ("Last exception: ...").
        self.flags(max_attempts=1, group='scheduler')
        server = self._boot(fmt, 'fail', expected_state='ERROR')
        message = self.fault_message(server)
        self.assertIn('does not support fallocate(2)', message)
        self.assertIn(self.disk(server), message)
        self.assertIn('(ext4)', message)
        server_dir = self.instance_dir(server)
        left = os.listdir(server_dir) if os.path.isdir(server_dir) else []
        self.assertEqual([], [name for name in left
                              if name.startswith('disk')])
        self.assertEqual([], base.journal_files(self.instances_path))
        base.record_figures(self, self.disk(server), 'space/fail',
                            {'fault': message})

    def test_fail_raw(self):
        self._test_fail('raw')

    def test_fail_qcow2(self):
        self._test_fail('qcow2')

    def test_zero_fill_raw(self):
        server = self._boot('raw', 'zero-fill')
        # Every block written (holes zero-filled), data kept.
        self.assertServerDisks(server, 'raw', 'full', self.image_id,
                               self.image_path)

    def test_zero_fill_qcow2(self):
        server = self._boot('qcow2', 'zero-fill')
        # preallocation=full instead of falloc.
        self.assertServerDisks(server, 'qcow2', 'full', self.image_id,
                               self.image_path)


class TestXfs(base.ServersTestBase):

    # The flavor's 64 MiB swap counts 1 GiB in placement (nova rounds swap
    # up to whole GiB): placement must see 2 GiB of room here, which the
    # plugin's DISK_GB reports only on a filesystem that has it.
    XFS_SIZE_MB = 2560

    def _test(self, fmt):
        self.use_loop_instances_path('xfs', self.XFS_SIZE_MB)
        self.start_host(fmt, preallocate_images='space')
        image_id, image_path = self.upload_image('raw')
        server = self.boot(image_id, self.create_flavor(disk=1, swap=64))
        figures = self.assertServerDisks(server, fmt, 'space', image_id,
                                         image_path, swap_mb=64)
        self.assertGreaterEqual(figures['disk']['allocated'], units.Gi)

    def test_space_qcow2(self):
        self._test('qcow2')

    def test_space_raw(self):
        self._test('raw')
