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

"""sizes.human: the one byte formatter of the check and the benchmark."""

from oslo_utils import units

from prealloc_backend import sizes
from tests import base


class TestHuman(base.TestCase):

    def test_sizes(self):
        for value, text in ((None, '-'), (0, '0 B'), (1023, '1023 B'),
                            (units.Ki, '1 KiB'), (1536, '1.5 KiB'),
                            (196 * units.Ki, '196 KiB'),
                            (units.Mi, '1 MiB'),
                            (3 * units.Gi // 2, '1.5 GiB'),
                            (units.Gi, '1 GiB'), (12 * units.Gi, '12 GiB'),
                            (int(12.4 * units.Gi), '12 GiB'),
                            (int(9.96 * units.Gi), '10 GiB'),
                            (20 * units.Gi, '20 GiB'),
                            (5 * units.Ti // 2, '2.5 TiB'),
                            (units.Ti, '1 TiB'), (2048 * units.Ti,
                                                  '2048 TiB')):
            self.assertEqual(text, sizes.human(value), value)

    def test_negative(self):
        # A difference (say, space reserved minus space expected).
        self.assertEqual('-1.5 GiB', sizes.human(-3 * units.Gi // 2))
        self.assertEqual('-12 GiB', sizes.human(int(-12.4 * units.Gi)))
        self.assertEqual('-5 B', sizes.human(-5))
