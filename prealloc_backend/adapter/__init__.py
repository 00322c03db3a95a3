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

The compute driver (driver.py), the image backend nova's libvirt driver
asks for disks (backend.py), the migration steps (migrationops.py), the
instance-action events (events.py), the guest XML settings (guestxml.py)
and the flavor extra-spec validators nova-api loads (extra_specs.py). It
reads nova's objects and options, asks the planner, and hands the plan to
the disk executors below; nothing below imports it.
"""
