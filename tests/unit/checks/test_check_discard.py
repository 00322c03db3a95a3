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

"""The guest discard check on real nova.conf files."""

from prealloc_backend.checks import discard
from prealloc_backend.checks import result
from tests import base


class TestGuestDiscard(base.CheckTestCase):

    def check(self, images_type='qcow2', hw_disk_discard=None, **prealloc):
        sections = self.nova_conf(images_type=images_type, **prealloc)
        if hw_disk_discard:
            sections['libvirt']['hw_disk_discard'] = hw_disk_discard
        return discard.check_guest_discard(self.check_host(sections))

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
        self.assertIn('ignored on qcow2 disks of mode full, metadata, '
                      'space', res.details)
        self.assertIn('frees the host blocks it covers on qcow2 disks of '
                      'mode none', res.details)

    def test_keep_on_raw_leaves_metadata_thin(self):
        res = self.check(images_type='raw', hw_disk_discard='unmap')
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        self.assertEqual({'none': 'unmap', 'metadata': 'unmap',
                          'space': 'ignore', 'full': 'ignore'},
                         res.facts['discard'])

    def test_reclaim_warns_and_names_the_fix(self):
        res = self.check(hw_disk_discard='unmap', mode='space',
                         guest_discard='reclaim')
        self.assertEqual(result.Code.WARNING, res.code, res.details)
        self.assertIn('undoes the preallocation', res.details)
        self.assertIn("This host's mode is space", res.details)
        self.assertIn('guest_discard = keep', res.fix)
        self.assertEqual('unmap', res.facts['discard']['space'])

    def test_not_file_disks(self):
        res = self.check(images_type='rbd', hw_disk_discard='unmap')
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        self.assertIn('nothing to check', res.details)
