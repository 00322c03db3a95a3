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

"""nova-api validates the ``prealloc:`` flavor extra specs.

nova's real API (WSGI application, policy, API database) runs in this
process; the plugin's validators are loaded by nova from the installed
``nova.api.extra_spec_validators`` entry point, as on an API host where the
plugin is installed. Only flavors are involved, so no other service is
started.
"""

import json
import os
import sys

from nova import test
from nova.tests import fixtures as nova_fixtures
from nova.tests.functional.api import client as api_client

from prealloc_backend.planner import modes

ALLOWED = 'none, metadata, space, full'


class FlavorAPITestCase(test.TestCase):
    """nova's API alone, with a flavor, at ``microversion``."""

    microversion = None

    def setUp(self):
        super().setUp()
        # NOTE(nova): a wheel-installed nova keeps api-paste.ini under the
        # environment's etc/, not beside the package where nova's test base
        # looks for it.
        self.flags(api_paste_config=os.path.join(
            sys.prefix, 'etc', 'nova', 'api-paste.ini'), group='wsgi')
        self.useFixture(nova_fixtures.RealPolicyFixture())
        api_fixture = self.useFixture(
            nova_fixtures.OSAPIFixture(api_version='v2.1'))
        self.api = api_fixture.admin_api
        self.api.microversion = self.microversion
        self.flavor_id = self.api.post_flavor(
            {'flavor': {'name': 'm1.prealloc', 'ram': 512, 'vcpus': 1,
                        'disk': 1}})['id']


class FlavorExtraSpecsAPITest(FlavorAPITestCase):
    """At microversion 2.86, from which nova validates extra specs."""

    microversion = '2.86'

    def assert_bad_request(self, func, *args):
        exc = self.assertRaises(api_client.OpenStackApiException, func,
                                self.flavor_id, *args)
        self.assertEqual(400, exc.response.status_code)
        return json.loads(exc.response.text)['badRequest']['message']

    def test_good_values_accepted(self):
        for value in ALLOWED.split(', '):
            self.api.post_extra_spec(
                self.flavor_id, {'extra_specs': {modes.FLAVOR_MODE_KEY:
                                                 value}})
            self.assertEqual(
                {modes.FLAVOR_MODE_KEY: value},
                self.api.get_extra_spec(self.flavor_id,
                                        modes.FLAVOR_MODE_KEY))
        # The single-key form (openstack flavor set --property does this).
        self.api.put_extra_spec(self.flavor_id, modes.FLAVOR_MODE_KEY,
                                {modes.FLAVOR_MODE_KEY: 'metadata'})
        self.assertEqual({modes.FLAVOR_MODE_KEY: 'metadata'},
                         self.api.get_extra_specs(self.flavor_id))

    def test_bad_value_refused_naming_allowed_values(self):
        for value in ('bogus', 'falloc', 'Space', ''):
            message = self.assert_bad_request(
                self.api.post_extra_spec,
                {'extra_specs': {modes.FLAVOR_MODE_KEY: value}})
            self.assertIn("'%s'" % value, message)
            self.assertIn(ALLOWED, message)
        message = self.assert_bad_request(
            self.api.put_extra_spec, modes.FLAVOR_MODE_KEY,
            {modes.FLAVOR_MODE_KEY: 'thick'})
        self.assertIn("'thick' is not one of: %s" % ALLOWED, message)
        # Nothing was stored.
        self.assertEqual({}, self.api.get_extra_specs(self.flavor_id))

    def test_unknown_key_refused_naming_allowed_keys(self):
        for key in ('prealloc:mdoe', 'prealloc:clustersize', 'prealloc:'):
            message = self.assert_bad_request(
                self.api.post_extra_spec,
                {'extra_specs': {key: 'space'}})
            self.assertIn("'%s'" % key, message)
            self.assertIn('allowed keys are %s, prealloc:cluster_size'
                          % modes.FLAVOR_MODE_KEY, message)
            self.assertIn(ALLOWED, message)
        # One bad key refuses the whole request.
        self.assert_bad_request(
            self.api.post_extra_spec,
            {'extra_specs': {modes.FLAVOR_MODE_KEY: 'space',
                             'prealloc:extended_l2': 'off'}})
        self.assertEqual({}, self.api.get_extra_specs(self.flavor_id))

    def test_other_namespaces_unaffected(self):
        specs = {'hw:cpu_policy': 'dedicated', 'foo:prealloc': 'bar',
                 'preallocate:mode': 'anything', modes.FLAVOR_MODE_KEY: 'full'}
        self.api.post_extra_spec(self.flavor_id, {'extra_specs': specs})
        self.assertEqual(specs, self.api.get_extra_specs(self.flavor_id))
        # nova's own validation still applies to its namespaces.
        self.assert_bad_request(self.api.post_extra_spec,
                                {'extra_specs': {'hw:cpu_policy': 'full'}})


class FlavorExtraSpecsLatestAPITest(FlavorExtraSpecsAPITest):
    microversion = 'latest'


class FlavorExtraSpecsBefore286APITest(FlavorAPITestCase):
    """Before 2.86 nova validates no extra spec: a compute host running the
    plugin refuses such a value at spawn (InvalidFlavorPolicy) instead.
    """

    microversion = '2.85'

    def test_not_validated(self):
        specs = {modes.FLAVOR_MODE_KEY: 'bogus', 'prealloc:mdoe': 'space'}
        self.api.post_extra_spec(self.flavor_id, {'extra_specs': specs})
        self.assertEqual(specs, self.api.get_extra_specs(self.flavor_id))
