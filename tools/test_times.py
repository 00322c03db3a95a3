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

"""Recorded test durations, given to stestr before a run.

stestr deals a run's tests to its workers by the durations its repository
holds (``.stestr/times.dbm``: the longest first, each to the worker with
the least so far; tests it has no time for, in turn, after them). A fresh
clone has none, and tools/run-tests clears the repository;
``tools/test-times.txt`` keeps the seconds of the tests that take a second
or more, and run-tests puts them in the fresh repository before the first
tier (doc/source/contributor/testing.rst).

    python3 tools/test_times.py seed FILE [TOP]
        make TOP/.stestr (TOP: the current directory), which must not
        exist, a repository holding FILE's times and no run
    python3 tools/test_times.py save [TOP] > FILE
        the times of TOP/.stestr's repository: the tiers' tests of a
        second or more, the longest first. Only after a whole run of
        README's test line as root with every tier run: stestr keeps the
        time of a skipped or failed test too, and a test no tier ran
        keeps the seeded one

Only the standard library: run-tests runs it before any virtualenv with
stestr exists. stestr's file repository keeps its times in ``dbm.dumb``
(stestr/repository/file.py), keyed by the test id without its
``[attributes]``, the value the seconds as text.
"""

import argparse
import dbm.dumb
import os
import sys

# Shorter tests are many and alike (the unit tier's): dealt in turn, they
# balance anyway.
MIN_SECONDS = 1.0
# The tiers' test ids (the cloud tier's Tempest tests are dealt by
# tools/tempest_workers.py, from tools/tempest-times.txt).
PREFIXES = ('tests.', 'prealloc_bench.')
HEADER = '''\
# The seconds of each test of a second or more, from a whole run of
# README's test line (tools/test_times.py: run-tests gives them to
# stestr, which deals the tests to its workers by them). After one:
#   python3 tools/test_times.py save > tools/test-times.txt
'''


def read(path):
    times = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith('#'):
                continue
            try:
                # A scenario's id may hold spaces: "test(json list)".
                seconds, test_id = line.split(None, 1)
                times[test_id] = float(seconds)
            except ValueError:
                sys.exit('%s:%d: %r is not "SECONDS TEST_ID"'
                         % (path, number, line))
    return times


def seed(args):
    times = read(args.file)
    base = os.path.join(args.top, '.stestr')
    if os.path.lexists(base):
        sys.exit('%s exists: seed makes a new repository only' % base)
    # As stestr's RepositoryFactory.initialise: format 1, no run yet.
    os.mkdir(base)
    with open(os.path.join(base, 'format'), 'w') as f:
        f.write('1\n')
    with open(os.path.join(base, 'next-stream'), 'w') as f:
        f.write('0\n')
    db = dbm.dumb.open(os.path.join(base, 'times.dbm'), 'c')
    try:
        for test_id, seconds in times.items():
            db[test_id] = repr(seconds)
    finally:
        db.close()
    print('test_times: %d recorded durations given to stestr (%s)'
          % (len(times), args.file))


def save(args):
    db = dbm.dumb.open(os.path.join(args.top, '.stestr', 'times.dbm'), 'r')
    try:
        times = [(float(db[key]), key.decode()) for key in db.keys()]
    finally:
        db.close()
    times = [(seconds, test_id) for seconds, test_id in times
             if seconds >= MIN_SECONDS and test_id.startswith(PREFIXES)]
    print(HEADER, end='')
    times = [(round(seconds, 1), test_id) for seconds, test_id in times]
    for seconds, test_id in sorted(times, key=lambda t: (-t[0], t[1])):
        print('%.1f %s' % (seconds, test_id))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = parser.add_subparsers(dest='command', required=True)
    p = sub.add_parser('seed')
    p.add_argument('file')
    p.add_argument('top', nargs='?', default='.')
    p.set_defaults(func=seed)
    p = sub.add_parser('save')
    p.add_argument('top', nargs='?', default='.')
    p.set_defaults(func=save)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == '__main__':
    main()
