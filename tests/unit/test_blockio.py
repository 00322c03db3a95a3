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

"""The physical block size guests are told (``<blockio>``): the decision
(qcow2_layout.physical_block_size) and the guest XML of disks made with real
qemu-img (backend.libvirt_info). What a guest then does with it is tested
in tests/functional/real/test_real_512e.py.
"""

from lxml import etree

from prealloc_backend.planner import diskplan
from prealloc_backend.planner.modes import Mode
from prealloc_backend.planner import qcow2_layout
from tests import base


class Opts:
    def __init__(self, advertise=True):
        self.advertise_physical_block_size = advertise


def disk(cluster_k, extended_l2):
    return diskplan.ExistingDisk(allocated_bytes=0, virtual_size=1 << 30,
                               cluster_size=cluster_k * 1024,
                               extended_l2=extended_l2)


class TestDecision(base.TestCase):

    def test_4k_subclusters_are_advertised(self):
        for mode in (Mode.METADATA, Mode.SPACE, Mode.FULL):
            self.assertEqual(4096, qcow2_layout.physical_block_size(
                Opts(), mode, disk(128, True)), mode)

    def test_other_layouts_keep_qemus_512(self):
        # 2 KiB and 8 KiB+ subclusters, plain 64K/128K clusters.
        for cluster_k, extended in ((64, True), (256, True), (2048, True),
                                    (64, False), (128, False)):
            self.assertIsNone(qcow2_layout.physical_block_size(
                Opts(), Mode.SPACE, disk(cluster_k, extended)),
                (cluster_k, extended))

    def test_mode_none_is_stock_nova(self):
        self.assertIsNone(qcow2_layout.physical_block_size(
            Opts(), Mode.NONE, disk(128, True)))

    def test_option_off(self):
        self.assertIsNone(qcow2_layout.physical_block_size(
            Opts(advertise=False), Mode.SPACE, disk(128, True)))

    def test_unknown_layout(self):
        self.assertIsNone(qcow2_layout.physical_block_size(Opts(), Mode.SPACE,
                                                     None))
        self.assertIsNone(qcow2_layout.physical_block_size(
            Opts(), Mode.SPACE, diskplan.ExistingDisk(0, 1 << 30)))


class TestGuestXML(base.BackendTestCase):

    def blockio(self, fmt, mode, **flags):
        if flags:
            self.flags(group='prealloc_backend', **flags)
        img = self.image(fmt, mode)
        self.cache(img, fmt=fmt, filename='base-' + fmt)
        dev = etree.fromstring(img.libvirt_info('none', {}).to_xml())
        return dev.find('blockio')

    def test_plugin_overlays_are_512e(self):
        for mode in ('metadata', 'space', 'full'):
            blockio = self.blockio('qcow2', mode)
            self.assertIsNotNone(blockio, mode)
            self.assertEqual('4096', blockio.get('physical_block_size'))
            # The logical size stays QEMU's 512: no guest write refused.
            self.assertIsNone(blockio.get('logical_block_size'))

    def test_stock_raw_and_other_layouts_have_none(self):
        self.assertIsNone(self.blockio('qcow2', 'none'))
        self.assertIsNone(self.blockio('raw', 'space'))
        self.assertIsNone(self.blockio('qcow2', 'space',
                                       qcow2_cluster_size='256K'))

    def test_option_off(self):
        self.assertIsNone(self.blockio(
            'qcow2', 'space', advertise_physical_block_size=False))

    def test_advertised_without_the_metadata_cache(self):
        # The layout is read for <blockio> even where the operator leaves
        # the L2 cache to QEMU (no <metadata_cache> then).
        blockio = self.blockio('qcow2', 'space',
                               qcow2_l2_cache='qemu-default')
        self.assertIsNotNone(blockio)
        self.assertEqual('4096', blockio.get('physical_block_size'))
