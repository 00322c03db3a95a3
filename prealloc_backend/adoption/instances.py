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

"""The adoption of this host's instances: ``prealloc-backend adopt``'s work.

``adopt`` runs the command's work with nova's objects and a libvirt
connection ready: under the host's adopt lock (recovery.host_lock), what a
killed run left recovered first (recovery.recover_all) and its claims
cleared, then each instance asked about (``adopt_instance``):

* its disks chosen from the records (``candidate_disks``): the domain's
  file disks nova made in the instance's directory from its image cache,
  each an overlay only if nova's and libvirt's records say so
  (``recorded_overlay``; exception.NotRecordedOverlay otherwise, the disk
  left as it is);
* each judged against the instance's mode (planner.adoption.verdict), the
  room the earlier ones take counted;
* the instance claimed (``claim``: nova's compare-and-swap on its
  task_state) and read again, each disk read again, then adopted
  (``adopt_disk``): a running guest's live (live.make_target, then
  live.adopt_running), a stopped instance's offline
  (qcow2.relayout_overlay, journalled by live.begin_offline); the claim
  released at the end (recovery.release), unless something of an
  interruption is left beside its disks.

What happened is said through ``report`` (the command's: ``say(text)``,
``left(text)`` for a disk left as it was, ``failed(text)`` for a failure;
cmd/adopt.py turns them into its exit status) and a running copy's
progress through ``progress(uuid)``'s callback. A stop request (``stop``,
a stopping.Stop) ends the run between disks and cancels a running copy.

Everything here runs as the caller: the command runs it as the owner of
instances_path (the nova user), never as root.
"""

import dataclasses
import functools
import os
import signal
import time

from oslo_log import log as logging
from oslo_utils import units

from prealloc_backend.adoption import live
from prealloc_backend.adoption import recovery
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
    raises exception.NotRecordedOverlay, naming the disk and the records.
    """
    disk_info = os.path.join(os.path.dirname(path), 'disk.info')
    recorded = formats.disk_info_format(disk_info, path)
    if recorded != 'qcow2' or domain_fmt != 'qcow2':
        if recorded == domain_fmt == 'raw':
            what = 'a raw disk'
        else:
            what = 'not a qcow2 overlay by nova\'s records'
        raise exception.NotRecordedOverlay(
            path=path, reason='%s (%s says %s, the domain\'s <driver type> '
                              '%s): adopt rewrites qcow2 overlays only' % (
                                  what, disk_info,
                                  recorded or 'nothing of it',
                                  domain_fmt or 'is not given'))
    header = formats.header_format(path)
    if header != 'qcow2':
        raise exception.NotRecordedOverlay(
            path=path, reason='%s and the domain record qcow2, but its '
                              'header says %s' % (disk_info, header))
    checked = formats.check_qcow2_disk(path)
    info = checked.info
    capacity = domain.blockInfo(dev)[0]
    wanted = flavor_size(flavor, os.path.basename(path))
    if info.virtual_size != capacity or wanted not in (None, capacity):
        raise exception.NotRecordedOverlay(
            path=path, reason='its sizes disagree: libvirt\'s block info '
                              'says %d bytes, its header %d%s'
                              % (capacity, info.virtual_size,
                                 ', its flavor %d' % wanted if wanted
                                 else ''))
    return checked, qcow2.existing_from(path, info)


def claim(instance):
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


def adopt_instance(context, conn, instance, report, dry_run=False,
                   bandwidth=None, stop=None, stall=live.STALL_TIMEOUT,
                   limits=None, progress=None):
    """Adopt the disks of one nova Instance of this host, on ``conn`` (a
    recovery.Connection). ``progress(uuid)``, when given, returns the
    callback of the instance's running copies (live.Progress).
    """
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
    if not claim(instance):
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
            adopt_disk(domain, running, uuid, dev, path, checked, facts,
                       verdict, report, bandwidth, stop,
                       reconnect=functools.partial(conn.lookup, uuid),
                       limits=limits or live.CopyLimits(stall=stall,
                                                        rate=bandwidth),
                       progress=progress(uuid) if progress else None)
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


def adopt_disk(domain, running, uuid, dev, path, checked, facts, verdict,
               report, bandwidth, stop, reconnect=None, limits=None,
               progress=None):
    """Adopt the overlay ``path`` (the domain's ``dev``: its Checked, its
    ExistingDisk ``facts``, its ``verdict``): offline when the domain is
    not ``running``, else live, with a copy's ``limits`` and
    ``bandwidth``; ``reconnect()`` returns the domain on a new connection
    (libvirtd restarted), ``progress`` gets the copy's live.Progress.
    """
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
            domain, dev, path, new, bandwidth=bandwidth, progress=progress,
            cancelled=functools.partial(_requested, stop),
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


def _requested(stop):
    return stop is not None and stop.requested


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


def adopt(context, conn, report, uuids=None, dry_run=False,
          bandwidth=None, stop=None, stall=live.STALL_TIMEOUT, limits=None,
          progress=None):
    """The command's work, with nova's objects and a libvirt connection
    ready (opened again when libvirtd restarts): the instances ``uuids``
    of this host (all of them: None), said through ``report``, which is
    returned.
    """
    from nova import exception as nova_exception
    from nova import objects
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
                               stop=stop, stall=stall, limits=limits,
                               progress=progress)
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
