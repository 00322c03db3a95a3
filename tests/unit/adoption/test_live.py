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

"""What recover() does with what a killed adoption left, per journal phase.

Real files in a temporary directory; the libvirt domain is a fake (this
tier has no libvirtd): it records the block job calls and says whether a
job runs and whether the guest is paused. The same paths against a real
libvirtd and QEMU, with the copying process SIGKILLed, are in
tests/functional/real/test_adopt.py.
"""

import json
import os

import fixtures

from prealloc_backend.adoption import live
from prealloc_backend import exception
from tests import base


class FakeDomain:

    def __init__(self, active=True, job=False, paused=False):
        self.active = active
        self.job = job
        self.paused = paused
        self.calls = []

    def isActive(self):
        return self.active

    def blockJobInfo(self, dev, flags):
        return {'cur': 1, 'end': 1} if self.job else {}

    def blockJobAbort(self, dev, flags):
        self.calls.append(('abort', dev, flags))
        self.job = False

    def info(self):
        return [live.DOMAIN_PAUSED if self.paused else 1]

    def resume(self):
        self.calls.append(('resume',))
        self.paused = False


class TestRecover(base.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        self.path = os.path.join(self.dir, 'disk')
        self.orig = self.path + live.ORIG_SUFFIX
        self.new = self.path + live.NEW_SUFFIX

    def write(self, path, text):
        with open(path, 'w') as f:
            f.write(text)

    def read(self, path):
        with open(path) as f:
            return f.read()

    def journal(self, phase, paused=False):
        self.write(live.journal_path(self.path),
                   json.dumps({'phase': phase, 'dev': 'vda',
                               'paused': paused}))

    def left(self):
        return sorted(os.listdir(self.dir))

    def test_nothing_to_do(self):
        self.write(self.path, 'guest')
        self.assertIsNone(live.recover(FakeDomain(), self.path))
        self.assertEqual(['disk'], self.left())

    def test_target_never_swapped_in_is_removed(self):
        self.write(self.path, 'guest')
        self.write(self.new, 'target')
        self.assertIn('never used', live.recover(FakeDomain(), self.path))
        self.assertEqual('guest', self.read(self.path))
        self.assertEqual(['disk'], self.left())

    def test_swapped_gives_the_original_its_name_back(self):
        self.write(self.orig, 'guest')
        self.write(self.path, 'half a copy')
        self.journal(live.SWAPPED)
        domain = FakeDomain(job=True)
        self.assertIn('copy undone', live.recover(domain, self.path))
        # The copy aborted, never pivoted.
        self.assertEqual([('abort', 'vda', 0)], domain.calls)
        self.assertEqual('guest', self.read(self.path))
        self.assertEqual(['disk'], self.left())

    def test_swapped_killed_between_the_renames(self):
        self.write(self.orig, 'guest')
        self.write(self.new, 'target')
        self.journal(live.SWAPPED)
        live.recover(FakeDomain(), self.path)
        self.assertEqual('guest', self.read(self.path))
        self.assertEqual(['disk'], self.left())

    def test_swapped_killed_before_the_renames(self):
        self.write(self.path, 'guest')
        self.write(self.new, 'target')
        self.journal(live.SWAPPED)
        live.recover(FakeDomain(), self.path)
        self.assertEqual('guest', self.read(self.path))
        self.assertEqual(['disk'], self.left())

    def test_swapped_after_a_power_cut(self):
        self.write(self.orig, 'guest')
        self.write(self.path, 'half a copy')
        self.journal(live.SWAPPED)
        live.recover(None, self.path)
        self.assertEqual('guest', self.read(self.path))
        self.assertEqual(['disk'], self.left())

    def test_pivoting_completes_the_pivot_and_resumes(self):
        self.write(self.orig, 'old')
        self.write(self.path, 'guest')
        self.journal(live.PIVOTING, paused=True)
        domain = FakeDomain(job=True, paused=True)
        self.assertIn('pivot completed', live.recover(domain, self.path))
        self.assertEqual([('abort', 'vda', live.BLOCK_JOB_ABORT_PIVOT),
                          ('resume',)], domain.calls)
        self.assertEqual('guest', self.read(self.path))
        self.assertEqual(['disk'], self.left())

    def test_pivoting_after_a_power_cut_keeps_the_new_file(self):
        self.write(self.orig, 'old')
        self.write(self.path, 'guest')
        self.journal(live.PIVOTING, paused=True)
        live.recover(None, self.path)
        self.assertEqual('guest', self.read(self.path))
        self.assertEqual(['disk'], self.left())

    def test_a_paused_guest_not_paused_by_adopt_stays_paused(self):
        self.write(self.path, 'guest')
        self.journal(live.PIVOTING, paused=False)
        domain = FakeDomain(paused=True)
        live.recover(domain, self.path)
        self.assertEqual([], domain.calls)

    def test_unreadable_journal_leaves_everything(self):
        self.write(self.orig, 'guest')
        self.write(self.path, 'half a copy')
        self.write(live.journal_path(self.path), '{"phase": "sideways"}')
        self.assertRaisesRegex(exception.PreallocError, 'sideways',
                               live.recover, FakeDomain(), self.path)
        self.write(live.journal_path(self.path), 'not json')
        self.assertRaisesRegex(exception.PreallocError, 'unreadable',
                               live.recover, FakeDomain(), self.path)
        self.assertEqual('guest', self.read(self.orig))
        self.assertEqual(3, len(self.left()))
