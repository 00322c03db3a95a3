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

"""The guest discard check on real nova.conf files.

The host's discard-no-unref answer (disk.hostcaps) is mocked: the unit tier
runs on one QEMU and libvirt and must see both answers. The real probe runs
on both platforms in the real tier (tests/functional/real/test_trim.py).
"""

from unittest import mock

from prealloc_backend.checks import discard
from prealloc_backend.checks import result
from prealloc_backend.disk import hostcaps
from tests import base

YES = hostcaps.Answer(True, 'qemu-img opens it; the schema has it')
NO = hostcaps.Answer(False, "qemu-img: qcow2 has no 'discard-no-unref' "
                            'option (QEMU < 8.1)')


class TestGuestDiscard(base.CheckTestCase):

    def check(self, images_type='qcow2', hw_disk_discard=None,
              capable=NO, **prealloc):
        sections = self.nova_conf(images_type=images_type, **prealloc)
        if hw_disk_discard:
            sections['libvirt']['hw_disk_discard'] = hw_disk_discard
        host = self.check_host(sections)
        with mock.patch.object(hostcaps, 'discard_no_unref',
                               return_value=capable) as probe:
            res = discard.check_guest_discard(host)
        self.probed = probe.called
        return res

    def test_discards_not_passed(self):
        res = self.check()
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        self.assertIn('hw_disk_discard = unset', res.details)
        self.assertIsNone(res.facts['discard']['space'])

    def test_keep_ignores_discards_on_preallocated_disks(self):
        res = self.check(hw_disk_discard='unmap', mode='space')
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        self.assertEqual({'none': 'unmap', 'metadata': 'ignore',
                          'space': 'ignore', 'full': 'ignore'},
                         res.facts['discard'])
        self.assertEqual([], res.facts['discard_no_unref_modes'])
        self.assertIn('mode metadata, space, full: ignored', res.details)
        self.assertIn('mode none: passed to the file', res.details)
        self.assertIn("This host lacks qcow2 discard-no-unref: qemu-img: "
                      "qcow2 has no 'discard-no-unref' option", res.details)
        self.assertFalse(res.facts['discard_no_unref']['supported'])

    def test_keep_with_discard_no_unref_uses_it_for_metadata(self):
        res = self.check(hw_disk_discard='unmap', mode='space', capable=YES)
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        self.assertEqual(['metadata'], res.facts['discard_no_unref_modes'])
        self.assertEqual([], res.facts['reserved_again_modes'])
        self.assertEqual({'none': 'unmap', 'metadata': 'unmap',
                          'space': 'ignore', 'full': 'ignore'},
                         res.facts['discard'])
        self.assertIn('mode metadata: dropped with discard-no-unref',
                      res.details)
        self.assertIn('This host has qcow2 discard-no-unref', res.details)

    def test_zero_with_discard_no_unref(self):
        res = self.check(hw_disk_discard='unmap', mode='full', capable=YES,
                         guest_discard='zero')
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        self.assertEqual(['full', 'metadata', 'space'],
                         res.facts['discard_no_unref_modes'])
        self.assertEqual(['full', 'space'], res.facts['reserved_again_modes'])
        self.assertIn('mode space, full: dropped with discard-no-unref',
                      res.details)
        self.assertIn("reserved again at the guest's next start",
                      res.details)

    def test_zero_without_discard_no_unref_warns(self):
        res = self.check(hw_disk_discard='unmap', mode='space',
                         guest_discard='zero')
        self.assertEqual(result.Code.WARNING, res.code, res.details)
        self.assertIn('guest_discard = zero therefore acts as keep',
                      res.details)
        self.assertIn('QEMU 8.1.3 or later and libvirt 9.5', res.fix)
        self.assertEqual('ignore', res.facts['discard']['space'])

    def test_zero_on_raw_warns(self):
        res = self.check(images_type='raw', hw_disk_discard='unmap',
                         guest_discard='zero', capable=YES)
        self.assertEqual(result.Code.WARNING, res.code, res.details)
        self.assertIn('changes nothing on raw disks', res.details)
        self.assertEqual([], res.facts['discard_no_unref_modes'])

    def test_keep_on_raw_leaves_metadata_thin(self):
        res = self.check(images_type='raw', hw_disk_discard='unmap')
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        self.assertEqual({'none': 'unmap', 'metadata': 'unmap',
                          'space': 'ignore', 'full': 'ignore'},
                         res.facts['discard'])

    def test_reclaim_warns_and_names_the_fix(self):
        for capable in (NO, YES):
            res = self.check(hw_disk_discard='unmap', mode='space',
                             guest_discard='reclaim', capable=capable)
            self.assertEqual(result.Code.WARNING, res.code, res.details)
            self.assertIn('undoes the preallocation', res.details)
            self.assertIn("This host's mode is space", res.details)
            self.assertIn('guest_discard = keep', res.fix)
            self.assertEqual('unmap', res.facts['discard']['space'])
            self.assertEqual([], res.facts['discard_no_unref_modes'])

    def test_not_file_disks(self):
        res = self.check(images_type='rbd', hw_disk_discard='unmap')
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        self.assertIn('nothing to check', res.details)
        self.assertFalse(self.probed)
