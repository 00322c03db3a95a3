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
``[libvirt] hw_disk_discard = unmap``, on whichever QEMU and libvirt the
tier runs (QEMU 7.2 / libvirt 9.0 on Debian 12, QEMU 10 / libvirt 11 in
the second platform's root).

The guest (bench/prealloc_bench/guest.py, action trim) writes 32 MiB of
0xaa at 128 MiB of its 1 GiB root disk, discards 512 MiB from there with
blkdiscard, writes 4 MiB of zeros at the start of that range with
O_DIRECT, reports the md5 of the image's data and whether the 0xaa range
now reads zeros, marks the disk as trimmed and powers off. On the host,
after the guest stopped:

- ``guest_discard = keep``: the disk's ``<driver discard='ignore'>``; the
  guest still reads its 0xaa; a space or full disk is still allocated over
  its whole size; in a qcow2 disk every cluster past the backing data
  still has the host offset a fresh preallocated overlay gives it (one
  constant shift from the guest offset, no cluster without one): nothing
  was dropped, and the write after the TRIM went to the cluster
  preallocated for it (the fast path). Where the host has discard-no-unref,
  a qcow2 disk of mode metadata gets it instead (as ``zero`` below).
- ``guest_discard = zero``, on a host with discard-no-unref: ``discard=
  'unmap' discard_no_unref='on'``; the range reads zeros in the guest,
  ``qemu-img convert`` (what nova uploads on snapshot) carries none of it,
  and every cluster keeps its host offset (the rewrite allocated none).
  Under modes space and full QEMU freed the blocks under the range; the
  next definition of the guest (a hard reboot, whose boot finds the mark
  and only reports) reserves them again. Without the capability: as keep.
- ``guest_discard = reclaim``: nova's ``discard='unmap'``; the TRIM freed
  the host blocks (the option does what it says).
- Either way the image's data, outside the trimmed range, is intact.

Whether the host has discard-no-unref is taken from QEMU's and libvirt's
versions here (8.1, 9.5: their release notes), not from the plugin's own
probe, so that a probe answering wrong fails these tests.
"""

import json
import os
import re
import subprocess

import fixtures
import libvirt
from lxml import etree
from oslo_utils import units
import testtools

from prealloc_backend.disk import hostcaps
from prealloc_bench import guest as pb_guest
from tests import fixtures as pb_fixtures
from tests.functional.real import base

GIB = units.Gi
TRIM_OFF_MIB = 128
TRIM_MIB = 512
FILL_MIB = 32
WRITE_MIB = 4
TRIM_RANGE = (TRIM_OFF_MIB * units.Mi, (TRIM_OFF_MIB + TRIM_MIB) * units.Mi)


def qemu_version():
    out = subprocess.run(['qemu-img', '--version'], check=True,
                         capture_output=True, text=True).stdout
    return tuple(int(x) for x in
                 re.search(r'version (\d+)\.(\d+)', out).groups())


def libvirt_version():
    number = libvirt.getVersion()
    return (number // 1000000, number // 1000 % 1000)


def platform_has_discard_no_unref():
    """The oracle: QEMU 8.1 and libvirt 9.5 brought it."""
    return qemu_version() >= (8, 1) and libvirt_version() >= (9, 5)


def qcow2_map(path):
    out = subprocess.run(['qemu-img', 'map', '-f', 'qcow2',
                          '--output=json', path], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def data_in_range(qmap, start, end):
    """Bytes of [start, end) that ``qemu-img map`` says hold data."""
    return sum(max(0, min(end, r['start'] + r['length']) -
                   max(start, r['start']))
               for r in qmap if r['data'])


class TestDiscardNoUnrefProbe(testtools.TestCase):
    """disk.hostcaps asks QEMU and libvirt; its answers match what their
    versions say (no nova here: the probe alone, on the tier's platform).
    """

    def setUp(self):
        super().setUp()
        base.require_environment(self)

    def test_answers_match_the_platform(self):
        qemu = hostcaps.qemu_discard_no_unref()
        self.assertEqual(qemu_version() >= (8, 1), qemu.supported, qemu)
        lv = hostcaps.libvirt_discard_no_unref()
        self.assertEqual(libvirt_version() >= (9, 5), lv.supported, lv)
        both = hostcaps.discard_no_unref()
        self.assertEqual(platform_has_discard_no_unref(), both.supported,
                         both)


class _Trim:

    GUEST_DISCARD = 'keep'
    # The flavors' prealloc:mode values to try.
    MODES = ()

    def _configure_compute(self):
        super()._configure_compute()
        self.flags(hw_disk_discard='unmap', group='libvirt')
        self.flags(guest_discard=self.GUEST_DISCARD,
                   group='prealloc_backend')

    def disk_facts(self, server, path):
        """What the host sees of the stopped guest's disk and of its XML,
        and what the guest last reported.
        """
        self.wait_for_domain_shutoff(server)
        xml = etree.fromstring(self.virsh('dumpxml', server['id']))
        [disk] = [d for d in xml.findall('./devices/disk')
                  if d.find('source').get('file') == path]
        driver = disk.find('driver')
        log = self.console_log(server)
        report = pb_guest.parse_console(log).get('trim')
        self.assertIsNotNone(report, log[-3000:])
        self.assertEqual(
            (str(TRIM_OFF_MIB), str(TRIM_MIB), '0', '0', '0'),
            (report['off_mib'], report['mib'], report['rc'],
             report['write_rc'], report['fill_rc']), log[-3000:])
        # The image's data, outside the trimmed range, as the guest read it
        # after its TRIM.
        self.assertEqual(self.base_md5, report['md5'])
        # What nova would upload on snapshot: qemu-img convert.
        out = os.path.join(self.useFixture(fixtures.TempDir()).path,
                           'snapshot.qcow2')
        subprocess.run(['qemu-img', 'convert', '-O', 'qcow2', path, out],
                       check=True, capture_output=True)
        return {'discard': driver.get('discard'),
                'no_unref': driver.get('discard_no_unref'),
                'zeroed': report['zeroed'], 'again': report['again'],
                'allocated': pb_fixtures.allocated(path),
                'converted_in_range': data_in_range(qcow2_map(out),
                                                    *TRIM_RANGE),
                'converted_allocated': pb_fixtures.allocated(out),
                'map': (qcow2_map(path) if self.IMAGES_TYPE == 'qcow2'
                        else None)}

    def trim_in_guest(self, mode):
        server = self.boot(self.flavor(mode=mode),
                           self.image(self.IMAGES_TYPE,
                                      action=pb_guest.ACTION_TRIM,
                                      mib=WRITE_MIB, trim_fill_mib=FILL_MIB))
        path = self.disk_path(server)
        # The guest powers off once it has reported.
        facts = self.disk_facts(server, path)
        self.assertEqual('0', facts['again'], facts)
        later = self.after_trim(server, path, mode, facts)
        self.delete(server)
        self.assert_no_leftovers(server)
        return facts, later

    def after_trim(self, server, path, mode, facts):
        """What a test wants to see after the first boot (None)."""
        return None

    def test_trim_per_mode(self):
        for mode in self.MODES:
            facts, later = self.trim_in_guest(mode)
            self.record(mode, facts, later)
            self.check_trim(mode, facts, later)

    def record(self, mode, facts, later):
        """With PREALLOC_TRIM_FACTS=FILE, one JSON line per disk (without
        its map) appended to FILE: the figures a closing note quotes.
        """
        path = os.environ.get('PREALLOC_TRIM_FACTS')
        if not path:
            return
        line = {'test': self.__class__.__name__, 'mode': mode,
                'qemu': '.'.join(map(str, qemu_version())),
                'libvirt': '.'.join(map(str, libvirt_version()))}
        for name, got in (('after_trim', facts), ('after_reboot', later)):
            if got is not None:
                line[name] = {k: v for k, v in got.items() if k != 'map'}
        with open(path, 'a') as f:
            f.write(json.dumps(line) + '\n')

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
        start, end = TRIM_RANGE
        covered = sum(min(end, r['start'] + r['length']) - max(start,
                                                               r['start'])
                      for r in own
                      if r['start'] < end and r['start'] + r['length'] >
                      start)
        self.assertEqual(end - start, covered, detail)
        return shifts.pop()

    def check_ignored(self, mode, facts):
        """The TRIM changed nothing on the host: the data, the
        reservation and the layout stay.
        """
        detail = '%s: %s' % (mode, facts)
        self.assertEqual(('ignore', None), (facts['discard'],
                                            facts['no_unref']), detail)
        self.assertEqual('no', facts['zeroed'], detail)
        # The 0xaa the guest could still read is in the snapshot too.
        self.assertGreaterEqual(facts['converted_in_range'],
                                (FILL_MIB - WRITE_MIB) * units.Mi, detail)
        if mode in ('space', 'full'):
            self.assertGreaterEqual(facts['allocated'], GIB, detail)
        if facts['map'] is not None:
            self.shift_of_every_cluster(facts['map'], mode)

    def check_no_unref(self, mode, facts):
        """discard-no-unref: the data dropped, the layout kept."""
        detail = '%s: %s' % (mode, facts)
        self.assertEqual(('unmap', 'on'), (facts['discard'],
                                           facts['no_unref']), detail)
        self.assertEqual('yes', facts['zeroed'], detail)
        self.assertEqual(0, facts['converted_in_range'], detail)
        # Every cluster where it was: the 4 MiB written after the TRIM
        # allocated no cluster.
        self.shift_of_every_cluster(facts['map'], mode)


class _Keep(_Trim):

    def check_trim(self, mode, facts, later):
        if (self.IMAGES_TYPE == 'qcow2' and mode == 'metadata' and
                platform_has_discard_no_unref()):
            self.check_no_unref(mode, facts)
        else:
            self.check_ignored(mode, facts)


class _Zero(_Trim):

    GUEST_DISCARD = 'zero'

    def after_trim(self, server, path, mode, facts):
        if not (platform_has_discard_no_unref() and
                mode in ('space', 'full')):
            return None
        # QEMU freed the blocks under the range; the next definition of
        # the guest reserves them again. Its boot finds the mark and only
        # reports.
        self.assertLess(facts['allocated'],
                        GIB - (TRIM_MIB - 2 * FILL_MIB) * units.Mi,
                        '%s: %s' % (mode, facts))
        self._reboot_server(server, hard=True)
        return self.disk_facts(server, path)

    def check_trim(self, mode, facts, later):
        if not platform_has_discard_no_unref():
            self.check_ignored(mode, facts)
            return
        self.check_no_unref(mode, facts)
        if mode in ('space', 'full'):
            detail = '%s: %s' % (mode, later)
            self.assertEqual('1', later['again'], detail)
            self.check_no_unref(mode, later)
            self.assertGreaterEqual(later['allocated'], GIB, detail)
            self.assertEqual(
                self.shift_of_every_cluster(facts['map'], mode),
                self.shift_of_every_cluster(later['map'], mode), detail)


class _Reclaim(_Trim):

    GUEST_DISCARD = 'reclaim'

    def check_trim(self, mode, facts, later):
        detail = '%s: %s' % (mode, facts)
        self.assertEqual(('unmap', None), (facts['discard'],
                                           facts['no_unref']), detail)
        self.assertEqual('yes', facts['zeroed'], detail)
        # The TRIM gave the host most of the 512 MiB back.
        self.assertLess(facts['allocated'], GIB - TRIM_MIB * units.Mi // 2,
                        detail)
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


class TestQcow2TrimZero(_Zero, base.RealHypervisorTestCase):

    IMAGES_TYPE = 'qcow2'
    MODES = ('metadata', 'space', 'full')


class TestQcow2TrimReclaim(_Reclaim, base.RealHypervisorTestCase):

    IMAGES_TYPE = 'qcow2'
    MODES = ('space',)


class TestRawTrimReclaim(_Reclaim, base.RealHypervisorTestCase):

    IMAGES_TYPE = 'raw'
    MODES = ('space',)
