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
where it gives one (recorded_overlay: a raw disk's guest can write a
qcow2 header). A running guest's copy that does not come into step within
its bounds (``--stall-timeout``, live.CopyLimits) is undone.

Exit status: 0 every disk asked about is at policy; 1 some were left as
they were (``--dry-run``: would be adopted; refused for room, busy, paused,
not an overlay by nova's records, a copy that did not come into step); 2
an adoption failed (the guest on its original disk); 130 or 143 stopped by
SIGINT or SIGTERM before every disk was looked at (the disk being copied
stays on its original, unless the signal came once its guest was paused
for the pivot: the pivot completes and its line says adopted); 255 an
error of the command itself.
"""

import dataclasses
import logging
import math
import os
import signal
import sys
import time
import traceback

from oslo_utils import units

from prealloc_backend.adoption import live
from prealloc_backend.adoption import recovery
from prealloc_backend.checks import owner
from prealloc_backend.cmd import check as check_cmd
from prealloc_backend import conf as pb_conf
from prealloc_backend.disk import formats
from prealloc_backend.disk import fsprobe
from prealloc_backend.disk import qcow2
from prealloc_backend.disk import qemu
from prealloc_backend import exception
from prealloc_backend.planner import adoption
from prealloc_backend.planner import modes
from prealloc_backend.system import stopping

LOG = logging.getLogger(__name__)
CONF = pb_conf.CONF

TASK_STATE = recovery.TASK_STATE
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


def instance_dir(uuid):
    return os.path.join(CONF.instances_path, uuid)


def candidate_disks(domain, uuid):
    """[(dev, path, format)] of the domain's file disks nova made in the
    instance's directory from its image cache (disk, disk.local,
    disk.eph*, disk.swap), with the format the domain gives QEMU (its
    ``<driver type>``).
    """
    directory = os.path.realpath(instance_dir(uuid))
    found = []
    for dev, (path, fmt) in sorted(live.disk_records(domain).items()):
        name = os.path.basename(path)
        if os.path.dirname(os.path.realpath(path)) != directory:
            continue
        if adoption.is_nova_disk(name):
            found.append((dev, path, fmt))
    return found


class NotRecordedOverlay(Exception):
    """nova's and libvirt's records do not make the disk a qcow2 overlay
    of the size they give it: it is left as it is.
    """


def flavor_size(flavor, name):
    """The size in bytes the flavor gives nova's disk ``name``: the root
    disk's root_gb; None where it gives none (root_gb 0: the image's size)
    or where the disk may have another (a swap or ephemeral block device
    mapping sizes its own disk.swap, disk.local or disk.eph*, and a resize
    to a larger ephemeral_gb leaves disk.local at its size).
    """
    if name != 'disk':
        return None
    value = getattr(flavor, 'root_gb', None) or 0
    return value * units.Gi if value > 0 else None


def recorded_overlay(domain, dev, path, domain_fmt, flavor):
    """(Checked, ExistingDisk) of the overlay at ``path``, the domain's
    disk ``dev`` which the domain gives QEMU as ``domain_fmt``, from
    nova's and libvirt's records, never from its header alone.

    NOTE: a disk's format comes from nova's records: a raw disk's first
    bytes are its guest's, who can write there a qcow2 header naming a
    file of the image cache (``../_base/swap_64``) as its backing file and
    any virtual size. Such a disk, rewritten as the overlay its header
    describes, would lose its data. So nova's disk.info and the domain's
    ``<driver type>`` must both say qcow2; the header, read within
    formats.HEADER_PREFIX, is only checked against them; the virtual size
    is libvirt's (its block info: QEMU's own for a running guest) and must
    be the header's, and the root disk's the flavor's root_gb where it
    gives one (flavor_size); the disk is then checked as the plugin checks
    every qcow2 disk it opens (formats.check_qcow2_disk). Anything else
    raises NotRecordedOverlay, naming the disk and the records.
    """
    disk_info = os.path.join(os.path.dirname(path), 'disk.info')
    recorded = formats.disk_info_format(disk_info, path)
    if recorded != 'qcow2' or domain_fmt != 'qcow2':
        if recorded == domain_fmt == 'raw':
            what = 'a raw disk'
        else:
            what = 'not a qcow2 overlay by nova\'s records'
        raise NotRecordedOverlay(
            '%s: %s (%s says %s, the domain\'s <driver type> %s): adopt '
            'rewrites qcow2 overlays only' % (
                path, what, disk_info, recorded or 'nothing of it',
                domain_fmt or 'is not given'))
    header = formats.header_format(path)
    if header != 'qcow2':
        raise NotRecordedOverlay(
            '%s: %s and the domain record qcow2, but its header says %s'
            % (path, disk_info, header))
    checked = formats.check_qcow2_disk(path)
    info = checked.info
    capacity = domain.blockInfo(dev)[0]
    wanted = flavor_size(flavor, os.path.basename(path))
    if info.virtual_size != capacity or wanted not in (None, capacity):
        raise NotRecordedOverlay(
            '%s: its sizes disagree: libvirt\'s block info says %d bytes, '
            'its header %d%s' % (path, capacity, info.virtual_size,
                                 ', its flavor %d' % wanted if wanted
                                 else ''))
    return checked, qcow2.existing_from(path, info)


def _claim(instance):
    """Claim the instance (nova's compare-and-swap on task_state), and
    read it again: its host and state are checked from that read. False
    when it is busy or gone.
    """
    from nova import exception as nova_exception
    instance.task_state = TASK_STATE
    try:
        instance.save(expected_task_state=[None])
        instance.refresh()
    except nova_exception.UnexpectedTaskStateError:
        try:
            instance.refresh()
        except nova_exception.InstanceNotFound:
            pass
        return False
    except nova_exception.InstanceNotFound:
        return False
    return True


def _progress_printer(report, uuid):
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


def adopt_instance(context, conn, instance, report, dry_run=False,
                   bandwidth=None, stop=None, stall=live.STALL_TIMEOUT,
                   limits=None):
    """Adopt the disks of one nova Instance of this host."""
    from nova.compute import vm_states
    uuid = instance.uuid
    if instance.host != CONF.host:
        report.left('instance %s: on host %s, not this one (%s): left '
                    'alone' % (uuid, instance.host, CONF.host))
        return
    if instance.task_state is not None:
        report.left('instance %s: task_state %s: busy, left alone'
                    % (uuid, instance.task_state))
        return
    if instance.vm_state not in (vm_states.ACTIVE, vm_states.STOPPED):
        report.left('instance %s: vm_state %s: only active and stopped '
                    'instances are adopted' % (uuid, instance.vm_state))
        return
    domain = conn.lookup(uuid)
    if domain is None:
        report.left('instance %s: no libvirt domain on this host' % uuid)
        return
    host_mode = modes.host_mode(CONF)
    extra_specs = instance.flavor.extra_specs
    mode = modes.disk_mode(extra_specs, host_mode)
    todo = []
    # What the disks judged before take (an instance's disks share its
    # directory's filesystem): each replacement is judged against the room
    # the earlier ones leave.
    committed = 0
    for dev, path, domain_fmt in candidate_disks(domain, uuid):
        try:
            checked, facts = recorded_overlay(domain, dev, path, domain_fmt,
                                              instance.flavor)
        except Exception as exc:
            report.left('instance %s %s: %s: left as it is'
                        % (uuid, dev, exc))
            continue
        if checked.backing is None:
            report.left('instance %s %s: %s has no backing file: left '
                        'alone' % (uuid, dev, path))
            continue
        fs = fsprobe.facts(os.path.dirname(path))
        fs = dataclasses.replace(fs, free_bytes=fs.free_bytes - committed)
        verdict = adoption.verdict(CONF.prealloc_backend, extra_specs, mode,
                                   facts, fs, path=path)
        if verdict.at_policy:
            report.say('instance %s %s: %s' % (uuid, dev, verdict.reason))
        elif verdict.refused:
            report.left('instance %s %s: not adopted: %s'
                        % (uuid, dev, verdict.reason))
        elif dry_run:
            # Not at policy, and left so: exit status 1.
            report.left('instance %s %s: would adopt %s (%s)'
                        % (uuid, dev, path, verdict.reason))
            committed += verdict.needed
        else:
            todo.append((dev, path, checked, facts, verdict))
            committed += verdict.needed
            report.say('instance %s %s: adopting %s (%s)'
                       % (uuid, dev, path, verdict.reason))
    if not todo:
        return
    if not _claim(instance):
        report.left('instance %s: task_state %s: busy, left alone'
                    % (uuid, instance.task_state))
        return
    try:
        running = domain.isActive()
        if instance.host != CONF.host:
            report.left('instance %s: moved to host %s meanwhile: left '
                        'alone' % (uuid, instance.host))
            return
        if instance.vm_state not in (vm_states.ACTIVE, vm_states.STOPPED):
            report.left('instance %s: vm_state %s meanwhile: left alone'
                        % (uuid, instance.vm_state))
            return
        if running != (instance.vm_state == vm_states.ACTIVE):
            report.left('instance %s: vm_state %s but its domain is %s: '
                        'left alone' % (uuid, instance.vm_state,
                                        'running' if running else
                                        'not running'))
            return
        for dev, path, checked, facts, verdict in todo:
            if stop is not None and stop.requested:
                raise stopping.Stopped(stop.signum)
            # Judged before the claim: read again now that nova can no
            # longer change it (a rebuild or a resize in between).
            try:
                again = recorded_overlay(domain, dev, path,
                                         live.disk_records(domain).get(
                                             dev, (None, None))[1],
                                         instance.flavor)
            except Exception as exc:
                report.left('instance %s %s: %s: left as it is'
                            % (uuid, dev, exc))
                continue
            if (again[0].backing, again[1].virtual_size) != (
                    checked.backing, facts.virtual_size):
                report.left('instance %s %s: %s changed before it was '
                            'claimed: left as it is' % (uuid, dev, path))
                continue
            _adopt_disk(domain, running, uuid, dev, path, checked, facts,
                        verdict, report, bandwidth, stop,
                        reconnect=lambda: conn.lookup(uuid),
                        limits=limits or live.CopyLimits(stall=stall,
                                                         rate=bandwidth))
            # After a restart of libvirtd the next disk needs a live one.
            domain = conn.lookup(uuid)
            if domain is None:
                report.failed('instance %s: its libvirt domain is gone: '
                              'its other disks left alone' % uuid)
                return
    finally:
        if recovery.leftovers(CONF.instances_path, uuid):
            report.failed('instance %s: task_state %s kept: an interrupted '
                          'adoption is left beside its disks; run adopt '
                          'again' % (uuid, TASK_STATE))
        else:
            recovery.release(instance)


def _adopt_disk(domain, running, uuid, dev, path, checked, facts, verdict,
                report, bandwidth, stop, reconnect=None, limits=None):
    before = facts.allocated_bytes
    plan = verdict.plan
    timeout = CONF.prealloc_backend.allocation_timeout or None
    start = time.monotonic()
    if not running:
        # The journal marks the rewrite's temporary file for recover after
        # a kill; on an error relayout_overlay removes that file itself.
        live.begin_offline(path)
        try:
            done = qcow2.relayout_overlay(path, checked.backing,
                                          checked.backing_fmt, plan,
                                          timeout=timeout)
        finally:
            live.end_offline(path)
        if not done:
            report.left('instance %s %s: not rewritten (its backing file '
                        'name has a comma): left as it is' % (uuid, dev))
            return
        report.say('instance %s %s: rewritten offline in %.1f s; %d -> %d '
                   'bytes allocated' % (uuid, dev, time.monotonic() - start,
                                        before,
                                        os.stat(path).st_blocks * 512))
        return
    new = live.make_target(path, checked.backing, checked.backing_fmt,
                           facts.virtual_size, plan, timeout=timeout)
    try:
        paused = live.adopt_running(
            domain, dev, path, new, bandwidth=bandwidth,
            progress=_progress_printer(report, uuid),
            cancelled=lambda: stop is not None and stop.requested,
            reconnect=reconnect, limits=limits)
    except live.NotConverging as exc:
        # Left as it was, for a known reason, as a busy instance is.
        report.left('instance %s %s: not adopted: %s' % (uuid, dev, exc))
        return
    except live.Cancelled:
        report.left('instance %s %s: cancelled: the guest stays on its '
                    'original disk' % (uuid, dev))
        raise stopping.Stopped(stop.signum if stop and stop.signum
                               else signal.SIGINT)
    except live.AdoptionFailed as exc:
        report.failed('instance %s %s: %s' % (uuid, dev, exc))
        return
    report.say('instance %s %s: adopted live in %.1f s (guest paused %.3f s '
               'at the pivot); %d -> %d bytes allocated%s'
               % (uuid, dev, time.monotonic() - start, paused, before,
                  os.stat(path).st_blocks * 512, _zeroed_note(path, plan)))


def _zeroed_note(path, plan):
    """What the copy did to ranges the guest had zeroed, where the mode
    reserves: QEMU 7.2's mirror writes them as zero clusters without a
    host cluster (doc/source/admin/adopting.rst, Measured); '' when none
    did, or when it cannot be read.
    """
    if not adoption.reserves(plan):
        return ''
    try:
        lost = qemu.zeroed_without_cluster(path)
    except exception.PreallocError as exc:
        LOG.warning('%s: qemu-img map: %s', path, exc)
        return ''
    if not lost:
        return ''
    return ('; %d bytes the guest had zeroed came across as zero clusters '
            'without their host cluster (this QEMU\'s block copy): the file '
            'keeps its blocks, the reservation holds, and qcow2 gives them '
            'to the next clusters it allocates' % lost)


def adopt(context, conn, uuids=None, dry_run=False, bandwidth=None,
          stop=None, report=None, stall=live.STALL_TIMEOUT, limits=None):
    """The command's work, with nova's objects and a libvirt connection
    ready (opened again when libvirtd restarts): returns the Report.
    """
    from nova import exception as nova_exception
    from nova import objects
    report = report or Report()
    conn = recovery.Connection(conn)
    lock = recovery.host_lock(CONF.instances_path, CONF.host,
                              wait=recovery.LOCK_WAIT, stop=stop)
    try:
        if dry_run:
            for path in recovery.leftovers(CONF.instances_path):
                report.left('%s: left by an interrupted adoption (the next '
                            'run recovers it)' % path)
        else:
            unrecovered = recovery.recover_all(
                conn.get(), CONF.instances_path, report.say, report.failed)
            recovery.release_stale_claims(context, CONF.host,
                                          CONF.instances_path, report.say)
            if not unrecovered:
                # nova-compute's start, waiting for this lock, need not.
                recovery.mark_recovered(CONF.instances_path, CONF.host)
        if uuids:
            instances = []
            for uuid in uuids:
                try:
                    instances.append(objects.Instance.get_by_uuid(
                        context, uuid, expected_attrs=['flavor']))
                except nova_exception.InstanceNotFound:
                    report.left('instance %s: not found' % uuid)
        else:
            instances = objects.InstanceList.get_by_host(
                context, CONF.host, expected_attrs=['flavor'])
        for instance in instances:
            if stop is not None and stop.requested:
                break
            if recovery.leftovers(CONF.instances_path, instance.uuid):
                report.left('instance %s: an interrupted adoption is left '
                            'beside its disks: left alone' % instance.uuid)
                continue
            try:
                adopt_instance(context, conn, instance, report,
                               dry_run=dry_run, bandwidth=bandwidth,
                               stop=stop, stall=stall, limits=limits)
            except stopping.Stopped:
                break
            except Exception as exc:
                LOG.exception('adopting instance %s', instance.uuid)
                report.failed('instance %s: %s' % (instance.uuid, exc))
            if conn.gone:
                report.failed('libvirtd is gone: the other instances left '
                              'alone (%s)' % conn.gone)
                break
    finally:
        os.close(lock)
    return report


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
    with stopping.on_signals() as stop:
        try:
            report = adopt(context, conn, uuids=args.instance,
                           dry_run=args.dry_run, bandwidth=args.max_rate,
                           stop=stop, stall=args.stall_timeout)
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
