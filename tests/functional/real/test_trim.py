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

"""A real guest's TRIM on its preallocated disk, with nova's
``[libvirt] hw_disk_discard = unmap``.

The guest (bench/prealloc_bench/guest.py, action trim) discards 512 MiB of
its 1 GiB root disk beyond the image's data with blkdiscard, then writes 4
MiB of zeros at the start of that range with O_DIRECT, reports the md5 of
the image's data and powers off. On the host, after the guest stopped:

- ``guest_discard = keep``: the disk's ``<driver discard='ignore'>``; a
  space or full disk is still allocated over its whole size; in a qcow2
  disk every cluster past the backing data still has the host offset a
  fresh preallocated overlay gives it (one constant shift from the guest
  offset, no cluster without one): nothing was dropped, and the write after
  the TRIM went to the cluster preallocated for it (the fast path).
- ``guest_discard = reclaim``: nova's ``discard='unmap'``; the TRIM freed
  the host blocks (the option does what it says).
- Either way the image's data, outside the trimmed range, is intact.
"""

import json
import subprocess

from lxml import etree
from oslo_utils import units

from prealloc_bench import guest as pb_guest
from tests import fixtures as pb_fixtures
from tests.functional.real import base

GIB = units.Gi
TRIM_OFF_MIB = 128
TRIM_MIB = 512
WRITE_MIB = 4


def qcow2_map(path):
    out = subprocess.run(['qemu-img', 'map', '-f', 'qcow2',
                          '--output=json', path], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


class _Trim:

    GUEST_DISCARD = 'keep'
    # The flavors' prealloc:mode values to try.
    MODES = ()

    def _configure_compute(self):
        super()._configure_compute()
        self.flags(hw_disk_discard='unmap', group='libvirt')
        self.flags(guest_discard=self.GUEST_DISCARD,
                   group='prealloc_backend')

    def trim_in_guest(self, mode):
        server = self.boot(self.flavor(mode=mode),
                           self.image(self.IMAGES_TYPE,
                                      action=pb_guest.ACTION_TRIM,
                                      mib=WRITE_MIB))
        path = self.disk_path(server)
        # The guest powers off once it has reported.
        self.wait_for_domain_shutoff(server)
        xml = etree.fromstring(self.virsh('dumpxml', server['id']))
        [disk] = [d for d in xml.findall('./devices/disk')
                  if d.find('source').get('file') == path]
        discard = disk.find('driver').get('discard')
        log = self.console_log(server)
        report = pb_guest.parse_console(log).get('trim')
        self.assertIsNotNone(report, log[-3000:])
        self.assertEqual((str(TRIM_OFF_MIB), str(TRIM_MIB), '0', '0'),
                         (report['off_mib'], report['mib'], report['rc'],
                          report['write_rc']), log[-3000:])
        # The image's data, outside the trimmed range, as the guest read it
        # after its TRIM.
        self.assertEqual(self.base_md5, report['md5'])
        facts = {'discard': discard,
                 'allocated': pb_fixtures.allocated(path),
                 'map': (qcow2_map(path) if self.IMAGES_TYPE == 'qcow2'
                         else None)}
        self.delete(server)
        self.assert_no_leftovers(server)
        return facts

    def test_trim_per_mode(self):
        for mode in self.MODES:
            facts = self.trim_in_guest(mode)
            self.check_trim(mode, facts)

    def shift_of_every_cluster(self, qmap, mode):
        """The one (host offset - guest offset) of every range the overlay
        itself holds (depth 0), checking that every such range has one and
        that the trimmed range is all the overlay's.
        """
        own = [r for r in qmap if r['depth'] == 0]
        detail = '%s: %s' % (mode, qmap)
        self.assertTrue(own, detail)
        self.assertEqual([], [r for r in own if 'offset' not in r], detail)
        shifts = {r['offset'] - r['start'] for r in own}
        self.assertEqual(1, len(shifts), detail)
        start, end = TRIM_OFF_MIB * units.Mi, (TRIM_OFF_MIB + TRIM_MIB) * \
            units.Mi
        covered = sum(min(end, r['start'] + r['length']) - max(start,
                                                               r['start'])
                      for r in own
                      if r['start'] < end and r['start'] + r['length'] >
                      start)
        self.assertEqual(end - start, covered, detail)
        return shifts.pop()


class _Keep(_Trim):

    def check_trim(self, mode, facts):
        self.assertEqual('ignore', facts['discard'], mode)
        if mode in ('space', 'full'):
            self.assertGreaterEqual(facts['allocated'], GIB,
                                    '%s: %s' % (mode, facts))
        if facts['map'] is not None:
            self.shift_of_every_cluster(facts['map'], mode)


class _Reclaim(_Trim):

    GUEST_DISCARD = 'reclaim'

    def check_trim(self, mode, facts):
        self.assertEqual('unmap', facts['discard'], mode)
        # The TRIM gave the host most of the 512 MiB back.
        self.assertLess(facts['allocated'], GIB - TRIM_MIB * units.Mi // 2,
                        '%s: %s' % (mode, facts))
        if facts['map'] is not None:
            dropped = [r for r in facts['map']
                       if r['depth'] == 0 and 'offset' not in r]
            self.assertTrue(dropped, facts['map'])


class TestQcow2TrimKeep(_Keep, base.RealHypervisorTestCase):

    IMAGES_TYPE = 'qcow2'
    MODES = ('metadata', 'space', 'full')


class TestRawTrimKeep(_Keep, base.RealHypervisorTestCase):

    IMAGES_TYPE = 'raw'
    MODES = ('space', 'full')


class TestQcow2TrimReclaim(_Reclaim, base.RealHypervisorTestCase):

    IMAGES_TYPE = 'qcow2'
    MODES = ('space',)


class TestRawTrimReclaim(_Reclaim, base.RealHypervisorTestCase):

    IMAGES_TYPE = 'raw'
    MODES = ('space',)
