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

"""Split a Tempest selection into what runs in parallel and what runs
alone, and balance the parallel part between the workers.

Tempest runs a class marked ``@decorators.serial`` while no other class
runs (a lock every class takes), so in one run its worker first waits for
the other workers' classes to end and they wait for it; and stestr, with
no timing data (a fresh workspace: every CI run), deals the classes to the
workers in turn, alphabetically. On the cloud tier's 2 cores that made one
worker twice as long as the other. ``tools/cloud-tempest`` instead runs
the parallel classes first, dealt by their recorded durations
(``tools/tempest-times.txt``; the longest first, each to the worker with
the least so far), then the serial classes one after the other in the same
stestr run (``--combine``).

    python tempest_workers.py split --ids FILE --times FILE --workers N \\
        --out DIR
        FILE: the test ids (``tempest run --list-tests``' output, nothing
        else); writes
        DIR/parallel.txt and DIR/serial.txt (test ids, for ``--load-list``)
        and DIR/workers.yaml (``--worker-file``: each worker's classes) and
        prints each worker's expected seconds. A class is serial when
        Tempest's lock takes it as one (``is_serial_execution_requested``,
        tempest.lib.decorators.serial): run by Tempest's virtualenv, from
        Tempest's workspace.
    python tempest_workers.py times < SUBUNIT
        the seconds of each class of a run's subunit v2 stream (``stestr
        last --subunit``), the file ``--times`` reads.
"""

import argparse
import collections
import importlib
import os
import re
import sys

# A class the times file does not name (a new one): about a small class
# of the plugin's, one server or two.
DEFAULT_SECONDS = 30.0
# pkg.module.Class.test, then Tempest's [id-...,attrs] and testscenarios'
# (scenario) where present.
TEST_ID = re.compile(
    r'^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)\.(\w+)(\[[^\]]*\])?(\(.*\))?$')


def test_class(test_id):
    """The class path of a test id (``pkg.module.Class.test[attrs]``), or
    None where the line is not a test id.
    """
    match = TEST_ID.match(test_id.strip())
    return match.group(1) if match else None


def read_ids(path):
    """The test ids of ``path``, one a line (``stestr list`` prints nothing
    else): a line that is not one is an error, never a test dropped.
    """
    ids = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            if not test_class(line):
                sys.exit('%s:%d: %r is not a test id' % (path, number,
                                                          line.strip()))
            ids.append(line.strip())
    return ids


def read_times(path):
    times = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.split('#', 1)[0].strip()
            if not line:
                continue
            try:
                seconds, name = line.split()
                times[name] = float(seconds)
            except ValueError:
                sys.exit('%s:%d: %r is not "SECONDS CLASS"'
                         % (path, number, line))
    return times


def is_serial(class_path):
    module, _, name = class_path.rpartition('.')
    try:
        cls = getattr(importlib.import_module(module), name)
    except Exception as e:
        # Tempest reports the same error as the class's failure: it runs
        # with the parallel ones.
        print('tempest_workers: %s not imported (%s): run in parallel'
              % (class_path, e), file=sys.stderr)
        return False
    # What Tempest's lock asks (tempest.test.BaseTestCase).
    requested = getattr(cls, 'is_serial_execution_requested', None)
    if requested is not None:
        return bool(requested())
    return bool(getattr(cls, '_serial', False))


def deal(classes, times, workers):
    """``classes`` dealt to ``workers`` lists, the longest (by ``times``)
    first, each to the worker with the fewest expected seconds so far.
    Returns [(seconds, [class, ...]), ...].
    """
    loads = [[0.0, []] for _ in range(workers)]
    for name in sorted(classes,
                       key=lambda c: (-times.get(c, DEFAULT_SECONDS), c)):
        least = min(loads, key=lambda load: (load[0], len(load[1])))
        least[0] += times.get(name, DEFAULT_SECONDS)
        least[1].append(name)
    return [(seconds, sorted(names)) for seconds, names in loads]


def write_lines(path, lines):
    with open(path, 'w') as f:
        f.write(''.join(line + '\n' for line in lines))


def split(args):
    ids = read_ids(args.ids)
    times = read_times(args.times)
    by_class = collections.OrderedDict()
    for test_id in ids:
        by_class.setdefault(test_class(test_id), []).append(test_id)
    serial = [c for c in by_class if is_serial(c)]
    parallel = [c for c in by_class if c not in serial]
    parallel_ids = [i for c in parallel for i in by_class[c]]
    serial_ids = [i for c in serial for i in by_class[c]]
    write_lines(os.path.join(args.out, 'parallel.txt'), parallel_ids)
    write_lines(os.path.join(args.out, 'serial.txt'), serial_ids)
    dealt = deal(parallel, times, args.workers)
    # stestr's worker file: a YAML list of {worker: [regex, ...]}.
    with open(os.path.join(args.out, 'workers.yaml'), 'w') as f:
        for _seconds, names in dealt:
            if names:
                f.write('- worker:\n')
                f.writelines("  - '^%s\\.'\n" % re.escape(name)
                             for name in names)
    for number, (seconds, names) in enumerate(dealt):
        print('worker %d: %d classes, about %.0f s' %
              (number, len(names), seconds))
    print('serial: %d classes, about %.0f s (%s)' % (
        len(serial), sum(times.get(c, DEFAULT_SECONDS) for c in serial),
        ', '.join(c.rpartition('.')[2] for c in serial) or 'none'))


def class_times(args):
    import subunit
    import testtools

    seconds = collections.defaultdict(float)

    class Timer(testtools.StreamResult):
        started = {}

        def status(self, test_id=None, test_status=None, timestamp=None,
                   **kwargs):
            name = test_id and test_class(test_id)
            if not name or timestamp is None:
                return
            if test_status == 'inprogress':
                self.started[test_id] = timestamp
            elif test_id in self.started and test_status in (
                    'success', 'fail', 'skip', 'xfail', 'uxsuccess'):
                seconds[name] += (timestamp - self.started.pop(
                    test_id)).total_seconds()

    subunit.ByteStreamToStreamResult(sys.stdin.buffer).run(Timer())
    for name, total in sorted(seconds.items(), key=lambda kv: -kv[1]):
        print('%.0f %s' % (total, name))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = parser.add_subparsers(dest='command', required=True)
    p = sub.add_parser('split')
    p.add_argument('--ids', required=True)
    p.add_argument('--times', required=True)
    p.add_argument('--workers', type=int, required=True)
    p.add_argument('--out', required=True)
    p.set_defaults(func=split)
    p = sub.add_parser('times')
    p.set_defaults(func=class_times)
    args = parser.parse_args(argv)
    if args.command == 'split' and args.workers < 1:
        parser.error('--workers %d: at least 1' % args.workers)
    args.func(args)


if __name__ == '__main__':
    main()
