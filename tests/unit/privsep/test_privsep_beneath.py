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

"""prealloc_backend/privsep/beneath.py: opening a path beneath a pinned
directory, by openat2(RESOLVE_BENEATH) or by the walk that replaces it where
the kernel has no openat2 (the daemon's refusals through its entrypoints are
in test_privsep.py).
"""

import errno
import os
import stat

import fixtures

from prealloc_backend.privsep import beneath
from tests import base


class OpenBeneathTestCase(base.TestCase):
    """beneath.open_beneath: openat2 and the walk agree on every tree."""

    def setUp(self):
        super().setUp()
        top = self.useFixture(fixtures.TempDir()).path
        self.root = os.path.join(top, 'root')
        os.makedirs(os.path.join(self.root, 'a', 'b'))
        with open(os.path.join(self.root, 'a', 'b', 'f'), 'w'):
            pass
        os.mkdir(os.path.join(top, 'out'))
        with open(os.path.join(top, 'out', 'f'), 'w'):
            pass
        os.symlink(os.path.join(top, 'out'), os.path.join(self.root, 'ln'))
        os.symlink('b', os.path.join(self.root, 'a', 'rel'))
        os.symlink('/proc/self/cwd', os.path.join(self.root, 'magic'))
        os.symlink('f', os.path.join(self.root, 'a', 'b', 'flink'))
        self.fd = os.open(self.root, beneath.O_PATH_FLAGS)
        self.addCleanup(os.close, self.fd)

    def outcome(self, parts, force_walk):
        try:
            fd = beneath.open_beneath(self.fd, parts, force_walk=force_walk)
        except OSError as exc:
            return errno.errorcode[exc.errno]
        try:
            st = os.fstat(fd)
            return stat.S_IFMT(st.st_mode), st.st_ino
        finally:
            os.close(fd)

    def test_same_outcomes(self):
        cases = {
            ('a', 'b', 'f'): None,
            ('ln', 'f'): 'ELOOP',
            ('a', 'rel', 'f'): 'ELOOP',
            ('magic', 'x'): 'ELOOP',
            ('a', 'b', 'none'): 'ENOENT',
            ('a', 'b', 'f', 'x'): 'ENOTDIR',
            ('a', '..', 'a'): 'EINVAL',
            ('.',): 'EINVAL',
            ('',): 'EINVAL',
        }
        self.assertNotEqual(None, beneath.SYS_OPENAT2)
        for parts, wanted in cases.items():
            by_openat2 = self.outcome(parts, False)
            by_walk = self.outcome(parts, True)
            self.assertEqual(by_openat2, by_walk, parts)
            if wanted is None:
                self.assertEqual(stat.S_IFREG, by_walk[0], parts)
            else:
                self.assertEqual(wanted, by_walk, parts)
        # A symlink as the last component: a descriptor of the link itself
        # (O_PATH|O_NOFOLLOW), which the daemon's type check refuses.
        for force_walk in (False, True):
            self.assertEqual(stat.S_IFLNK, self.outcome(
                ('a', 'b', 'flink'), force_walk)[0])

    def test_enosys_falls_back_to_the_walk(self):
        """openat2 answering ENOSYS (old kernel, some seccomp profiles)
        switches to the walk for good.
        """
        calls = []

        def enosys(*args, **kwargs):
            calls.append(args)
            raise OSError(errno.ENOSYS, 'not here')

        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_backend.privsep.beneath.openat2', enosys))
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_backend.privsep.beneath._openat2_missing', False))
        for _ in range(2):
            self.assertEqual(stat.S_IFREG,
                             self.outcome(('a', 'b', 'f'), False)[0])
            self.assertEqual('ELOOP', self.outcome(('ln', 'f'), False))
        self.assertEqual(1, len(calls))
