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

# NOTE(nova): as nova's own test packages do, decide the concurrency mode
# before anything imports eventlet (tests/__init__.py, the plugin's test
# kit, does it).
# autopep8: off
import tests  # noqa
# autopep8: on

"""The benchmark's unit tests, in its own distribution (bench/).

``tox -e bench`` runs them (``tools/run-tests`` after the unit tier), from
the top of the repository: the disks they measure are made through the
plugin's real backends, with the plugin's test kit (``tests/base.py``,
``tests/fixtures.py``), as an out-of-tree nova plugin's tests use nova's.
Its prerequisites are the unit tier's (tests/prereq.py).
"""

from tests import prereq


def load_tests(loader, standard_tests, pattern):
    return prereq.load_tier(__name__, loader, standard_tests, pattern)
