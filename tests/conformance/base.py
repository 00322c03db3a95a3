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

"""Run nova 34's own test classes with the plugin's classes in nova's place.

Each test module of this tier imports one of nova's test modules (installed
with the nova wheel: ``nova/tests/...``) and calls ``conformance_cases`` on
the nova test classes it takes. For each class and each mode in MODES that
makes one subclass, ``<NovaClass>_<mode>``, which before nova's own
``setUp`` runs:

* puts the plugin's classes where nova's code and nova's test look them
  up by name (``PluginInPlace``): ``nova.virt.libvirt.imagebackend.
  Backend``/``Flat``/``Qcow2`` and, for tests that start a compute service,
  ``nova.virt.libvirt.LibvirtDriver`` (what ``compute_driver =
  libvirt.LibvirtDriver`` loads) and ``nova.virt.libvirt.driver.
  LibvirtDriver``. Because this happens before nova's setUp and tests run,
  every patch nova's test makes by dotted path (``MonkeyPatch('nova.virt.
  libvirt.imagebackend.Qcow2.create_image', ...)``, ``MockPatch('nova.virt.
  libvirt.driver.LibvirtDriver._create_image')``) lands on the class that
  is in place, the plugin's, exactly as it would if the plugin's classes
  were nova's. Patches nova's test module makes at import time
  (``@mock.patch.object(imagebackend.Qcow2, ...)`` decorators) hold nova's
  class: they still apply to the plugin's subclass unless the plugin
  overrides that method;
* sets ``[DEFAULT] preallocate_images`` to the class's mode (the plugin's
  own ``[prealloc_backend] mode`` stays unset, so the host mode is nova's
  option, as the plugin documents);
* runs the plugin's privsep entrypoints in this process (nova's harness
  makes any privsep helper start fail, PrivsepNoHelperFixture; nova's own
  PrivsepFixture does the same for nova's context) and forgets the
  plugin's per-filesystem probe results before and after the test.

A nova test the plugin fails on purpose (it asserts on an implementation
detail the plugin changes, such as nova's ``fallocate -n`` step) is listed
with its reason in the module's EXCLUDED list and reported as skipped with
that reason; ``conformance_cases`` refuses an exclusion naming a test that
nova's class does not have, so that the list cannot go stale silently.
"""

import os
import sys
import unittest

import fixtures
from nova.virt import driver as nova_virt_driver

from prealloc_backend.adapter import backend
from prealloc_backend.adapter import driver
from prealloc_backend import conf
from prealloc_backend.disk import fsprobe
import prealloc_backend.privsep

CONF = conf.CONF
_load_compute_driver = nova_virt_driver.load_compute_driver

# The plugin's modes this tier runs nova's tests in: nova's two values of
# [DEFAULT] preallocate_images.
MODES = ('none', 'space')
# Polls (0.5 s apart) of nova's state and migration waits here: 60 s.
WAIT_POLLS = 120
ALL_MODES = MODES

IMAGE_CLASSES = {
    'nova.virt.libvirt.imagebackend.Backend': backend.Backend,
    'nova.virt.libvirt.imagebackend.Flat': backend.Flat,
    'nova.virt.libvirt.imagebackend.Qcow2': backend.Qcow2,
}
DRIVER_CLASSES = {
    # What nova's compute_driver = libvirt.LibvirtDriver loads
    # (importutils.import_object('nova.virt.libvirt.LibvirtDriver')).
    'nova.virt.libvirt.LibvirtDriver': driver.LibvirtDriver,
    # What nova's tests and nova's own code name.
    'nova.virt.libvirt.driver.LibvirtDriver': driver.LibvirtDriver,
}


class PluginInPlace(fixtures.Fixture):
    """The plugin's image backend (and driver) where nova's are looked up."""

    def __init__(self, images=True, compute_driver=False):
        super().__init__()
        self.images = images
        self.compute_driver = compute_driver
        # Every compute driver nova loaded while this fixture was in place.
        self.loaded_drivers = []

    def _record_load(self, virtapi, compute_driver=None):
        loaded = _load_compute_driver(virtapi, compute_driver)
        self.loaded_drivers.append(loaded)
        return loaded

    def _setUp(self):
        targets = {}
        if self.images:
            targets.update(IMAGE_CLASSES)
        if self.compute_driver:
            targets.update(DRIVER_CLASSES)
        for name, cls in targets.items():
            self.useFixture(fixtures.MonkeyPatch(name, cls))
        if self.compute_driver:
            self.useFixture(fixtures.MonkeyPatch(
                'nova.virt.driver.load_compute_driver', self._record_load))
        # The plugin's entrypoints in this process, as nova's
        # PrivsepFixture does for nova's context (tests.fixtures.
        # PrivsepInProcess would also switch nova's context, which nova's
        # tests leave to the daemon-less PrivsepNoHelperFixture).
        ctx = prealloc_backend.privsep.ctx
        ctx.set_client_mode(False)
        self.addCleanup(ctx.set_client_mode, True)
        fsprobe.forget()
        self.addCleanup(fsprobe.forget)


class PluginInPlaceMixin:
    """Put before a nova test class: the plugin's classes in place, in one
    preallocation mode (set by conformance_cases).
    """

    prealloc_mode = None
    substitute_driver = False
    # The nova test starts compute services: check that each ran the
    # plugin's driver.
    starts_computes = False

    def setUp(self):
        # Before nova's setUp: it, and the services some of nova's setUps
        # start, must find the plugin's classes and the mode.
        in_place = self.useFixture(PluginInPlace(
            images=True, compute_driver=self.substitute_driver))
        # nova's TestCase.flags (CONF.set_override; its ConfFixture resets
        # every override after the test, as for nova's own flags() calls
        # made before setUp, e.g. in ServersTestBase).
        CONF.set_override('preallocate_images', self.prealloc_mode)
        CONF.set_override('mode', None, group='prealloc_backend')
        # NOTE(nova): a wheel-installed nova keeps api-paste.ini under the
        # environment's etc/, not beside the package where nova's test
        # base looks for it (only functional tests read it).
        CONF.set_override('api_paste_config', os.path.join(
            sys.prefix, 'etc', 'nova', 'api-paste.ini'), group='wsgi')
        super().setUp()
        # Meta-check: nova's setUp kept the mode this class runs in.
        self.assertEqual(self.prealloc_mode, CONF.preallocate_images)
        # ... and the plugin's classes are still where nova looks them up
        # (nova's image backend tests take theirs in setUp: image_class).
        for name, cls in IMAGE_CLASSES.items():
            module, _, attr = name.rpartition('.')
            self.assertIs(cls, getattr(sys.modules[module], attr), name)
        image_class = getattr(self, 'image_class', None)
        if image_class is not None:
            self.assertIn(image_class, (backend.Flat, backend.Qcow2))
        if self.starts_computes:
            # Registered once nova's setUp passed (a test that skips in its
            # setUp starts nothing), run after the test.
            self.addCleanup(self._check_plugin_drivers, in_place)

    # NOTE(nova): nova's waits poll 10 times, 0.5 s apart (5 s), sized for
    # nova's CI workers; a 2-vCPU machine running two test workers can
    # take longer to reach a state. Only the default is raised (a wait a
    # test sized itself keeps its own), and only how long to wait: what
    # is waited for and asserted stays nova's.
    def _wait_for_server_parameter(self, server, expected_params,
                                   max_retries=None, **kwargs):
        return super()._wait_for_server_parameter(
            server, expected_params,
            max_retries=WAIT_POLLS if max_retries is None else max_retries,
            **kwargs)

    def _wait_for_state_change(self, server, expected_status,
                               max_retries=None, **kwargs):
        # nova's passes its own default (10) on to the method above.
        return super()._wait_for_state_change(
            server, expected_status,
            max_retries=WAIT_POLLS if max_retries is None else max_retries,
            **kwargs)

    def _wait_for_migration_status(self, server, expected_statuses):
        # nova's has no retry count: up to WAIT_POLLS / 10 of its waits.
        for _ in range(WAIT_POLLS // 10 - 1):
            try:
                return super()._wait_for_migration_status(
                    server, expected_statuses)
            except self.failureException:
                continue
        return super()._wait_for_migration_status(server, expected_statuses)

    def _check_plugin_drivers(self, in_place):
        """Meta-check: the test started compute services, and each one ran
        the plugin's driver (not nova's, whatever the test configured).
        """
        if not in_place.loaded_drivers:
            raise AssertionError('no compute driver was loaded: the plugin '
                                 'was not exercised')
        for loaded in in_place.loaded_drivers:
            if not isinstance(loaded, driver.LibvirtDriver):
                raise AssertionError('compute driver %r is not the plugin\'s'
                                     % loaded)


def _skipped_test(why, reason):
    @unittest.skip('%s: %s' % (why, reason))
    def test(self):
        pass
    return test


EXCLUDED_WHY = 'excluded from conformance'
LEFT_OUT_WHY = 'left out of the conformance tier for time'


def conformance_cases(namespace, nova_cases, excluded=(), left_out=(),
                      modes=MODES, substitute_driver=False,
                      starts_computes=False):
    """Add ``<NovaClass>_<mode>`` to ``namespace`` for each nova test class
    of ``nova_cases`` and each mode of ``modes``.

    ``excluded``: (nova class name, test name, modes, reason) tuples of
    tests the plugin fails on purpose; ``left_out``: the same for tests
    not run to keep the tier's time. Each is replaced by a skip naming its
    reason in those modes.
    """
    skips = ([(c, t, m, _skipped_test(EXCLUDED_WHY, r))
              for c, t, m, r in excluded] +
             [(c, t, m, _skipped_test(LEFT_OUT_WHY, r))
              for c, t, m, r in left_out])
    by_class = {cls.__name__: cls for cls in nova_cases}
    for cls_name, test_name, ex_modes, reason in (list(excluded) +
                                                  list(left_out)):
        nova_case = by_class.get(cls_name)
        if nova_case is None or not hasattr(nova_case, test_name):
            raise AssertionError(
                'EXCLUDED names %s.%s, which is not a test of the nova '
                'classes this module runs' % (cls_name, test_name))
        if not reason or set(ex_modes) - set(modes):
            raise AssertionError('EXCLUDED %s.%s: give a reason and modes '
                                 'among %s' % (cls_name, test_name, modes))
    made = []
    for nova_case in nova_cases:
        for mode in modes:
            attrs = {
                '__module__': namespace['__name__'],
                '__doc__': '%s.%s with the plugin in place, mode %s.' % (
                    nova_case.__module__, nova_case.__name__, mode),
                'prealloc_mode': mode,
                'substitute_driver': substitute_driver,
                'starts_computes': starts_computes,
            }
            for cls_name, test_name, ex_modes, skipped in skips:
                if cls_name == nova_case.__name__ and mode in ex_modes:
                    attrs[test_name] = skipped
            name = '%s_%s' % (nova_case.__name__, mode)
            case = type(name, (PluginInPlaceMixin, nova_case), attrs)
            namespace[name] = case
            made.append(case)
    return made
