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

"""The disk executors: they carry out a plan on files, as the nova user.

qemu-img and its one typed reading of an image (qemu.py's ImageInfo) and
qcow2 overlays, growth and re-layout (qcow2.py); the mend of a growth cut
short (refcount.py); the blocks of raw files (allocate.py, through the
privileged daemon) and their growth (extend.py); a disk's format from
nova's records and the safety checks of its header (formats.py); the
facts of a filesystem (fsprobe.py); the crash journal beside a disk being
made (journal.py); what the host's QEMU and libvirt can do (hostcaps.py);
what instances_path holds, read within bounds for placement and the
report (usage.py). They decide nothing the plan does not say and take
data (paths, sizes, formats, plans), never nova's image objects.

May import: planner, privsep (allocate.py only), system and the base
modules (conf, exception, sizes), and nova's utilities. Never adapter,
adoption, checks or cmd.
"""
