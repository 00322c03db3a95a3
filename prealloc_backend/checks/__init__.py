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

"""The checks of ``prealloc-backend check``, one module per concern.

Each check is a function ``check_*(host) -> Result`` (checks/result.py) of
one concern, reading the configuration and shared facts from ``host``
(checks/host.py):

- config.py: option values valid; the effective mode and the plan for it.
- compute_driver.py: compute_driver loads the plugin as nova-compute will.
- instances.py: instances_path against the privileged daemon's own pin
  rules (the function the daemon calls), first and again after every
  other check; who the nova user is.
- filesystem.py: fallocate(2) on instances_path (a real probe); free space
  for a new disk as the plan sizes it.
- qemu_img.py: qemu-img's version; a real extended_l2 overlay made and
  grown in instances_path.
- owner.py: who a step in instances_path runs as. The command runs as
  root; what it writes in instances_path (host.py's fallocate(2) probe,
  qemu_img.py's overlay) is written by a child process as the user who
  controls that directory (the nova user), in the directory held open.
  The other checks only read.
- privsep.py: how nova-compute will start the privileged daemon.
- libvirtd.py: libvirt's disk ownership settings (qemu.conf); the
  <metadata_cache> the plan writes, and whether libvirt honours it.
- discard.py: what a guest's TRIM does to the disks of each mode.
- existing.py: existing overlays not at the host's policy, and what
  adopting them would reserve (read-only, nothing followed).
- capacity.py: what placement is told (DISK_GB, the trait) and what the
  instances filesystem holds, per host, disk and guest: the figures of
  ``prealloc-backend report`` (read as the owner of instances_path, and
  through a read-only libvirt connection).

CHECKS is their order in the report; cmd/check.py runs them on
oslo.upgradecheck.

May import: disk, planner, privsep, system and the base modules; the
adapter's driver only inside compute_driver.py's check, which loads it as
nova-compute will. Only cmd/ imports this floor.
"""

from prealloc_backend.checks import capacity
from prealloc_backend.checks import compute_driver
from prealloc_backend.checks import config
from prealloc_backend.checks import discard
from prealloc_backend.checks import existing
from prealloc_backend.checks import filesystem
from prealloc_backend.checks import instances
from prealloc_backend.checks import libvirtd
from prealloc_backend.checks import privsep
from prealloc_backend.checks import qemu_img

CHECKS = (
    ('Configuration', config.check_options),
    ('Effective mode', config.check_mode),
    ('Compute driver', compute_driver.check_compute_driver),
    ('Instances path', instances.check_pin),
    ('Instances filesystem', filesystem.check_filesystem),
    ('Free space', filesystem.check_free_space),
    ('qemu-img', qemu_img.check_qemu_img),
    ('Privsep daemon', privsep.check_privsep),
    ('libvirt disk ownership', libvirtd.check_ownership),
    ('libvirt metadata cache', libvirtd.check_metadata_cache),
    ('Guest discard', discard.check_guest_discard),
    ('Existing disks', existing.check_existing_disks),
    ('Capacity', capacity.check_capacity),
    # After every other check: a swap while they ran is caught.
    ('Instances path, at the end', instances.check_pin_again),
)
