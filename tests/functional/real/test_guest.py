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

"""prealloc_bench.guest on its own: the runners the benchmark calls
boot the real guest (TCG, so that the result does not depend on /dev/kvm) and
the guest really writes its disk.
"""

import os
import subprocess

import fixtures
from oslo_utils import units

from prealloc_bench import guest as pb_guest
from tests import base as tests_base
from tests import fixtures as pb_fixtures
from tests.functional.real import base

WRITE_MIB = 8


class TestGuestRunners(tests_base.TestCase):

    def setUp(self):
        super().setUp()
        base.require_environment(self)
        # test_libvirt's guest runs under the tier's libvirtd.
        base.hold_tier_lock(self)
        self.guest = pb_guest.build_guest()
        workdir = self.useFixture(fixtures.TempDir()).path
        # A base whose first MiBs hold data, under a qcow2 overlay as nova
        # would make it: what the guest writes must replace that data.
        self.base = pb_fixtures.make_base(os.path.join(workdir, 'base.raw'),
                                          'raw', 16 * units.Mi, seed=3)
        self.disk = os.path.join(workdir, 'disk.qcow2')
        subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-F',
                        'raw', '-b', self.base, '-o', 'extended_l2=on',
                        self.disk, str(64 * units.Mi)], check=True)

    def assert_written(self):
        # The first WRITE_MIB MiB read as zeros now, the rest is still the
        # base's data.
        copy = self.disk + '.raw'
        subprocess.run(['qemu-img', 'convert', '-f', 'qcow2', '-O', 'raw',
                        self.disk, copy], check=True, capture_output=True)
        with open(copy, 'rb') as f:
            seen = f.read(16 * units.Mi)
        with open(self.base, 'rb') as f:
            data = f.read()
        head = WRITE_MIB * units.Mi
        self.assertNotEqual(bytes(head), data[:head])
        self.assertEqual(bytes(head), seen[:head])
        self.assertEqual(data[head:], seen[head:])

    def test_plain_qemu(self):
        result = pb_guest.run_write_test(self.disk, 'qcow2', mib=WRITE_MIB,
                                         guest=self.guest,
                                         accel=pb_guest.ACCEL_TCG,
                                         cache_size=units.Mi)
        self.assertEqual(WRITE_MIB, result.mib)
        self.assertEqual('tcg', result.accel)
        self.assertEqual('qemu', result.runner)
        self.assertGreater(result.seconds, 0)
        self.assertGreater(result.mib_per_s, 0)
        self.assert_written()

    def test_libvirt(self):
        result = pb_guest.run_write_test_libvirt(
            self.disk, 'qcow2', mib=WRITE_MIB, guest=self.guest,
            accel=pb_guest.ACCEL_TCG, cache_size=units.Mi)
        self.assertEqual((WRITE_MIB, 'tcg', 'libvirt'),
                         (result.mib, result.accel, result.runner))
        self.assertGreater(result.seconds, 0)
        self.assert_written()
        # The transient domain is gone.
        names = subprocess.run(['virsh', '-c', base.URI, 'list', '--all',
                                '--name'], capture_output=True,
                               text=True).stdout.split()
        self.assertEqual([], [n for n in names
                              if n.startswith('prealloc-guest-')])

    def test_dd_failure_is_reported(self):
        # A disk smaller than what the guest is told to write: dd fails in
        # the guest and the runner says so instead of inventing a figure.
        small = self.disk + '.small'
        subprocess.run(['qemu-img', 'create', '-q', '-f', 'raw', small,
                        str(4 * units.Mi)], check=True)
        exc = self.assertRaises(pb_guest.GuestError,
                                pb_guest.run_write_test, small, 'raw',
                                mib=WRITE_MIB, guest=self.guest,
                                accel=pb_guest.ACCEL_TCG)
        self.assertIn('dd in the guest failed', str(exc))
