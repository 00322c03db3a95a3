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

"""Integration tier: the plugin's processes end to end; ``tox -e
integration``.

Each test starts a fresh Python that imports nova and the plugin, as an
operator or a host does: ``prealloc-backend check`` and ``bench`` run as
commands, the ``prealloc-nova-compute`` wrapper, the options imported in
either order, a nova-compute killed part-way through making a disk and the
spawn after it. No root, no daemon: that is tests/privileged. Slow because
every child process imports nova (seconds each on a small machine), which is
why these tests are not in the unit tier.

Its prerequisites are checked once, when the tier is loaded: see
tests/prereq.py.
"""

from tests import prereq


def load_tests(loader, standard_tests, pattern):
    return prereq.load_tier(__name__, loader, standard_tests, pattern)
