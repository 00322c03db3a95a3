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

"""Byte counts as people read them: one formatter for every message.

prealloc-backend check (its details and fixes) and the benchmark (its
report, chart and refusals) print sizes through human(). oslo.utils has
the other direction (strutils.string_to_bytes) but no formatter.
"""

from oslo_utils import units

_UNITS = (('TiB', units.Ti), ('GiB', units.Gi), ('MiB', units.Mi),
          ('KiB', units.Ki))


def human(nbytes):
    """Powers of 1024, at most two significant figures below 10 units.

    1536 -> '1.5 KiB', 2 ** 30 -> '1 GiB', 12.4 GiB -> '12 GiB', 1023 ->
    '1023 B'; None (not measured) -> '-'.
    """
    if nbytes is None:
        return '-'
    for unit, size in _UNITS:
        if abs(nbytes) >= size:
            number = nbytes / size
            text = ('%.1f' % number) if abs(number) < 10 else ('%.0f' % number)
            if text.endswith('.0'):
                text = text[:-2]
            return '%s %s' % (text, unit)
    return '%d B' % nbytes
