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

"""Unit tier: no root, no daemon, no loop mount; ``tox -e py3``.

Real files and real qemu-img in this process; tests that start a Python
importing nova are in tests/integration, tests that need root in
tests/privileged. Its prerequisites (qemu-utils, util-linux, e2fsprogs)
are checked once, when the tier is loaded: see tests/prereq.py.
"""

from tests import prereq


def load_tests(loader, standard_tests, pattern):
    return prereq.load_tier(__name__, loader, standard_tests, pattern)
