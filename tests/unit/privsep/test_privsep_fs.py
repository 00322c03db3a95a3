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

"""prealloc_backend/privsep/fs.py: what the entrypoints do with a disk
they accept, on real files in a temporary instances_path, in-process.

The refusals (paths, sizes, races) a compromised nova-compute could send
are the theme of tests/unit/privsep/test_privsep.py; the real daemon is in
tests/privileged.
"""

import os
import pwd
import sys

import fixtures
from oslo_utils import units

from prealloc_backend import exception
import prealloc_backend.privsep.fs as privsep_fs
from prealloc_backend.system import fileops
from tests import base
from tests import fixtures as pb_fixtures


class EntrypointTestCase(base.TestCase):

    def setUp(self):
        super().setUp()
        inst = os.path.join(self.instances_path, 'inst')
        os.mkdir(inst)
        self.disk = pb_fixtures.make_disk(os.path.join(inst, 'disk'))

    def test_fallocate_range_reserves_the_range_only(self):
        before = pb_fixtures.sha256_of(self.disk)
        privsep_fs.fallocate_range(self.disk, units.Mi, units.Mi)
        with open(self.disk, 'rb') as f:
            fd = f.fileno()
            self.assertEqual(units.Mi, fileops.allocated_bytes(
                fd, units.Mi, 2 * units.Mi))
            # Outside the range the holes are still holes.
            self.assertGreater(fileops.hole_bytes(fd, 3 * units.Mi,
                                                  4 * units.Mi), 0)
        self.assertEqual(before, pb_fixtures.sha256_of(self.disk))
        self.assertEqual(pb_fixtures.PRIVSEP_DISK_SIZE,
                         os.path.getsize(self.disk))

    def test_zero_fill_range_writes_zeros_into_holes(self):
        before = pb_fixtures.sha256_of(self.disk)
        size = pb_fixtures.PRIVSEP_DISK_SIZE
        privsep_fs.zero_fill_range(self.disk, 0, size)
        with open(self.disk, 'rb') as f:
            self.assertEqual(0, fileops.hole_bytes(f.fileno(), 0, size))
        self.assertEqual(before, pb_fixtures.sha256_of(self.disk))

    def test_more_than_an_unprivileged_user_may_allocate(self):
        # A sparse file as large as the filesystem: its allocation needs
        # more than f_bavail (root's reserved blocks and what is used are
        # never free), refused before a block is taken.
        vfs = os.statvfs(self.instances_path)
        size = (vfs.f_blocks - 1) * vfs.f_frsize
        big = os.path.join(self.instances_path, 'inst', 'big')
        with open(big, 'wb') as f:
            f.truncate(size)
        exc = self.assertRaises(exception.AllocationOutOfSpace,
                                privsep_fs.fallocate_range, big, 0, size)
        self.assertIn(big, str(exc))
        self.assertIn('%d bytes still needed' % size, str(exc))
        self.assertEqual(0, os.stat(big).st_blocks)

    def test_integers_only(self):
        for value in (True, 1.0, '1'):
            exc = self.assertRaises(exception.InvalidSize,
                                    privsep_fs.fallocate_range, self.disk,
                                    0, value)
            self.assertIn('length must be an integer', str(exc))
            self.assertIn(repr(value), str(exc))


class WhoMayOwnTestCase(base.TestCase):

    def argv(self, *args):
        self.useFixture(fixtures.MonkeyPatch('sys.argv', list(args)))

    def test_in_daemon(self):
        self.argv('privsep-helper', '--privsep_context',
                  'prealloc_backend.privsep.ctx')
        self.assertTrue(privsep_fs.in_daemon())
        self.argv('privsep-helper', '--privsep_context=x')
        self.assertTrue(privsep_fs.in_daemon())
        self.argv(sys.executable, '--privsep_contexts')
        self.assertFalse(privsep_fs.in_daemon())

    def test_allowed_uids(self):
        root = privsep_fs.pinned_root()
        nobody = pwd.getpwnam('nobody').pw_uid
        self.flags(group='prealloc_backend',
                   qemu_users=['nobody', 'no-such-user-here'])
        self.argv('privsep-helper', '--privsep_context', 'x')
        uids = privsep_fs._allowed_uids(root)
        self.assertEqual({root.uid, nobody} - {0}, uids)
        self.assertNotIn(0, uids)
        self.argv(sys.executable)
        expected = {root.uid, nobody}
        if os.geteuid() != 0:
            expected.discard(0)
        self.assertEqual(expected, privsep_fs._allowed_uids(root))
