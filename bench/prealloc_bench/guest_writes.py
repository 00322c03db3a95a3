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

"""In-guest first writes: a tiny guest writes to the disk with O_DIRECT.

The method of the seed measurements (dd inside a guest): the disks are made
like the other write workloads' (the plugin's and nova's own image
backends), then prealloc_bench.guest boots a busybox guest built on
this machine from Debian packages on each, which writes from the start of its
disk with O_DIRECT, prints the time on its serial console and powers off.
KVM where /dev/kvm is offered, TCG only where it is not; where KVM is
offered but the guest does not boot under it, nothing is measured and the
table says why (guest.accelerator). The engine line names the accelerator.

Opt-in (``prealloc-bench --guest``): it needs qemu-system-x86 and a
kernel package in the guest cache (``.ci/libvirt-up`` fetches one), and it
boots a guest per sample.

It runs as the user the benchmark runs as (see engine.Bench).
"""

from oslo_utils import units

from prealloc_bench import engine
from prealloc_bench import guest
from prealloc_bench import variants as vs
from prealloc_bench import workloads

WRITE_MIB = {'default': 256, 'quick': 32}


class GuestWrites(workloads._FirstWrites):
    name = 'guest-write'
    title = 'In-guest first writes, O_DIRECT (busybox dd in a tiny guest)'
    unit = 'MiB/s'
    fact_columns = workloads._FirstWrites.fact_columns + (
        ('accel', 'accel'),)

    def __init__(self):
        self._guest = None
        self._accel = None
        self._unavailable = None

    def _mib(self, bench):
        return min(WRITE_MIB.get(bench.config.name, 256),
                   bench.config.write_disk // units.Mi)

    def setup(self, bench):
        super().setup(bench)
        try:
            self._guest = guest.build_guest()
            self._accel = guest.accelerator(guest=self._guest)
        except guest.GuestError as exc:
            self._unavailable = 'no guest can run here: %s' % exc

    def count(self, bench, group):
        return self._mib(bench)

    def written(self, bench, group):
        return self._mib(bench) * units.Mi

    def unmeasurable(self, bench):
        return self._unavailable

    def engine_text(self, bench):
        return ('qemu-system-x86_64 (accelerator: %s), virtio disk with '
                'cache=%s and aio=%s for every variant and the block sizes '
                'of its guest XML (<blockio>), busybox dd of %d MiB with '
                'oflag=direct from the start of the disk, timed inside the '
                'guest' % (self._accel or 'none', vs.CACHE, vs.AIO,
                           self._mib(bench)))

    def measure(self, bench, case, rep):
        cfg = bench.config
        disk = vs.make_disk(case.variant, bench.workdir,
                            bench.base(cfg.write_base), cfg.write_disk)
        try:
            case.facts.update(workloads.disk_facts(disk))
            case.facts['accel'] = self._accel
            allocated = disk.allocated
            result = guest.run_write_test(
                disk.path, disk.fmt, mib=self._mib(bench),
                guest=self._guest, accel=self._accel, aio=vs.AIO,
                cache_size=disk.cache_size, workdir=bench.workdir,
                block_sizes=disk.block_sizes)
        finally:
            disk.remove()
        return engine.Sample(result.mib_per_s,
                             {'allocated': allocated,
                              'create_seconds': disk.create_seconds})
