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

"""Check: the existing disks of this host against its policy.

Counts the qcow2 overlays nova made in instances_path (``<uuid>/disk``,
``disk.local``, ``disk.eph*``, ``disk.swap``) that are not at the host's
policy (planner.adoption.verdict, the decision ``prealloc-backend adopt``
takes), their virtual size, and the bytes adopting them would reserve
against the free space. Judged against the host's mode: an instance whose
flavor names another mode is judged by ``adopt``, which reads the flavor
through nova.

Only the disks nova's disk.info records as qcow2 are counted, as adopt
adopts only those (a raw disk's guest can write a qcow2 header).

Runs as root and only reads: each directory and file is opened without
following a symlink (O_NOFOLLOW, relative to the directory's descriptor),
only regular files, and only the first 104 bytes of each disk (the qcow2
header: size, cluster bits, backing file, extended_l2; read by
disk.qemu.ImageInfo.from_header, no qemu-img), with its fstat,
and the first DISK_INFO_MAX bytes of each disk.info.
"""

import json
import os
import stat

from prealloc_backend.checks import result
from prealloc_backend.disk import qemu
from prealloc_backend.planner import adoption
from prealloc_backend.planner import diskplan
from prealloc_backend.planner import modes
from prealloc_backend import sizes

OPEN_FLAGS = (os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK |
              getattr(os, 'O_NOATIME', 0))
# nova's disk.info: a small JSON object, {disk path: format}.
DISK_INFO_MAX = 65536


def _open_regular(dir_fd, name):
    """A descriptor of the regular file ``name`` in ``dir_fd`` (nothing
    followed), or None.
    """
    try:
        fd = os.open(name, OPEN_FLAGS, dir_fd=dir_fd)
    except OSError:
        try:
            fd = os.open(name, OPEN_FLAGS & ~getattr(os, 'O_NOATIME', 0),
                         dir_fd=dir_fd)
        except OSError:
            return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def recorded_formats(dir_fd):
    """{file name: format} nova's disk.info in the instance directory
    ``dir_fd`` records (its keys are disk paths), {} when it has none.
    """
    fd = _open_regular(dir_fd, 'disk.info')
    if fd is None:
        return {}
    try:
        data = os.pread(fd, DISK_INFO_MAX, 0)
    finally:
        os.close(fd)
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        # Not JSON, or nested deeper than the parser goes ('[' * 60000):
        # written by whoever owns the directory, recorded nothing.
        return {}
    if not isinstance(record, dict):
        return {}
    return {os.path.basename(str(k)): v for k, v in record.items()}


def overlay_facts(dir_fd, name):
    """(ExistingDisk, has a backing file) of the qcow2 file ``name`` in the
    directory ``dir_fd``, from its header (qemu.ImageInfo.from_header), or
    None when it is not a regular qcow2 file.
    """
    fd = _open_regular(dir_fd, name)
    if fd is None:
        return None
    try:
        st = os.fstat(fd)
        header = os.pread(fd, qemu.HEADER, 0)
    finally:
        os.close(fd)
    info = qemu.ImageInfo.from_header(header)
    if info is None:
        return None
    return info.existing(st.st_blocks * 512), info.has_backing


def _disks(path):
    """[(uuid/name, ExistingDisk)] of the overlays under ``path``."""
    found = []
    top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW |
                  os.O_CLOEXEC)
    try:
        for entry in sorted(os.listdir(top)):
            try:
                sub = os.open(entry, os.O_RDONLY | os.O_DIRECTORY |
                              os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=top)
            except OSError:
                continue   # a file, a symlink, _base's siblings
            try:
                try:
                    names = sorted(os.listdir(sub))
                except OSError:
                    continue
                recorded = recorded_formats(sub)
                for name in names:
                    if not adoption.is_nova_disk(name) or \
                            '.prealloc' in name or \
                            recorded.get(name) != 'qcow2':
                        continue
                    got = overlay_facts(sub, name)
                    if got is not None and got[1]:
                        found.append(('%s/%s' % (entry, name), got[0]))
            finally:
                os.close(sub)
    finally:
        os.close(top)
    return found


def check_existing_disks(host):
    """Existing overlays not at the host's policy: count, sizes, and what
    adopting them would reserve.
    """
    path = os.path.abspath(host.conf.instances_path)
    if host.disk_format is not diskplan.DiskFormat.QCOW2:
        return result.success(
            'New disks here are not qcow2 overlays (images_type = %s, '
            'use_cow_images = %s): prealloc-backend adopt rewrites qcow2 '
            'overlays only.' % (host.conf.libvirt.images_type,
                                host.conf.use_cow_images))
    mode = host.mode
    if mode is modes.Mode.NONE:
        return result.success('Mode none: nova\'s own overlays are this '
                              'host\'s policy; nothing to adopt.')
    if not os.path.isdir(path):
        return result.success('%s does not exist yet: no existing disk.'
                              % path)
    fs = host.fs_facts()
    opts = host.conf.prealloc_backend
    try:
        disks = _disks(path)
    except OSError as exc:
        # A symlink, a file, a directory swapped while the check runs:
        # the Instances path checks judge it; nothing is read here.
        return result.success('%s not read (%s): see the Instances path '
                              'checks.' % (path, exc.strerror or exc))
    off, virtual, to_reserve, at_policy = [], 0, 0, 0
    for name, facts in disks:
        verdict = adoption.verdict(opts, {}, mode, facts, fs, path=name)
        if verdict.at_policy:
            at_policy += 1
            continue
        off.append(name)
        virtual += facts.virtual_size
        if verdict.plan is not None:
            to_reserve += max(0, verdict.plan.needed_bytes -
                              facts.allocated_bytes)
    found = {'at_policy': at_policy, 'not_at_policy': len(off),
             'virtual_bytes': virtual, 'would_reserve_bytes': to_reserve,
             'free_bytes': fs.free_bytes, 'disks': off}
    if not off:
        return result.success(
            '%d existing overlay(s) in %s, all at the policy of mode %s.'
            % (at_policy, path, mode.value), **found)
    return result.success(
        '%d existing overlay(s) in %s not at the policy of mode %s (%s '
        'virtual; %d at it): adopting them would reserve %s more, %s is '
        'free. Judged against the host\'s mode; prealloc-backend adopt '
        '--all --dry-run judges each with its flavor\'s and lists them.'
        % (len(off), path, mode.value, sizes.human(virtual), at_policy,
           sizes.human(to_reserve), sizes.human(fs.free_bytes)), **found)
