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

"""The nova-facing floor: what nova-compute and nova-api call.

The compute driver (driver.py) hands each call to one module of this
floor: the image backend nova's libvirt driver asks for disks
(backend.py) keeps nova's methods and their order, and gives each nova
call one disk operation (operation.py's DiskOperation), which reads the
disk's facts once, decides its mode once, makes the one plan and carries
out the steps (an overlay made, a disk grown or re-laid out, a file's
blocks allocated, the guest's disk settings) by handing data, never
nova's image object, to the executors of disk/. Also the migration steps
(migrationops.py), placement's inventory (inventory.py), the
instance-action events (events.py), the guest XML (guestxml.py) and the
flavor extra-spec validators nova-api loads (extra_specs.py).

May import: adoption (recovery at nova-compute's start), disk, planner,
privsep, system and the base modules (conf, exception, sizes), and nova.
Nothing below imports it; only cmd/ does.
"""
