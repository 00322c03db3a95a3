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

"""``prealloc-backend adopt``: bring existing disks to the host's policy.

This module is the command line: its arguments, the progress lines of a
running copy and the report (one line per disk, the exit status); the work
is prealloc_backend.adoption.instances.

Run on a compute host, as root, with nova-compute's configuration::

    prealloc-backend adopt --config-file /etc/nova/nova.conf \\
        (--instance UUID ... | --all) [--dry-run] [--max-rate MIB_S]

For each instance of this host (``[DEFAULT] host``), as nova's records say
(through nova-conductor, as nova-compute reads them), its qcow2 overlays
whose layout or reservation differ from what the plugin makes today in the
instance's mode (its flavor's ``prealloc:mode`` or the host's) are rewritten:
a running guest's live (prealloc_backend.adoption.live), a stopped
instance's offline (qcow2.relayout_overlay). Disks at policy are left alone.

Coordination with nova: an instance is claimed by setting its task_state
to ``prealloc_adopting`` with nova's own compare-and-swap
(``instance.save(expected_task_state=[None])``), which is how nova's
operations exclude each other: an instance in any task state is skipped,
and while it is claimed nova's API refuses every action that needs no task
state (resize, migrations, snapshot, shelve, rebuild, reboot, stop, volume
attach; delete is still allowed and ends the adoption with the guest on a
complete disk). The task state is put back to None at the end, and by the
next run after a kill.

Only one adopt runs per host (a lock in instances_path, waited for
recovery.LOCK_WAIT seconds at most: nova-compute's start holds it while
it recovers). At its start it finishes or undoes whatever a killed run
left (live.recover) and clears the task states it left.

After connecting to libvirtd and nova's message bus it becomes the owner of
instances_path (the nova user): every file it makes, renames or removes,
it does as that user, never as root.

Only disks that nova's records say are qcow2 overlays are adopted: nova's
disk.info and the domain's ``<driver type>`` both qcow2, the header (read
within a fixed prefix) agreeing, the virtual size libvirt's, the flavor's
where it gives one (instances.recorded_overlay: a raw disk's guest can
write a qcow2 header). A running guest's copy that does not come into
step within its bounds (``--stall-timeout``, live.CopyLimits) is undone.

Exit status: 0 every disk asked about is at policy; 1 some were left as
they were (``--dry-run``: would be adopted; refused for room, busy, paused,
not an overlay by nova's records, a copy that did not come into step); 2
an adoption failed (the guest on its original disk); 130 or 143 stopped by
SIGINT or SIGTERM before every disk was looked at (the disk being copied
stays on its original, unless the signal came once its guest was paused
for the pivot: the pivot completes and its line says adopted); 255 an
error of the command itself.
"""

import functools
import math
import os
import sys
import time
import traceback

from prealloc_backend.adoption import instances
from prealloc_backend.adoption import live
from prealloc_backend.adoption import recovery
from prealloc_backend.checks import owner
from prealloc_backend.cmd import check as check_cmd
from prealloc_backend import conf as pb_conf
from prealloc_backend.system import stopping

CONF = pb_conf.CONF

ERROR_EXIT = 255


def add_arguments(parser):
    check_cmd_args = parser.add_argument_group('nova configuration')
    check_cmd_args.add_argument(
        '--config-file', action='append', default=[], metavar='PATH',
        help='A configuration file nova-compute reads (repeatable).')
    check_cmd_args.add_argument(
        '--config-dir', action='append', default=[], metavar='DIR',
        help='A directory of *.conf files nova-compute reads.')
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument('--instance', action='append', metavar='UUID',
                       help='An instance of this host (repeatable).')
    which.add_argument('--all', action='store_true',
                       help='Every instance of this host.')
    parser.add_argument('--dry-run', action='store_true',
                        help='Say what would be done; change nothing '
                             '(a killed run\'s leftovers are only '
                             'reported).')
    parser.add_argument('--max-rate', type=_rate, metavar='MIB_S',
                        help='Copy at most this many MiB/s per disk (a '
                             'running guest\'s block copy; default: '
                             'unlimited).')
    parser.add_argument('--stall-timeout', type=_seconds, metavar='SECONDS',
                        default=live.STALL_TIMEOUT,
                        help='Give up (and undo) a running guest\'s copy '
                             'when the bytes it has left to copy make no '
                             'new low for this long (default %%(default)s), '
                             'or once it has copied %d times what it had to '
                             'copy at its start.' % live.COPY_FACTOR)
    parser.add_argument('--verbose', action='store_true',
                        help='Print the log lines of the plugin and nova.')


# libvirt's bandwidth is an unsigned long long of bytes/s.
MAX_RATE = 2 ** 63 - 1


def _rate(text):
    try:
        value = float(text) * 1024 * 1024
    except ValueError:
        value = -1
    if not (math.isfinite(value) and 1 <= value <= MAX_RATE):
        raise check_cmd.SizeError(
            '--max-rate %r: a number of MiB/s, at least 1 byte/s and at '
            'most %d bytes/s' % (text, MAX_RATE))
    return int(value)


# --stall-timeout's bounds, in seconds.
MIN_STALL = 1
MAX_STALL = 7 * 24 * 3600


def _seconds(text):
    try:
        value = float(text)
    except ValueError:
        value = -1
    if not (math.isfinite(value) and MIN_STALL <= value <= MAX_STALL):
        raise check_cmd.SizeError(
            '--stall-timeout %r: a number of seconds from %d to %d'
            % (text, MIN_STALL, MAX_STALL))
    return value


class Report:
    """What happened, one line per disk, and the exit status."""

    def __init__(self, out=None):
        self.out = out or sys.stdout
        self.status = 0

    def say(self, text):
        self.out.write(text + '\n')
        self.out.flush()

    def left(self, text):
        self.say(text)
        self.status = max(self.status, 1)

    def failed(self, text):
        self.say(text)
        self.status = max(self.status, 2)


def progress_printer(report, uuid):
    """The callback of instance ``uuid``'s running copies: a line of
    ``report`` a second at most, and the last.
    """
    state = {'last': 0.0, 'first': None}

    def show(p):
        now = time.monotonic()
        if state['first'] is None:
            state['first'] = (now, p.copied)
        if now - state['last'] < 1 and not (p.ready and p.copied == p.total):
            return
        state['last'] = now
        t0, c0 = state['first']
        rate = (p.copied - c0) / (now - t0) if now > t0 else 0
        pct = 100.0 * p.copied / p.total if p.total else 100.0
        report.say('instance %s %s: %5.1f%% (%.1f of %.1f MiB) %.1f MiB/s%s'
                   % (uuid, p.dev, pct, p.copied / 2**20, p.total / 2**20,
                      rate / 2**20, ', in step' if p.ready else ''))
    return show


def _connect_nova():
    from nova.conductor import rpcapi as conductor_rpcapi
    from nova import context as nova_context
    from nova import objects
    from nova.objects import base as objects_base
    from nova import rpc
    objects.register_all()
    rpc.init(CONF)
    objects_base.NovaObject.indirection_api = conductor_rpcapi.ConductorAPI()
    return nova_context.get_admin_context()


def _become_owner():
    """Become the owner of instances_path (the nova user) for good. Root
    never works there: a root-owned instances_path is refused, as the
    plugin's daemon refuses it.
    """
    fd = owner.open_directory(CONF.instances_path)
    try:
        creds = owner.credentials_for(fd, CONF.instances_path)
    finally:
        os.close(fd)
    if creds is not None:
        owner.drop_to(creds)
    elif os.geteuid() == 0:
        raise owner.UnsafeDirectory(
            'instances_path %s is root\'s: adopt works there as its owner '
            '(the nova user), never as root; give it to the nova user '
            '(prealloc-backend check, Instances path)'
            % CONF.instances_path)


def _run(args):
    import libvirt
    from nova import rpc
    # nova's exchange, as nova.config.parse_args sets it for its services.
    rpc.set_defaults(control_exchange='nova')
    check_cmd.load_config(CONF, args.config_file, args.config_dir)
    context = _connect_nova()
    conn = libvirt.open(CONF.libvirt.connection_uri or 'qemu:///system')
    _become_owner()
    stopping.install_test_hooks()
    report = Report()
    with stopping.on_signals() as stop:
        try:
            instances.adopt(
                context, conn, report, uuids=args.instance,
                dry_run=args.dry_run, bandwidth=args.max_rate, stop=stop,
                stall=args.stall_timeout,
                progress=functools.partial(progress_printer, report))
        except stopping.Stopped:
            # While it waited for the host's lock: nothing was done.
            pass
    if stop.requested:
        return stopping.exit_status(stop.signum)
    return report.status


def run(args):
    check_cmd.setup_logging(args.verbose)
    try:
        return _run(args)
    except (check_cmd.ConfigLoadError, recovery.AlreadyRunning,
            owner.UnsafeDirectory) as exc:
        print('Error: %s' % exc)
        return ERROR_EXIT
    except Exception:
        print('Error:\n%s' % traceback.format_exc())
        return ERROR_EXIT
