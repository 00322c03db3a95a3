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

"""prealloc_backend/bench/guest_writes.py: the in-guest workload's sizes
and what it says when no guest can run (booting guests is in
tests/unit/test_bench_guest.py and the real tier).
"""

import dataclasses

import fixtures
from oslo_utils import units

from prealloc_backend.bench import engine
from prealloc_backend.bench import guest
from prealloc_backend.bench import guest_writes
from tests import base


class FakeBench:
    """Only the config the workload reads (no disk is made here)."""

    def __init__(self, config):
        self.config = config


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
            'prealloc_backend.bench.guest.build_guest', no_guest))
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_backend.bench.workloads._FirstWrites.setup',
            lambda self, bench: None))
        w.setup(FakeBench(engine.QUICK))
        self.assertEqual('no guest can run here: no kernel here',
                         w.unmeasurable(None))
