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

"""The planner: pure decisions, no disk touched and no process run.

The preallocation modes (modes.py), the layout formulas of qcow2 disks
(qcow2_layout.py), the one plan of a disk's work (diskplan.py), the host's
policy from its configuration (hostpolicy.py), whether an existing overlay
is at that policy (adoption.py) and what a host can still reserve for
placement (capacity.py). Every other floor takes its vocabulary and its
numbers from here.

May import: only the base modules (conf, exception, sizes), the
standard library and oslo's utilities; never a floor above, never nova.
"""
