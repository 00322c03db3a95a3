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

"""Contradicting settings, each as documented, on real filesystems (root:
loop-mounted ext4 without extents).
"""

import functools
import os
import subprocess

from oslo_utils import units

from prealloc_backend.adapter import backend
from prealloc_backend import conf
from prealloc_backend import exception
from prealloc_backend.planner import diskplan
from prealloc_backend.planner import hostpolicy
from prealloc_backend.planner import modes
from tests import base
from tests import fixtures as pb_fixtures

GROUP = conf.GROUP_NAME


class ContradictionTestCase(base.TestCase):
    """Combinations refused at start-up or resolved as documented."""

    def _conflict(self, **kw):
        self.flags(group=GROUP, qcow2_extended_l2=False)
        for name, value in kw.items():
            if name in ('images_type',):
                self.flags(group='libvirt', **{name: value})
            elif name in ('use_cow_images', 'preallocate_images'):
                self.flags(**{name: value})
            else:
                self.flags(group=GROUP, **{name: value})

    def test_no_extended_l2_with_overlays_refused(self):
        for mode in ('metadata', 'space', 'full'):
            for images_type, use_cow in (('qcow2', True), ('qcow2', False),
                                         ('default', True)):
                self._conflict(mode=mode, images_type=images_type,
                               use_cow_images=use_cow)
                exc = self.assertRaises(exception.ConflictingOptions,
                                        hostpolicy.validate, conf.CONF)
                message = str(exc)
                for word in ('qcow2_extended_l2', mode, images_type):
                    self.assertIn(word, message)

    def test_no_extended_l2_via_nova_option_refused(self):
        self._conflict(mode=None, preallocate_images='space',
                       images_type='qcow2')
        exc = self.assertRaises(exception.ConflictingOptions,
                                hostpolicy.validate, conf.CONF)
        self.assertIn('space', str(exc))

    def test_no_extended_l2_accepted_where_it_does_not_matter(self):
        for mode, images_type, use_cow in (
                ('space', 'raw', True), ('full', 'flat', True),
                ('space', 'default', False), ('none', 'qcow2', True),
                ('metadata', 'lvm', True)):
            self._conflict(mode=mode, images_type=images_type,
                           use_cow_images=use_cow)
            self.assertEqual(modes.Mode(mode), hostpolicy.validate(conf.CONF))

    def _disk(self, images_type, size=16 * units.Mi):
        """A disk spawned from a raw image; its path."""
        instance = self.make_instance()
        name = 'src' if images_type == 'raw' else 'srcq'
        source = os.path.join(self.instances_path, name)
        pb_fixtures.make_base(source, 'raw', units.Mi, seed=2)

        def fetch(target, *args, **kwargs):
            subprocess.run(['cp', '--sparse=always', source, target],
                           check=True)

        image = backend.Backend(images_type == 'qcow2').by_name(
            instance, 'disk', images_type)
        image.cache(fetch_func=fetch, filename=name + '-img', size=size,
                    image_id=name + '-img')
        return image.path

    _raw_disk = functools.partialmethod(_disk, 'raw')
    _qcow2_disk = functools.partialmethod(_disk, 'qcow2')

    def test_mode_none_overrides_nova_space(self):
        """Documented: mode overrides preallocate_images for the plugin's
        disks, and nova's own 'fallocate -n' never runs on them.
        """
        self.flags(preallocate_images='space')
        self.flags(group=GROUP, mode='none')
        self.assertIs(modes.Mode.NONE, hostpolicy.validate(conf.CONF))
        self.assertLess(pb_fixtures.allocated(self._qcow2_disk()), units.Mi)
        self.assertLess(pb_fixtures.allocated(self._raw_disk()),
                        2 * units.Mi)

    def test_mode_space_overrides_nova_none(self):
        self.flags(preallocate_images='none')
        self.flags(group=GROUP, mode='space')
        self.assertIs(modes.Mode.SPACE, hostpolicy.validate(conf.CONF))
        self.assertGreaterEqual(pb_fixtures.allocated(self._raw_disk()),
                                16 * units.Mi)

    def test_metadata_on_raw_does_nothing(self):
        """Documented: raw has no metadata; the disk stays thin."""
        self.flags(group=GROUP, mode='metadata')
        self.flags(group='libvirt', images_type='raw')
        self.assertIs(modes.Mode.METADATA, hostpolicy.validate(conf.CONF))
        self.assertLess(pb_fixtures.allocated(self._raw_disk()),
                        2 * units.Mi)

    def test_fallocate_unsupported_fail_does_not_affect_full(self):
        """Documented: 'full always writes zeros and is not affected' by
        fallocate_unsupported, even 'fail', on a filesystem without
        fallocate(2).
        """
        self.use_loop_fs('ext4-noextents', 64)
        self.flags(group=GROUP, mode='full', fallocate_unsupported='fail')
        hostpolicy.validate(conf.CONF)
        disk = self._raw_disk()
        self.assertGreaterEqual(pb_fixtures.allocated(disk), 16 * units.Mi)

    def test_fallocate_unsupported_fail_with_space(self):
        """Documented: space + fail on such a filesystem fails the disk
        creation with an error naming the filesystem; nothing is left.
        """
        self.use_loop_fs('ext4-noextents', 64)
        self.flags(group=GROUP, mode='space', fallocate_unsupported='fail')
        hostpolicy.validate(conf.CONF)
        for make in (self._raw_disk, self._qcow2_disk):
            exc = self.assertRaises(exception.FallocateUnsupported, make)
            self.assertIn('ext', str(exc))
            self.assertIn('fallocate_unsupported', str(exc))
        leftovers = [os.path.join(d, f)
                     for d, _dirs, files in os.walk(self.instances_path)
                     for f in files
                     if not (d.endswith('_base') or d.endswith('locks') or
                             f in ('disk.info', 'src', 'srcq'))]
        self.assertEqual([], leftovers)

    def test_fixed_small_cluster_on_large_disk(self):
        """Documented: a fixed cluster size applies to every overlay; a
        cache that cannot cover the disk within the cap is not set at all
        (QEMU's default applies), it is not refused.
        """
        self.flags(group=GROUP, mode='metadata', qcow2_cluster_size='64K',
                   qcow2_metadata_cache_max_mb=1)
        self.assertIs(modes.Mode.METADATA, hostpolicy.validate(conf.CONF))
        fs = diskplan.FsFacts(True, 'xfs', units.Pi)
        plan = diskplan.make_plan(conf.CONF.prealloc_backend, {},
                                modes.Mode.METADATA, diskplan.DiskFormat.QCOW2,
                                8 * units.Ti, fs)
        self.assertEqual(64 * units.Ki, plan.cluster_size)
        self.assertIsNone(plan.metadata_cache_bytes)
