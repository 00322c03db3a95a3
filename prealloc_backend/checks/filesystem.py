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

"""Checks of the instances filesystem: fallocate(2) support, free space.

Both read the facts ``Host.filesystem`` measured once: the type from
/proc/self/mountinfo, fallocate(2) support from a real call on a scratch
file there (``fsprobe.supports_fallocate``, as the backend probes it), and
the free bytes an unprivileged process may use (``f_bavail * f_frsize``; the
privileged daemon refuses to dig into root-reserved blocks). The bytes a new
disk needs come from the backend's plan (``diskplan.make_plan``), never from a
computation of this module.

Who does what: these checks only read the facts; the probe that measured
them wrote its scratch file in instances_path as the owner of that
directory (the nova user) when root runs the check (checks/host.py,
checks/owner.py).
"""

import os

from oslo_utils import units

from prealloc_backend.checks import result
from prealloc_backend import exception
from prealloc_backend.planner import modes
from prealloc_backend import sizes

# Even a thin disk needs room: a qcow2 overlay's header and tables, the
# journal file written beside each disk being made, the fallocate probe.
MIN_FREE_BYTES = units.Mi
# Filesystems where fallocate(2) reserves blocks without writing them.
EXTENT_FILESYSTEMS = 'ext4 (with extents), xfs'


def _where(fs):
    where = '%s (%s)' % (fs['instances_path'], fs['fs_type'])
    if not fs['exists']:
        if os.path.lexists(fs['instances_path']):
            what = 'is not a directory (see the Instances path check)'
        else:
            what = 'does not exist yet, nova creates it'
        where += ' - %s; measured on %s' % (what, fs['directory'])
    return where


def check_filesystem(host):
    """fallocate(2) on the instances filesystem, against the mode and
    ``[prealloc_backend] fallocate_unsupported``.
    """
    fs = host.filesystem()
    facts = dict(fs)
    where = _where(fs)
    if fs['fallocate']:
        return result.success('%s: fallocate(2) supported (probed).' % where,
                              **facts)
    mode = host.mode
    fallocate_policy = host.conf.prealloc_backend.fallocate_unsupported
    base = '%s: fallocate(2) NOT supported (probed).' % where
    move = ('move instances_path to a filesystem with fallocate(2) (%s)'
            % EXTENT_FILESYSTEMS)
    if fallocate_policy == 'fail':
        if mode is modes.Mode.SPACE:
            return result.failure(
                base + ' Mode space with [prealloc_backend] '
                'fallocate_unsupported = fail: every spawn fails with '
                '"does not support fallocate(2)".',
                'Set [prealloc_backend] fallocate_unsupported = zero-fill '
                '(writes zeros, about 20 s per GiB) or warn (disks stay '
                'thin), or %s.' % move, **facts)
        return result.warning(
            base + ' Instances of flavors with %s=space will fail to spawn '
            'here (fallocate_unsupported = fail).' % modes.FLAVOR_MODE_KEY,
            'Set [prealloc_backend] fallocate_unsupported = zero-fill or '
            'warn, or %s.' % move, **facts)
    if fallocate_policy == 'zero-fill' or mode is not modes.Mode.SPACE:
        return result.success(
            base + ' Mode %s with fallocate_unsupported = %s: %s.'
            % (mode.value, fallocate_policy,
               'space is reached by writing zeros (slow: about 20 s per GiB)'
               if fallocate_policy == 'zero-fill' else
               'the mode does not need fallocate(2)'), **facts)
    return result.warning(
        base + ' Mode space with fallocate_unsupported = warn: raw disks stay '
        'sparse and qcow2 overlays only get their metadata preallocated (a '
        'warning is logged per disk).',
        'Set [prealloc_backend] fallocate_unsupported = zero-fill or mode = '
        'full (both write zeros, about 20 s per GiB), or %s.' % move,
        **facts)


def _how(plan):
    if plan.preallocation is not None:
        return '%s preallocation=%s' % (plan.fmt.value,
                                        plan.preallocation.value)
    return '%s, %s' % (plan.fmt.value, plan.raw_action.value)


def check_free_space(host):
    """Room for one new disk of ``--disk-size`` as the plan makes it."""
    fs = host.filesystem()
    free = fs['free_bytes']
    if host.disk_format is None:
        return result.success(
            'images_type = %s: instance disks are not files in '
            'instances_path (%s free there for the image cache).'
            % (host.conf.libvirt.images_type, sizes.human(free)),
            free_bytes=free)
    mode = host.mode
    facts = {'directory': fs['directory'], 'free_bytes': free,
             'disk_bytes': host.disk_size, 'min_free_bytes': MIN_FREE_BYTES}
    try:
        plan = host.plan(host.disk_size)
    except exception.FallocateUnsupported as exc:
        return result.failure(
            'Not measured: %s' % exc.format_message(),
            'See the Instances filesystem check.', **facts)
    needed = plan.needed_bytes
    how = _how(plan)
    facts.update(needed_bytes=needed, allocation=how)
    room = max(needed, MIN_FREE_BYTES)
    if room > free:
        return result.failure(
            '%s free on the filesystem holding %s; a new %s disk in mode %s '
            '(%s) needs %s (%d bytes needed, at least %d, %d free): spawns '
            'fail with "Not enough space to preallocate disk".'
            % (sizes.human(free), fs['instances_path'],
               sizes.human(host.disk_size), mode.value, how,
               sizes.human(needed), needed, MIN_FREE_BYTES, free),
            'Free space on that filesystem or move instances_path to a '
            'larger one (each new image also needs its copy in '
            'instances_path/_base).', **facts)
    details = ('%s free on the filesystem holding %s: room for %d new %s '
               'disk(s) in mode %s (%s, %s each)'
               % (sizes.human(free), fs['instances_path'], free // room,
                  sizes.human(host.disk_size), mode.value, how,
                  sizes.human(needed)))
    try:
        worst = host.plan(host.disk_size, mode=modes.Mode.FULL).needed_bytes
    except exception.FallocateUnsupported:
        worst = needed
    facts['needed_bytes_full'] = worst
    if worst != needed:
        details += ('; %d with a flavor asking %s=full'
                    % (free // max(worst, MIN_FREE_BYTES),
                       modes.FLAVOR_MODE_KEY))
    return result.success(details + '. Check another size with --disk-size.',
                          **facts)
