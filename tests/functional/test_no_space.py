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

"""Scenario 6: not enough space on the instances filesystem.

instances_path is a real ext4 filesystem of 1.5 GiB, loop-mounted: one
server with a preallocated 1 GiB disk fits, a second does not. The second
build fails with the server in ERROR and a fault naming the disk, the bytes
needed and the bytes free; no disk file is left; the first server is
untouched.
"""

import os
import re

from oslo_utils import units

from prealloc_backend.disk import fsprobe
from tests import fixtures as pb_fixtures
from tests.functional import base

FS_SIZE_MB = 1536
# The compute host's reason, as the driver hands it to nova (figures first:
# nova keeps 255 characters of a fault).
FAULT = re.compile(r'Not enough space to preallocate: (?P<needed>\d+) bytes '
                   r'needed, (?P<free>\d+) bytes free \(disk '
                   r'(?P<path>[^)\s]+)\)')


class TestNotEnoughSpace(base.ServersTestBase):

    def _test(self, fmt):
        # One host: no rescheduling (the driver reschedules a build that
        # does not fit; test_reschedule covers that), so that the compute
        # host's reason is the fault.
        self.flags(max_attempts=1, group='scheduler')
        self.use_loop_instances_path('ext4', FS_SIZE_MB)
        # nova's inventory: placement would not offer the second server
        # a host without room (test_placement_capacity); the compute
        # host's own check is the last line where it does.
        self.start_host(fmt, preallocate_images='space',
                        disk_inventory='nova')
        image_id, image_path = self.upload_image('raw')
        flavor = self.create_flavor(disk=1)

        first = self.boot(image_id, flavor)
        first_disk = self.disk(first)
        before = os.stat(first_disk)
        self.assertGreaterEqual(before.st_blocks * 512, units.Gi)
        free_before = fsprobe.free_bytes(self.instances_path)
        self.assertLess(free_before, units.Gi)

        second = self.boot(image_id, flavor, expected_state='ERROR')
        message = self.fault_message(second)
        match = FAULT.search(message)
        self.assertIsNotNone(match, message)
        # The disk named is the second server's root disk.
        self.assertEqual(self.disk(second), match.group('path'))
        needed, free = int(match.group('needed')), int(match.group('free'))
        self.assertGreaterEqual(needed, units.Gi)
        self.assertLess(free, needed)
        # What statvfs said then is what it says now, give or take the
        # metadata of files made and removed since.
        self.assertAlmostEqual(free_before, free, delta=base.SLACK)
        base.record_figures(self, match.group('path'), 'space', {
            'needed': needed, 'free': free, 'fault': message})

        # No disk file left behind, nor a journal or temporary file.
        second_dir = self.instance_dir(second)
        left = os.listdir(second_dir) if os.path.isdir(second_dir) else []
        self.assertEqual([], [name for name in left
                              if name.startswith('disk')])
        for root, _dirs, files in os.walk(self.instances_path):
            self.assertEqual([], base.journal_files(root))

        # The first server: still ACTIVE, its disk untouched.
        self.assertEqual('ACTIVE', self.api.get_server(first['id'])['status'])
        after = os.stat(first_disk)
        self.assertEqual(
            (before.st_ino, before.st_size, before.st_blocks),
            (after.st_ino, after.st_size, after.st_blocks))
        self.assertContentEqual(first_disk, image_path)
        self.assertAlmostEqual(free_before,
                               fsprobe.free_bytes(self.instances_path),
                               delta=base.SLACK)
        return pb_fixtures.qemu_img_info(first_disk)

    def test_qcow2(self):
        info = self._test('qcow2')
        self.assertTrue(info['format-specific']['data']['extended-l2'])

    def test_raw(self):
        self._test('raw')
