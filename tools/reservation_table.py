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

"""The reservation table of a Tempest run on the one-box cloud.

The plugin's reservation tests (the walk, evacuation, a guest's TRIM,
adoption: prealloc_backend_tempest_plugin) append one JSON line per step a
disk went through to ``[prealloc] reservation_record``
(``CLOUD_DIR/log/reservation.jsonl``, which ``tools/cloud-tempest`` empties
before Tempest and prints with this script after it). Each line: the
step, the host and its QEMU, the host's mode, the disk's virtual size, its
allocated bytes (st_blocks), its unwritten bytes (filefrag) and what
``prealloc-backend report`` says of it there (its mode, allocated bytes,
whether it is at its policy). "all blocks" says whether the disk holds a
block for every byte of its virtual size, whatever its mode (a disk of
mode metadata need not).

    python3 tools/reservation_table.py FILE

prints them as a reStructuredText table, in the order the tests recorded
them, grouped by test: the table doc/source/admin/migrations.rst shows.
Standard library only (run by the machine's Python).
"""

import json
import sys

MiB = 1024 ** 2

COLUMNS = ('test', 'step', 'host (QEMU)', 'host mode', 'disk mode',
           'virtual MiB', 'allocated MiB', 'unwritten MiB', 'all blocks',
           'report: at policy')


def _mib(value):
    return '' if value is None else '%d' % (int(value) // MiB)


def reserved(row):
    """Whether the disk holds a block for every byte of its virtual size
    (st_blocks), whatever its mode ("?" without the figures).
    """
    allocated, virtual = row.get('allocated'), row.get('virtual')
    if allocated is None or virtual is None:
        return '?'
    return 'yes' if allocated >= virtual else 'no'


def cells(row):
    """The table's cells of one recorded step."""
    # PreallocReservationWalkTest.test_... -> ReservationWalk
    test = row.get('test', '').split('.', 1)[0]
    test = test[len('Prealloc'):] if test.startswith('Prealloc') else test
    test = test[:-len('Test')] if test.endswith('Test') else test
    if row.get('walk'):
        test = '%s (from %s)' % (test, row['walk'])
    at_policy = row.get('report_at_policy')
    return (test, row.get('step', ''),
            '%s (%s)' % (row.get('host', ''), row.get('qemu') or '?'),
            row.get('host_mode', ''), row.get('report_mode') or '',
            _mib(row.get('virtual')), _mib(row.get('allocated')),
            _mib(row.get('unwritten')),
            reserved(row),
            '' if at_policy is None else ('yes' if at_policy else 'no'))


def table(rows):
    """A reStructuredText simple table of ``rows`` (cells())."""
    body = [cells(r) for r in rows]
    widths = [max([len(c)] + [len(b[i]) for b in body])
              for i, c in enumerate(COLUMNS)]
    rule = '  '.join('=' * w for w in widths)

    def line(values):
        return '  '.join(v.ljust(w) for v, w in zip(values, widths)).rstrip()

    return '\n'.join([rule, line(COLUMNS), rule] + [line(b) for b in body] +
                     [rule])


def grouped(rows):
    """``rows`` grouped by test (two Tempest workers interleave them), each
    test's steps in their order, the tests in the order they first
    recorded.
    """
    first = {}
    for i, row in enumerate(rows):
        first.setdefault((row.get('test'), row.get('walk')), i)
    return sorted(rows, key=lambda r: first[(r.get('test'), r.get('walk'))])


def read(path):
    rows = []
    with open(path) as f:
        for number, text in enumerate(f, 1):
            text = text.strip()
            if not text:
                continue
            try:
                rows.append(json.loads(text))
            except ValueError as e:
                raise SystemExit('%s:%d: not a JSON line (%s): %r'
                                 % (path, number, e, text[:200]))
    return rows


def main(argv):
    if len(argv) != 2:
        raise SystemExit('usage: %s FILE (a reservation record)' % argv[0])
    rows = grouped(read(argv[1]))
    if not rows:
        print('no reservation recorded in %s' % argv[1])
        return 0
    print(table(rows))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
