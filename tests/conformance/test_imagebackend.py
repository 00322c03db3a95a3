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
"""nova's test_imagebackend.py with the plugin's Backend, Flat and Qcow2.

nova's FlatTestCase and Qcow2TestCase take their class from
``imagebackend.Flat``/``imagebackend.Qcow2`` in their setUp, which
base.PluginInPlace has pointed at the plugin's classes; BackendTestCase
builds ``imagebackend.Backend``, the plugin's.

Left out: LvmTestCase, EncryptedLvmTestCase, RbdTestCase and PloopTestCase
(the plugin keeps nova's own classes for those backends: running them would
test nova's code again), UtimeWorkaroundTestCase (a module function the
plugin calls but does not replace).
"""

from nova.tests.unit.virt.libvirt import test_imagebackend as nova_tests

from tests.conformance import base

BOTH = base.ALL_MODES
# Why (plugin lines: prealloc_backend/adapter/backend.py).
COUNTS_EXISTS = (
    'mocks os.path.exists with one answer per call nova makes; the '
    'plugin\'s cache() (199-220) also checks the disk and writes its crash '
    'journal beside it, on purpose, so the answers run out or shift')
COUNTS_EXISTS_CREATE = (
    'mocks os.path.exists with one answer per call nova makes; the '
    'plugin\'s Qcow2.create_image asks self.exists() first (418) to choose '
    'nova\'s path or its own, so every later answer shifts')
NOVA_FALLOCATE = (
    'expects nova\'s "fallocate -n" step (Image.cache, preallocate=True); '
    'the plugin switches it off on purpose (134: it inflated metadata '
    'overlays) and allocates itself, here on a disk the test only '
    'pretends exists')
NOVA_PREALLOCATE_ATTR = (
    'expects preallocate=True for preallocate_images=space; the plugin '
    'sets it False on purpose (134), so nova\'s "fallocate -n" step never '
    'runs on its disks')

HEADER_PROBE = (
    'expects nova\'s Flat to run "qemu-img info" without -f on a disk '
    'disk.info does not list and to record the format its header claims '
    '(nova bug 1221190\'s class); the plugin takes a disk\'s format from '
    'nova\'s records and never from a header a guest can write')
NOVA_RAW_EXTEND = (
    'expects nova\'s disk.api.extend for a raw disk, whose '
    'can_resize_image asks "qemu-img info" without -f for the current size '
    '(a guest-written qcow2 header decides it); the plugin grows a raw '
    'file itself with "qemu-img resize -f raw", here on a disk '
    'the test only pretends it copied')

# (nova class, test, modes, why the plugin differs on purpose)
EXCLUDED = [
    ('FlatTestCase', 'test_correct_format', BOTH, HEADER_PROBE),
    ('FlatTestCase', 'test_create_image_extend', BOTH, NOVA_RAW_EXTEND),
    ('FlatTestCase', 'test_cache', BOTH, COUNTS_EXISTS),
    ('FlatTestCase', 'test_cache_base_dir_exists', BOTH, COUNTS_EXISTS),
    ('FlatTestCase', 'test_cache_image_exists', BOTH, COUNTS_EXISTS),
    ('FlatTestCase', 'test_cache_template_exists', BOTH, COUNTS_EXISTS),
    ('FlatTestCase', 'test_prealloc_image', BOTH, NOVA_FALLOCATE),
    ('FlatTestCase', 'test_prealloc_image_without_write_access', BOTH,
     NOVA_FALLOCATE),
    ('Qcow2TestCase', 'test_cache', BOTH, COUNTS_EXISTS),
    ('Qcow2TestCase', 'test_cache_base_dir_exists', BOTH, COUNTS_EXISTS),
    ('Qcow2TestCase', 'test_cache_image_exists', BOTH, COUNTS_EXISTS),
    ('Qcow2TestCase', 'test_cache_template_exists', BOTH, COUNTS_EXISTS),
    ('Qcow2TestCase', 'test_create_image', BOTH, COUNTS_EXISTS_CREATE),
    ('Qcow2TestCase', 'test_create_image_too_small', BOTH,
     COUNTS_EXISTS_CREATE),
    ('Qcow2TestCase', 'test_generate_resized_backing_files', BOTH,
     COUNTS_EXISTS_CREATE),
    ('Qcow2TestCase', 'test_qcow2_exists_and_has_no_backing_file', BOTH,
     COUNTS_EXISTS_CREATE),
    ('Qcow2TestCase', 'test_prealloc_image', BOTH, NOVA_FALLOCATE),
    ('Qcow2TestCase', 'test_prealloc_image_without_write_access', BOTH,
     NOVA_FALLOCATE),
    ('BackendTestCase', 'test_image_flat_preallocate_images', BOTH,
     NOVA_PREALLOCATE_ATTR),
    ('BackendTestCase', 'test_image_qcow2_preallocate_images', BOTH,
     NOVA_PREALLOCATE_ATTR),
]

base.conformance_cases(
    globals(),
    [nova_tests.FlatTestCase, nova_tests.Qcow2TestCase,
     nova_tests.BackendTestCase],
    excluded=EXCLUDED)
