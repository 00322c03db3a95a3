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

"""Check qemu-img: its version, and a real extended_l2 overlay made here.

The version must know extended_l2 (QEMU 5.2), which a preallocated overlay
with a backing file needs. Then the check does, in a scratch directory in
instances_path, what the backend does for a new disk: create a small
overlay of a raw base with the plan's layout (``diskplan.make_plan`` for the
host's mode; metadata when the host's mode is none, since flavors may ask
for more), read it back with ``qemu-img info``, and grow it with the same
preallocation. The scratch directory is removed whatever happens.

Who does what: ``qemu-img --version`` runs as the caller (root). Everything
in instances_path (the scratch directory, its base and overlay, the three
qemu-img runs on them) happens in a child process working in the directory
held open (checks/owner.py): as its owner, the nova user, when root runs the
check; as root only in a root-owned directory nobody else may write to. The
child makes the scratch directory with a random name, opens it without
following symlinks, creates both files there with O_CREAT | O_EXCL |
O_NOFOLLOW relative to that descriptor, and runs qemu-img from inside it on
relative names: no name is looked up from instances_path again.
"""

import os
import re
import sys
import types

from oslo_utils import units

from prealloc_backend.checks import owner
from prealloc_backend.checks import result
from prealloc_backend.disk import qemu
from prealloc_backend import exception
from prealloc_backend.planner import diskplan
from prealloc_backend.planner import modes
from prealloc_backend.planner import qcow2_layout
from prealloc_backend import sizes

# The overlay the check creates, its base, and what it grows it to.
PROBE_BASE_BYTES = units.Mi
PROBE_OVERLAY_BYTES = 4 * units.Mi
PROBE_GROWN_BYTES = 8 * units.Mi
# Below this much free space the check does not write its overlay.
PROBE_MIN_FREE = 32 * units.Mi
# extended_l2 (QEMU 5.2) is what lets QEMU preallocate an overlay.
MIN_QEMU_VERSION = (5, 2)
# Seconds any one qemu-img run of the check may take.
TIMEOUT = 60
# Seconds the whole overlay step's child may take (its three qemu-img
# runs and the files it makes; the nova user can stop it, owner.run_in
# then kills it).
OVERLAY_DEADLINE = 4 * TIMEOUT


def qemu_img_version():
    """(first line of ``qemu-img --version``, (major, minor, micro))."""
    out = qemu.execute('--version', timeout=TIMEOUT)
    first = out.splitlines()[0] if out else ''
    match = re.search(r'version (\d+)\.(\d+)(?:\.(\d+))?', first)
    if not match:
        raise exception.QemuImgOutputError(
            cmd='qemu-img --version', reason='no version number',
            output=out[:200])
    return first.strip(), tuple(int(g or 0) for g in match.groups())


def probe_plan(host):
    """(the plan the probe overlay is made with, a note or None)."""
    note = None
    try:
        plan = host.plan(PROBE_OVERLAY_BYTES, fmt=diskplan.DiskFormat.QCOW2)
    except exception.FallocateUnsupported as exc:
        # Spawns fail in this mode (the filesystem check says so); test
        # what flavors asking metadata get.
        note = exc.format_message()
        plan = host.plan(PROBE_OVERLAY_BYTES, mode=modes.Mode.METADATA,
                         fmt=diskplan.DiskFormat.QCOW2)
    if plan.preallocation is qcow2_layout.Qcow2Preallocation.OFF:
        # Thin by the host's mode, but flavors may ask for more: test it.
        asked = host.plan(PROBE_OVERLAY_BYTES, mode=modes.Mode.METADATA,
                          fmt=diskplan.DiskFormat.QCOW2)
        if asked.preallocation is not qcow2_layout.Qcow2Preallocation.OFF:
            plan = asked
    return plan, note


def _layout(plan):
    """What qemu.create_overlay reads of a layout, from the plan."""
    return types.SimpleNamespace(
        preallocation=plan.preallocation,
        extended_l2=bool(plan.extended_l2),
        cluster_size=plan.cluster_size or qcow2_layout.QEMU_DEFAULT_CLUSTER)


SCRATCH_PREFIX = '.prealloc-check-'
BASE_NAME = 'base.raw'
OVERLAY_NAME = 'overlay.qcow2'
# Files the step makes: new, never through a symlink, never an old file.
CREATE_FLAGS = (os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC |
                os.O_RDWR)


def _no_prlimit_wrapper():
    """NOTE(oslo.concurrency): qemu.execute gives every qemu-img run prlimits,
    which oslo.concurrency's processutils.execute applies by running
    ``sys.executable -m oslo_concurrency.prlimit`` (python_exec defaults to
    sys.executable). The child has dropped to the nova user, who may not be
    allowed to run the interpreter root runs this command with (a virtualenv
    under /root): then this child's qemu-img runs go without the wrapper. They
    only read and write the two files the child just made; the limits guard
    against untrusted images.
    """
    if os.access(sys.executable, os.X_OK):
        return
    qemu.limits = lambda heavy=False: None


def _overlay_step(fd, plan_layout, directory):
    """In the child (as the owner of ``fd``, working in it): make the
    scratch directory, the base and the overlay; return the allocations.
    """
    _no_prlimit_wrapper()
    layout = types.SimpleNamespace(
        preallocation=qcow2_layout.Qcow2Preallocation(
            plan_layout['preallocation']),
        extended_l2=plan_layout['extended_l2'],
        cluster_size=plan_layout['cluster_size'])
    name = SCRATCH_PREFIX + os.urandom(8).hex()
    workdir = os.path.join(directory, name)
    os.mkdir(name, 0o700, dir_fd=fd)
    work = base = overlay = None
    try:
        work = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW |
                       os.O_CLOEXEC, dir_fd=fd)
        os.fchdir(work)
        base = os.open(BASE_NAME, CREATE_FLAGS, 0o600, dir_fd=work)
        pattern = b'prealloc-check' * (PROBE_BASE_BYTES // 14)
        os.write(base, pattern)
        os.ftruncate(base, PROBE_BASE_BYTES)
        overlay = os.open(OVERLAY_NAME, CREATE_FLAGS, 0o600, dir_fd=work)
        qemu.create_overlay(OVERLAY_NAME, PROBE_OVERLAY_BYTES, BASE_NAME,
                            'raw', layout, timeout=TIMEOUT)
        qemu.check_overlay(OVERLAY_NAME, PROBE_OVERLAY_BYTES, BASE_NAME,
                           layout)
        allocated = os.fstat(overlay).st_blocks * 512
        qemu.resize(OVERLAY_NAME, 'qcow2', PROBE_GROWN_BYTES,
                    layout.preallocation if layout.extended_l2
                    else qcow2_layout.Qcow2Preallocation.OFF, timeout=TIMEOUT)
        grown = os.fstat(overlay).st_blocks * 512
        return {'allocated_bytes': allocated,
                'grown_allocated_bytes': grown}
    except OSError as exc:
        raise exception.AllocationFailed(path=workdir, reason=str(exc))
    finally:
        for descriptor in (base, overlay):
            if descriptor is not None:
                os.close(descriptor)
        if work is not None:
            for entry in (BASE_NAME, OVERLAY_NAME):
                try:
                    os.unlink(entry, dir_fd=work)
                except FileNotFoundError:
                    pass
            os.close(work)
        try:
            os.rmdir(name, dir_fd=fd)
        except OSError:
            pass


def try_overlay(directory, plan):
    """Create, inspect and grow a small overlay in a scratch directory of
    ``directory`` made as ``plan`` says, in a child process (as the
    directory's owner when root runs this); return its allocated bytes
    before and after growing.
    """
    layout = _layout(plan)
    fd = owner.open_directory(directory)
    try:
        creds = owner.credentials_for(fd, directory)
        return owner.run_in(
            fd, directory, _overlay_step,
            {'preallocation': layout.preallocation.value,
             'extended_l2': layout.extended_l2,
             'cluster_size': layout.cluster_size}, directory, creds=creds,
            deadline=OVERLAY_DEADLINE, what='the qemu-img overlay step')
    except owner.UnsafeDirectory as exc:
        raise exception.PreallocError(str(exc))
    except owner.StepFailed as exc:
        raise exception.PreallocError(exc.message)
    finally:
        os.close(fd)


def check_qemu_img(host):
    """qemu-img knows extended_l2 and makes the plan's overlay here."""
    try:
        line, version = qemu_img_version()
    except exception.PreallocError as exc:
        return result.failure(
            'qemu-img cannot run: %s' % exc.format_message(),
            'Install qemu-img (Debian/Ubuntu: qemu-utils, RHEL: qemu-img) '
            "in nova-compute's PATH.")
    facts = {'version': '.'.join(str(v) for v in version),
             'version_line': line}
    if version[:2] < MIN_QEMU_VERSION:
        return result.failure(
            '%s: extended_l2, which preallocated overlays need, came with '
            'QEMU 5.2.' % line, 'Upgrade QEMU (nova 34 needs 6.2 anyway).',
            **facts)
    fs = host.filesystem()
    if fs['free_bytes'] < PROBE_MIN_FREE:
        return result.warning(
            '%s; no test overlay created: only %s free on the filesystem '
            'holding %s.' % (line, sizes.human(fs['free_bytes']),
                             fs['instances_path']),
            'Free space there (see the free space check) and run the check '
            'again.', **facts)
    plan, note = probe_plan(host)
    facts.update(preallocation=plan.preallocation.value,
                 extended_l2=bool(plan.extended_l2),
                 cluster_size=plan.cluster_size)
    said = ('extended_l2=%s, preallocation=%s'
            % ('on' if plan.extended_l2 else 'off', plan.preallocation.value))
    try:
        tested = try_overlay(fs['directory'], plan)
    except exception.PreallocError as exc:
        return result.failure(
            '%s cannot create a qcow2 overlay with %s in %s: %s'
            % (line, said, fs['directory'], exc.format_message()),
            'Spawns fail the same way: fix the error above (a QEMU without '
            'extended_l2 support, a filesystem refusing the writes), or set '
            '[prealloc_backend] mode = none.', **facts)
    facts.update(tested)
    details = ('%s created a %s overlay with %s, cluster_size=%s in %s (%s '
               'allocated) and grew it to %s (%s allocated).'
               % (line, sizes.human(PROBE_OVERLAY_BYTES), said,
                  sizes.human(_layout(plan).cluster_size), fs['directory'],
                  sizes.human(tested['allocated_bytes']),
                  sizes.human(PROBE_GROWN_BYTES),
                  sizes.human(tested['grown_allocated_bytes'])))
    if plan.warning:
        details += ' (%s)' % plan.warning
    if note:
        details += ' (%s)' % note
    if plan.preallocation in (qcow2_layout.Qcow2Preallocation.FALLOC,
                              qcow2_layout.Qcow2Preallocation.FULL) and (
            tested['grown_allocated_bytes'] < PROBE_GROWN_BYTES):
        return result.warning(
            details + ' The data area is not fully allocated.',
            'Check that the filesystem supports fallocate(2) for files '
            'qemu-img writes (see the filesystem check).', **facts)
    return result.success(details, **facts)
