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

"""prealloc_backend/checks/result.py: a check's verdict as
oslo.upgradecheck reads it, with its fix and facts.
"""

from oslo_upgradecheck import upgradecheck
from oslotest import base

from prealloc_backend.checks import result


class ResultTestCase(base.BaseTestCase):

    def test_constructors(self):
        ok = result.success('fine', free=3)
        self.assertIsInstance(ok, upgradecheck.Result)
        self.assertEqual(
            (upgradecheck.Code.SUCCESS, 'fine', None, {'free': 3}),
            (ok.code, ok.details, ok.fix, ok.facts))
        warn = result.warning('hmm', 'do this')
        self.assertEqual((upgradecheck.Code.WARNING, 'do this', {}),
                         (warn.code, warn.fix, warn.facts))
        fail = result.failure('bad', 'fix it', path='/x')
        self.assertEqual((upgradecheck.Code.FAILURE, 'fix it', {'path': '/x'}),
                         (fail.code, fail.fix, fail.facts))

    def test_facts_are_not_shared(self):
        a, b = result.success('a'), result.success('b')
        a.facts['x'] = 1
        self.assertEqual({}, b.facts)
