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

"""Adoption of existing disks: an instance's qcow2 overlays rewritten to
the host's policy, live (a block copy onto a disk the plugin made, then a
pivot) or offline (qcow2.relayout_overlay).

instances.py runs it: the disks chosen from nova's and libvirt's records,
the claim on the instance, each instance and disk adopted under the host's
lock; live.py speaks to libvirt and keeps the crash journal; recovery.py
finds and recovers what an interrupted adoption left (``adopt`` and
nova-compute's start). ``prealloc_backend.cmd.adopt`` is only its command
line (arguments, progress, the report); planner/adoption.py decides which
disks are at the host's policy.

May import: disk, planner, system and the base modules (conf, exception,
sizes), nova's objects and libvirt. Imported by adapter/ (recovery) and
cmd/.
"""
