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

"""The privilege-separation context of prealloc_backend.

One context with one capability, CAP_DAC_OVERRIDE: the daemon opens instance
disks for writing although libvirt (dynamic_ownership) may have chown'ed them
to the qemu user with mode 0600, and creates the probe file in the instance
directory. It needs nothing else: it never changes owners or modes (no
CAP_CHOWN or CAP_FOWNER), never mounts (no CAP_SYS_ADMIN), and reads only
what it opens for writing (CAP_DAC_READ_SEARCH would add reading any file,
which it does not need).

The entrypoints live in prealloc_backend.privsep.fs; import that module by
its full path so that privileged calls stand out where they are made.
"""

from oslo_privsep import capabilities
from oslo_privsep import priv_context

from prealloc_backend import conf

ctx = priv_context.PrivContext(
    'prealloc_backend',
    cfg_section=conf.PRIVSEP_GROUP,
    pypath=__name__ + '.ctx',
    capabilities=[capabilities.CAP_DAC_OVERRIDE],
)
