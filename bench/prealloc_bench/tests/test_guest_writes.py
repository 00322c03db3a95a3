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

"""bench/prealloc_bench/guest_writes.py: the in-guest workload's sizes
and what it says when no guest can run (booting guests is in
prealloc_bench/tests/test_guest.py and the real tier).
"""

import dataclasses

import fixtures
from oslo_utils import units

from prealloc_bench import engine
from prealloc_bench import guest
from prealloc_bench import guest_writes
from prealloc_bench import variants
from tests import base


class FakeBench:
    """Only the config the workload reads (no disk is made here)."""

    def __init__(self, config, workdir=None):
        self.config = config
        self.workdir = workdir

    def base(self, size):
        return '/base'


class GuestWritesTestCase(base.TestCase):

    def test_sizes_follow_the_config(self):
        w = guest_writes.GuestWrites()
        quick = FakeBench(engine.QUICK)
        self.assertEqual(32, w.count(quick, None))
        self.assertEqual(32 * units.Mi, w.written(quick, None))
        small = FakeBench(dataclasses.replace(engine.DEFAULT,
                                              write_disk=16 * units.Mi))
        self.assertEqual(16, w.count(small, None))
        self.assertIn('busybox dd of 16 MiB', w.engine_text(small))
        self.assertIn('accelerator: none', w.engine_text(small))

    def test_no_guest_makes_it_unmeasurable(self):
        w = guest_writes.GuestWrites()

        def no_guest():
            raise guest.GuestError('no kernel here')
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_bench.guest.build_guest', no_guest))
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_bench.workloads._FirstWrites.setup',
            lambda self, bench: None))
        w.setup(FakeBench(engine.QUICK))
        self.assertEqual('no guest can run here: no kernel here',
                         w.unmeasurable(None))

    def test_the_guest_sees_the_disk_s_blockio(self):
        # What the guest XML's <blockio> says reaches the guest's runner.
        # Booting is mocked here: it needs a kernel and qemu-system. The
        # command line run_write_test makes of it is checked in
        # test_guest; no test boots this workload's guest with it.
        calls = []

        def run_write_test(path, fmt, **kwargs):
            calls.append(kwargs)
            return guest.WriteResult(mib=32, seconds=1.0, accel='tcg',
                                     runner=guest.RUNNER_QEMU)

        workdir = self.useFixture(fixtures.TempDir()).path
        disk = variants.Disk(
            variant=variants.PLUGIN_SPACE, path='/d', fmt='qcow2',
            create_seconds=0.1, cache_size=None, cluster_size=128 * units.Ki,
            extended_l2=True, libvirt_io='native', workdir=workdir,
            block_sizes=(512, 4096))
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_bench.variants.make_disk',
            lambda *args, **kwargs: disk))
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_bench.guest.run_write_test', run_write_test))
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_bench.variants.Disk.allocated', 0))
        case = engine.Case(variant=variants.PLUGIN_SPACE, group='default')
        w = guest_writes.GuestWrites()
        w.measure(FakeBench(engine.QUICK, workdir), case, 0)
        self.assertEqual((512, 4096), calls[0]['block_sizes'])
