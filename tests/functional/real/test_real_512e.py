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

"""What a real Linux guest does with the physical block size the plugin
advertises (``<blockio physical_block_size='4096'/>`` on overlays whose
subclusters are 4 KiB; doc/source/admin/write-size.rst).

The disks are made by the plugin's backend as nova asks for them, the
block sizes are the ones its ``libvirt_info`` writes, and the guest
(bench/prealloc_bench/guest.py's tiny guest with the host's mke2fs,
mkfs.xfs and GNU dd)
runs under plain qemu-system-x86_64 with ``-device virtio-blk-pci,
logical_block_size=512,physical_block_size=...``: what libvirt makes of
``<blockio>``. QEMU's trace of virtio_blk_handle_write counts the guest's
write requests by size.

The accelerator is KVM where it boots the guest, TCG otherwise: nothing
here is timed.
"""

import os
import shutil
import subprocess

from lxml import etree
from oslo_utils import units

from prealloc_bench import guest as pb_guest
from tests import base

PATTERN = pb_guest.DD512_PATTERN
SECTOR = 512
COUNT = 64
FIRST = 1


def environment_problem():
    if not shutil.which('qemu-system-x86_64'):
        return 'qemu-system-x86_64 is not installed'
    missing = [t for t in pb_guest.FS_TOOLS + ('/usr/sbin/xfs_repair',)
               if not os.path.exists(t)]
    if missing:
        return ('%s missing (e2fsprogs, xfsprogs, coreutils)' %
                ', '.join(missing))
    try:
        pb_guest.build_guest(tools=pb_guest.FS_TOOLS)
    except pb_guest.GuestError as exc:
        return 'no tiny guest can be built: %s' % exc
    return None


class TestAdvertisedBlockSize(base.BackendTestCase):

    def setUp(self):
        super().setUp()
        problem = environment_problem()
        if problem:
            if os.environ.get('CI') == 'true':
                self.fail('CI=true and the guest cannot run: %s' % problem)
            self.skipTest(problem)
        self.guest = pb_guest.build_guest(tools=pb_guest.FS_TOOLS)
        try:
            self.accel = pb_guest.accelerator(guest=self.guest)
        except pb_guest.GuestError:
            # KVM offered but the guest does not boot under it: TCG is
            # fine, nothing is timed here.
            self.accel = pb_guest.ACCEL_TCG

    def plugin_disk(self, mode='space', size=64 * units.Mi):
        """(path, (logical, physical)) of a qcow2 disk the plugin made,
        with the block sizes its guest XML advertises.
        """
        img = self.image('qcow2', mode)
        self.cache(img, fmt='qcow2', size=size)
        dev = etree.fromstring(img.libvirt_info('none', {}).to_xml())
        blockio = dev.find('blockio')
        physical = 512 if blockio is None else int(
            blockio.get('physical_block_size'))
        logical = 512 if blockio is None else int(
            blockio.get('logical_block_size') or 512)
        return img.path, (logical, physical)

    def run_guest(self, path, step, block_sizes, fs='ext4'):
        result = pb_guest.run_blockio(
            path, 'qcow2', step=step, block_sizes=block_sizes, fs=fs,
            count=COUNT, sector=FIRST, guest=self.guest, accel=self.accel,
            timeout=240, workdir=self.instances_path)
        self.assertEqual('0', result.step['rc'], result.console[-3000:])
        return result

    def read_sectors(self, path, fmt, first, count):
        out = os.path.join(self.instances_path, 'sectors.raw')
        subprocess.run(['qemu-img', 'dd', '-f', fmt, '-O', 'raw',
                        'bs=%d' % SECTOR, 'skip=%d' % first,
                        'count=%d' % count, 'if=%s' % path, 'of=%s' % out],
                       check=True, capture_output=True)
        with open(out, 'rb') as f:
            return f.read()

    def test_guest_sees_512e_and_512_byte_writes_keep_their_data(self):
        path, sizes = self.plugin_disk('space')
        self.assertEqual((512, 4096), sizes)
        base_path = os.path.join(self.instances_path, '_base', 'base-image')
        before = self.read_sectors(base_path, 'qcow2', FIRST, 2 * COUNT)
        result = self.run_guest(path, pb_guest.STEP_DD512, sizes)
        self.assertEqual({'logical': '512', 'physical': '4096',
                          'min_io': '4096'},
                         {k: result.queue[k] for k in
                          ('logical', 'physical', 'min_io')})
        # The guest's O_DIRECT 512-byte writes reached QEMU as such: the
        # logical block size still allows them.
        self.assertEqual(COUNT, result.write_sizes.get(512),
                         result.write_sizes)
        # Every other sector is the guest's, the ones between are still the
        # image's: the copy of the rest of each 4 KiB subcluster is right.
        after = self.read_sectors(path, 'qcow2', FIRST, 2 * COUNT)
        for i in range(2 * COUNT):
            want = (PATTERN if i % 2 == 0 else
                    before[i * SECTOR:(i + 1) * SECTOR])
            self.assertEqual(want, after[i * SECTOR:(i + 1) * SECTOR],
                             'sector %d' % (FIRST + i))

    def xfs_write_sizes(self, path, mkfs_sizes, fs_sizes):
        made = self.run_guest(path, pb_guest.STEP_MKFS, mkfs_sizes, 'xfs')
        used = self.run_guest(path, pb_guest.STEP_FS, fs_sizes, 'xfs')
        return made.write_sizes, used.write_sizes

    def small(self, write_sizes):
        return sum(n for size, n in write_sizes.items() if size < 4096)

    def test_xfs_made_on_the_plugins_disk_writes_4k_or_more(self):
        # mkfs.xfs takes the physical block size as its sector size, and
        # XFS's log then never writes less.
        path, sizes = self.plugin_disk('metadata', size=units.Gi)
        self.assertEqual((512, 4096), sizes)
        made, used = self.xfs_write_sizes(path, sizes, sizes)
        self.assertEqual(0, self.small(made), made)
        self.assertEqual(0, self.small(used), used)

    def test_existing_xfs_keeps_working_when_the_size_appears(self):
        # An instance made before: its XFS has 512-byte sectors, and its
        # next boot (hard reboot) advertises 4096. It mounts, writes and
        # stays consistent; its log keeps the sub-4 KiB writes it was made
        # with (the control that the size is what changes them).
        path, sizes = self.plugin_disk('metadata', size=units.Gi)
        made, used = self.xfs_write_sizes(path, (512, 512), sizes)
        self.assertGreater(self.small(made), 0, made)
        self.assertGreater(self.small(used), 0, used)
        raw = os.path.join(self.instances_path, 'fs.raw')
        subprocess.run(['qemu-img', 'convert', '-O', 'raw', path, raw],
                       check=True)
        check = subprocess.run(['xfs_repair', '-n', raw],
                               capture_output=True, text=True)
        self.assertEqual(0, check.returncode, check.stdout + check.stderr)
