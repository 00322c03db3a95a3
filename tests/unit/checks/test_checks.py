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

"""prealloc_backend/checks/__init__.py: CHECKS, the report's order, names
one function of each concern module, each run on a real host's nova.conf.
"""

import importlib
import os
import pkgutil

from oslo_upgradecheck import upgradecheck

from prealloc_backend import checks
from tests import base

# Modules of the package that hold no check of their own.
HELPERS = {'host', 'owner', 'result'}


class ChecksTestCase(base.CheckTestCase):

    def test_every_concern_module_is_in_the_report(self):
        names = {name for _f, name, _p in pkgutil.iter_modules(
            [os.path.dirname(checks.__file__)])}
        used = {func.__module__.rsplit('.', 1)[1]
                for _title, func in checks.CHECKS}
        self.assertEqual(names - HELPERS, used)
        titles = [title for title, _func in checks.CHECKS]
        self.assertEqual(len(titles), len(set(titles)))
        for _title, func in checks.CHECKS:
            module = importlib.import_module(func.__module__)
            self.assertIs(func, getattr(module, func.__name__))
            self.assertTrue(func.__name__.startswith('check_'), func)

    def test_each_check_gives_a_result(self):
        host = self.check_host(self.nova_conf())
        for title, func in checks.CHECKS:
            res = func(host)
            self.assertIsInstance(res, upgradecheck.Result, title)
            self.assertIn(res.code, (upgradecheck.Code.SUCCESS,
                                     upgradecheck.Code.WARNING,
                                     upgradecheck.Code.FAILURE), title)
            self.assertTrue(res.details, title)
