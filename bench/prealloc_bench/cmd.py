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

"""``prealloc-bench``: what each preallocation mode costs and gains on
this host and filesystem.

Disks are made by the plugin's own image backend (layout from
diskplan.make_plan), by nova's in-tree one and as raw files (fallocated,
zero-written, sparse), side by side in one directory, and measured with
QEMU's own tools and timers, every disk opened the same way; see
the prealloc_bench package. Exit status: 0 when every case ran (figures that
cannot be measured here are not shown, each with the reason), 1 when one
failed or the run was stopped (the first Ctrl-C or SIGTERM, see
prealloc_backend.system.stopping: the running tool is killed, the workloads
done so far are reported), 2 when the run could not start. Targets missed do
not change it: they are findings, read them in the report or in
``--json``.

Who runs what: everything runs as the user who started the command, and
works by path. Run by root, it starts only in a directory nobody else can
change (root's, as is every directory above it, none writable by another
user; checks/owner.refusal_as_root), so nova's instances_path, the default,
is refused with the command to run instead: the same run as the nova user
(``sudo -u nova prealloc-bench``), which measures the filesystem
nova-compute writes to with nova's own rights. The --json and --plot files
are written as that same user.
"""

import argparse
import dataclasses
import logging
import os
import shutil
import sys
import warnings

from oslo_utils import units

from prealloc_backend.cmd import check
from prealloc_backend.system import stopping

COMMAND = 'prealloc-bench'
SUMMARY = ('Measure what each preallocation mode costs and gains on this '
           'host and filesystem.')
DEFAULT_DIRS = ('/var/lib/nova/instances',)
TOOLS = ('qemu-img', 'qemu-io', 'filefrag')


def add_arguments(parser):
    parser.add_argument(
        '--dir', metavar='PATH',
        help='Directory on the filesystem to measure (a scratch directory '
             'is made in it and removed after). Default: '
             '/var/lib/nova/instances when it exists, else the current '
             'directory. The default run needs about 5 GiB free there. '
             'Run as root, only a directory root owns, as it owns every '
             'directory above it, none writable by another user; to '
             'measure nova\'s instances_path, run as the nova user (sudo '
             '-u nova).')
    parser.add_argument(
        '--json', metavar='FILE',
        help='Also write every figure, sample and target as JSON to FILE.')
    parser.add_argument(
        '--plot', metavar='FILE',
        help='Also draw a PNG bar chart to FILE (needs matplotlib: the '
             'plot extra, prealloc-backend-bench[plot]).')
    parser.add_argument(
        '--quick', action='store_true',
        help='Small disks (256 MiB written, 1 GiB for the 4 KiB writes '
             'into new clusters, 1 TiB read and created) and '
             'small counts, the opt-in cluster sizes in one workload only: '
             'proves the command works in a few minutes on 2 CPUs; its '
             'figures are indicative only. The default run takes about '
             '17 minutes there.')
    parser.add_argument(
        '--reps', type=int, metavar='N',
        help='Repetitions (each runs every variant, interleaved; ratios are '
             'paired within a repetition). Default: 3.')
    parser.add_argument(
        '--write-size', type=_size, metavar='SIZE',
        help='Virtual size of the disks the first-write workloads write, '
             'and of the random data in their backing file (e.g. 512M, '
             '4G). Default: 2G (--quick: 256M, and 1G for the 4 KiB writes '
             'into new clusters).')
    parser.add_argument(
        '--only', metavar='NAME[,NAME...]',
        help='Run only these workloads (names as printed in brackets, '
             'e.g. new-cluster-write,create).')
    parser.add_argument(
        '--guest', action='store_true',
        help='Also boot a tiny guest on each disk and time its O_DIRECT '
             'writes: KVM where /dev/kvm is offered, TCG only where it is '
             'not (a host that offers KVM but cannot boot the guest under '
             'it gets no in-guest figures, and the report says why). Needs '
             'qemu-system-x86 and a guest kernel (.ci/libvirt-up fetches '
             'one).')


def _size(text):
    """'512M' -> 536870912: cmd.check.parse_size (a whole number of bytes,
    binary suffixes K, M, G, T), a multiple of 1 MiB.
    """
    value = check.parse_size(text)
    if value < units.Mi or value % units.Mi:
        raise argparse.ArgumentTypeError(
            '%s: must be a whole number of MiB, at least 1M' % text.strip())
    return value


def build_parser():
    parser = argparse.ArgumentParser(prog=COMMAND, description=SUMMARY)
    add_arguments(parser)
    return parser


def main(argv=None):
    """The console script ``prealloc-bench``."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return run(args)


def _directory(args):
    if args.dir:
        return args.dir
    for candidate in DEFAULT_DIRS:
        if os.path.isdir(candidate):
            return candidate
    return os.getcwd()


def _preflight(directory):
    """None when the run can start, else why it cannot."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return ('%s not found: install qemu-utils (qemu-img, qemu-io) and '
                'e2fsprogs (filefrag)' % ', '.join(missing))
    from prealloc_backend.checks import owner
    reason = owner.refusal_as_root(directory, COMMAND)
    if reason:
        return reason
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        return 'cannot use %s: %s' % (directory, exc)
    from prealloc_bench import tools
    reason = tools.check_direct_io(directory)
    if reason:
        return ('%s cannot be measured with cache=none (%s): choose '
                'another --dir' % (directory, reason))
    return None


def _progress(message):
    print('bench: %s' % message, file=sys.stderr, flush=True)


def run(args):
    # NOTE(eventlet): importing nova pulls in eventlet, which warns about its
    # own deprecation; that says nothing about the benchmark.
    warnings.filterwarnings('ignore', message=r'\s*Eventlet is deprecated')
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format='%(levelname)s %(name)s: %(message)s')
    from prealloc_bench import plot
    if args.plot:
        message = plot.missing()
        if message:
            print(COMMAND + ': %s' % message, file=sys.stderr)
            return 2
    # By its real path: a symlink on the way is looked up once, here.
    directory = os.path.realpath(_directory(args))
    reason = _preflight(directory)
    if reason:
        print(COMMAND + ': %s' % reason, file=sys.stderr)
        return 2

    from prealloc_backend import conf
    from prealloc_bench import engine
    from prealloc_bench import report
    from prealloc_bench import workloads

    # nova's CONF with its defaults and the plugin's, no nova.conf: the
    # benchmark shows the defaults; the run sets what each variant needs.
    conf.CONF([], project='nova', default_config_files=[],
              default_config_dirs=[])
    workloads.load_extensions()
    if args.guest:
        from prealloc_bench import guest_writes
        workloads.register(guest_writes.GuestWrites)
    config = engine.QUICK if args.quick else engine.DEFAULT
    if args.reps is not None:
        if args.reps < 1:
            print(COMMAND + ': --reps must be at least 1',
                  file=sys.stderr)
            return 2
        config = dataclasses.replace(config, reps=args.reps)
    if args.write_size:
        config = dataclasses.replace(
            config, write_disk=args.write_size, write_base=args.write_size,
            seq_bytes=args.write_size, new_cluster_disk=args.write_size,
            dense_disk=min(config.dense_disk, args.write_size))
    chosen = workloads.instances()
    if args.only:
        names = [n.strip() for n in args.only.split(',') if n.strip()]
        unknown = sorted(set(names) - {w.name for w in chosen})
        if unknown:
            print(COMMAND + ': unknown workload(s) %s; known: '
                  '%s' % (', '.join(unknown),
                          ', '.join(w.name for w in chosen)),
                  file=sys.stderr)
            return 2
        chosen = [w for w in chosen if w.name in names]
    # The first SIGINT or SIGTERM stops the run: the running tool is
    # killed, the loop stops between two steps (engine.Bench.run) and the
    # workloads done so far are reported.
    stopping.install_test_hooks()
    with stopping.on_signals() as stop:
        # The disks are the benchmark's own, in its scratch directory: the
        # plugin's and nova's privsep entrypoints run in this process for
        # the time of the run (their argument checks included), no daemon.
        with engine.Bench(directory, config, progress=_progress,
                          privsep_in_process=True) as bench:
            result = bench.run(chosen)
        _write_report(args, result, stop)
    if stop.requested and not result.get('interrupted'):
        # The signal came while the report was written: it was written
        # whole (this takes a moment, no tool runs); say so, and the
        # JSON too.
        result['interrupted'] = (
            'stopped by %s while the report was written: every workload '
            'is in this report' % stopping.signal_name(stop.signum))
        _progress(result['interrupted'])
        sys.stdout.write('INTERRUPTED: %s\n' % result['interrupted'])
        sys.stdout.flush()
        if args.json:
            report.write_json(result, args.json)
    return 1 if report.has_errors(result) else 0


def _write_report(args, result, stop):
    from prealloc_bench import plot
    from prealloc_bench import report
    report.finalize(result)
    sys.stdout.write(report.render(result))
    sys.stdout.flush()
    stopping.pause_point('report')
    if args.json:
        report.write_json(result, args.json)
        _progress('JSON written to %s' % args.json)
    if args.plot and not stop.requested:
        plot.render(result, args.plot)
        _progress('chart written to %s' % args.plot)


if __name__ == '__main__':
    sys.exit(main())
