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

"""The in-guest write test, through nova: a real guest writes N MiB to its
root disk with O_DIRECT and reports the time on its serial console; per
mode, stock nova's (none, space) against the plugin's.

The throughput goes into the test's details and the log, never into an
assertion (TCG on a shared CI machine is far too noisy for that). What is
asserted is where the host blocks came from: a preallocated disk absorbs
the guest's writes without growing; a thin one grows by what was written.
"""

import os

from testtools import content

from prealloc_bench import guest as pb_guest
from tests.functional.real import base

GIB = 1024 ** 3
MIB = 1024 ** 2
WRITE_MIB = 128


class _GuestWrite:

    # (flavor's prealloc:mode or None, label)
    MODES = ()

    def write_in_guest(self, flavor_mode, label):
        server = self.boot(self.flavor(mode=flavor_mode),
                           self.image('qcow2', action='write',
                                      mib=WRITE_MIB))
        # The guest powers off once it has reported.
        self.wait_for_domain_shutoff(server)
        log = self.console_log(server)
        report = pb_guest.parse_console(log).get('write')
        self.assertIsNotNone(report, log[-3000:])
        self.assertEqual('0', report['rc'], log[-3000:])
        self.assertEqual(str(WRITE_MIB), report['mib'])
        seconds = (int(report['end_ns']) - int(report['start_ns'])) / 1e9
        self.assertGreater(seconds, 0)
        path = self.disk_path(server)
        facts = {'allocated': os.stat(path).st_blocks * 512,
                 'apparent': os.path.getsize(path)}
        line = ('%s: guest wrote %d MiB with O_DIRECT in %.3f s (%.1f '
                'MiB/s, TCG through libvirt); disk now %d MiB allocated, '
                '%d MiB long' % (label, WRITE_MIB, seconds,
                                 WRITE_MIB / seconds,
                                 facts['allocated'] // MIB,
                                 facts['apparent'] // MIB))
        base.LOG.info('%s', line)
        self.addDetail('guest-write-%s' % label, content.text_content(line))
        self.delete(server)
        self.assert_no_leftovers(server)
        return facts

    def test_guest_write_per_mode(self):
        for flavor_mode, label in self.MODES:
            facts = self.write_in_guest(flavor_mode, label)
            self.check_write_facts(label, facts)


class TestGuestWritePlugin(_GuestWrite, base.RealHypervisorTestCase):

    IMAGES_TYPE = 'qcow2'
    MODES = (('none', 'plugin-none'), ('metadata', 'plugin-metadata'),
             ('space', 'plugin-space'), ('full', 'plugin-full'))

    def check_write_facts(self, label, facts):
        if label in ('plugin-none', 'plugin-metadata'):
            # Data clusters were allocated on the host as the guest wrote.
            self.assertGreaterEqual(facts['allocated'], WRITE_MIB * MIB)
            self.assertLess(facts['allocated'], GIB // 2)
        else:
            # Everything was already reserved: the writes landed in it.
            self.assertGreaterEqual(facts['allocated'], GIB)
        if label != 'plugin-none':
            # The clusters exist from the start: the file never grew.
            self.assertLess(facts['apparent'], GIB + 8 * MIB)
            self.assertGreaterEqual(facts['apparent'], GIB)
        else:
            self.assertLess(facts['apparent'], GIB // 2)


class TestGuestWriteNovaNone(_GuestWrite, base.RealHypervisorTestCase):
    """Stock nova's driver, preallocate_images = none (the control)."""

    COMPUTE_DRIVER = 'libvirt.LibvirtDriver'
    IMAGES_TYPE = 'qcow2'
    PREALLOCATE_IMAGES = 'none'
    MODES = ((None, 'nova-none'),)

    def check_write_facts(self, label, facts):
        self.assertGreaterEqual(facts['allocated'], WRITE_MIB * MIB)
        self.assertLess(facts['allocated'], GIB // 2)
        self.assertLess(facts['apparent'], GIB // 2)


class TestGuestWriteNovaSpace(_GuestWrite, base.RealHypervisorTestCase):
    """Stock nova's driver, preallocate_images = space: 'fallocate -n'
    reserves the blocks past the end of a small qcow2 file, which still
    grows cluster by cluster as the guest writes.
    """

    COMPUTE_DRIVER = 'libvirt.LibvirtDriver'
    IMAGES_TYPE = 'qcow2'
    PREALLOCATE_IMAGES = 'space'
    MODES = ((None, 'nova-space'),)

    def check_write_facts(self, label, facts):
        self.assertGreaterEqual(facts['allocated'], GIB)
        self.assertGreaterEqual(facts['apparent'], WRITE_MIB * MIB)
        self.assertLess(facts['apparent'], GIB // 2)
