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

"""The ``prealloc`` extra spec validators, as nova-api loads and runs them.

nova.api.validation.extra_specs.validators loads every validator of the
installed ``nova.api.extra_spec_validators`` entry points when imported;
the tests call its ``validate()``, which is what the flavor extra specs API
calls from microversion 2.86 on.
"""

import re

from nova.api.validation.extra_specs import validators
from nova import exception as nova_exception
from oslotest import base
from stevedore import extension

from prealloc_backend.adapter import extra_specs
from prealloc_backend import conf
from prealloc_backend.planner import modes
from prealloc_backend.planner import qcow2_layout


class TestEntryPoint(base.BaseTestCase):

    def test_loaded_by_name_like_nova_api(self):
        mgr = extension.ExtensionManager('nova.api.extra_spec_validators',
                                         invoke_on_load=False)
        self.assertIn('prealloc', mgr.names())
        self.assertIs(extra_specs, mgr['prealloc'].plugin)

    def test_nova_registered_the_namespace(self):
        self.assertIn('prealloc', validators.NAMESPACES)
        self.assertIs(extra_specs.mode_validator,
                      validators.VALIDATORS[modes.FLAVOR_MODE_KEY])


class TestModeValues(base.BaseTestCase):

    def test_allowed_values_are_the_modes(self):
        self.assertEqual([m.value for m in modes.Mode],
                         extra_specs.mode_validator.value['enum'])
        self.assertEqual(['none', 'metadata', 'space', 'full'],
                         extra_specs.mode_validator.value['enum'])

    def test_every_accepted_value_is_a_mode_the_backend_applies(self):
        for value in extra_specs.mode_validator.value['enum']:
            validators.validate(modes.FLAVOR_MODE_KEY, value)
            self.assertEqual(
                modes.Mode(value),
                modes.disk_mode({modes.FLAVOR_MODE_KEY: value},
                                modes.host_mode(conf.CONF)))

    def test_bad_values_refused_naming_allowed_values(self):
        for value in ('bogus', 'falloc', '', 'space ', 'SPACE', '1'):
            exc = self.assertRaises(nova_exception.ValidationError,
                                    validators.validate,
                                    modes.FLAVOR_MODE_KEY, value)
            self.assertEqual(400, exc.code)
            self.assertIn("'%s'" % value, str(exc))
            self.assertIn('none, metadata, space, full', str(exc))


class TestClusterSizeValues(base.BaseTestCase):

    def test_every_accepted_value_is_a_size_the_plan_uses(self):
        self.assertEqual(['64K', '128K', '256K', '512K', '1M', '2M'],
                         extra_specs.cluster_size_validator.value['enum'])
        opts = conf.CONF.prealloc_backend
        for value in extra_specs.cluster_size_validator.value['enum']:
            validators.validate(qcow2_layout.FLAVOR_CLUSTER_KEY, value)
            self.assertEqual(
                qcow2_layout.CLUSTER_SIZES[value],
                qcow2_layout.chosen_cluster_size(
                    opts, {qcow2_layout.FLAVOR_CLUSTER_KEY: value}))

    def test_bad_values_refused_naming_allowed_values(self):
        for value in ('auto', '32K', '4M', '65536', ''):
            exc = self.assertRaises(nova_exception.ValidationError,
                                    validators.validate,
                                    qcow2_layout.FLAVOR_CLUSTER_KEY, value)
            self.assertEqual(400, exc.code)
            self.assertIn('64K, 128K, 256K, 512K, 1M, 2M', str(exc))


class TestUnknownKeys(base.BaseTestCase):

    def test_unknown_keys_in_namespace_refused_naming_known_keys(self):
        for key in ('prealloc:mdoe', 'prealloc:cluster', 'prealloc:',
                    'prealloc:mode2', 'prealloc:mode:x', 'prealloc:xmode'):
            exc = self.assertRaises(nova_exception.ValidationError,
                                    validators.validate, key, 'space')
            self.assertEqual(400, exc.code)
            self.assertIn("'%s'" % key, str(exc))
            self.assertIn('allowed keys are prealloc:mode, '
                          'prealloc:cluster_size', str(exc))
            self.assertIn('none, metadata, space, full', str(exc))

    def test_catch_all_does_not_claim_known_keys(self):
        # Whatever order nova tries the patterns in.
        for key in (modes.FLAVOR_MODE_KEY, qcow2_layout.FLAVOR_CLUSTER_KEY):
            self.assertIsNone(re.fullmatch(
                extra_specs.unknown_key_validator.name_regex, key))
        self.assertIsNotNone(re.fullmatch(
            extra_specs.unknown_key_validator.name_regex, 'prealloc:other'))

    def test_other_namespaces_unaffected(self):
        # Foreign, unregistered namespace and keys without a namespace pass.
        validators.validate('preallocate:mode', 'anything')
        validators.validate('foo:prealloc', 'bar')
        validators.validate('prealloc', 'bar')
        # nova's own namespaces keep nova's verdicts.
        validators.validate('hw:cpu_policy', 'dedicated')
        self.assertRaises(nova_exception.ValidationError,
                          validators.validate, 'hw:cpu_policy', 'space')

    def test_register_returns_validators(self):
        registered = extra_specs.register()
        self.assertEqual([modes.FLAVOR_MODE_KEY,
                          qcow2_layout.FLAVOR_CLUSTER_KEY,
                          'prealloc:{key}'],
                         [v.name for v in registered])
        for validator in registered:
            self.assertTrue(validator.description)
