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


"""nova's disk.api.extend for the plugin's disks: a raw file grown, a
guest filesystem resized, with nova's own helpers.

nova 34's ``extend()`` first asks ``qemu-img info`` without ``-f`` (a
guest-written header would decide), and does nothing for a qcow2 disk
already at its size, which is how the plugin's preallocating growth leaves
it: so the plugin runs nova's steps itself, here.

One small module rather than beside nova's call
(doc/source/contributor/design.rst, the modules): nova's call is inside
``extend()``, which the plugin cannot use as it is.
"""

import os

from nova.virt.disk import api as disk_api
from nova.virt.disk.mount import api as mount
from nova.virt.image import model as imgmodel
from oslo_concurrency import processutils
from oslo_log import log as logging

from prealloc_backend.disk import qemu
from prealloc_backend.planner import qcow2_layout

LOG = logging.getLogger(__name__)


def grow_raw(path, size):
    """Grow the raw file at ``path`` to ``size`` as nova's disk.api.extend
    does (``qemu-img resize -f raw``, then e2fsck/resize2fs when it holds
    an ext filesystem), without its header-probing ``qemu-img info``.

    NOTE(nova): nova 34's extend() first asks ``qemu-img info`` without
    ``-f`` for the current size (can_resize_image): a raw disk's
    guest-written qcow2 header would decide it, and qemu-img would open the
    data-file that header names. OSSA-2026-002
    (https://launchpad.net/bugs/2137507, CVE-2026-24708) gave extend()'s
    ``qemu-img resize`` its ``-f``; that probe still has none. A raw
    file's size is its length.
    """
    if size <= os.stat(path).st_size:
        return
    qemu.resize(path, 'raw', size, qcow2_layout.Qcow2Preallocation.OFF)
    image = imgmodel.LocalFileImage(path, imgmodel.FORMAT_RAW)
    if not disk_api.is_image_extendable(image):
        return
    try:
        disk_api.resize2fs(path, check_exit_code=[0])
    except processutils.ProcessExecutionError as exc:
        LOG.debug('Resizing the file system with resize2fs has failed with '
                  'error: %s', exc)


def resize_qcow2_fs(path):
    """Resize the filesystem of a grown qcow2 disk as nova's disk.api.extend
    does with ``[DEFAULT] resize_fs_using_block_device = True``.

    NOTE(nova): nova 34's extend() runs 'qemu-img resize' and then, for qcow2
    only when that option is set, resize2fs on the disk mounted through
    nbd (errors logged at debug level). It does nothing when the disk is
    already at its size, which is how the plugin leaves it: so the plugin
    runs that step itself, with nova's own helpers.
    """
    image = imgmodel.LocalFileImage(path, imgmodel.FORMAT_QCOW2)
    if not disk_api.is_image_extendable(image):
        return
    mounter = mount.Mount.instance_for_format(image, None, None)
    if not mounter.get_dev():
        return
    try:
        disk_api.resize2fs(mounter.device, run_as_root=True,
                           check_exit_code=[0])
    except processutils.ProcessExecutionError as exc:
        LOG.debug('Resizing the file system with resize2fs has failed with '
                  'error: %s', exc)
    finally:
        mounter.unget_dev()
