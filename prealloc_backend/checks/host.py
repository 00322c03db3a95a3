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

"""The host under check: its configuration and the facts measured once.

Checks read the configuration through ``host.conf`` (nova's global
configuration, parsed as nova-compute parses it) and share what is costly
or must not change between two checks: the filesystem facts (a real
fallocate(2) probe, ``f_bavail * f_frsize``) are measured once, before any
check writes there. Needed bytes and the qcow2 layout come only from
``diskplan.make_plan``, through ``Host.plan``: the check reports what the
backend will do because it asks the function the backend asks.

Who does what: the command runs as root (it reads nova.conf and libvirt's
qemu.conf). instances_path is opened once; its free space is read from that
descriptor; the fallocate(2) probe, which writes a scratch file there, runs
in a child process working in that descriptor, as the directory's owner
(the nova user) when root runs the check (checks/owner.py).
"""

import os

from prealloc_backend.checks import owner
from prealloc_backend.disk import fsprobe
from prealloc_backend.planner import diskplan
from prealloc_backend.planner import modes


# Where libvirt's QEMU driver reads its configuration.
QEMU_CONF = '/etc/libvirt/qemu.conf'
# Seconds the fallocate(2) probe's child may take (a few system calls on a
# 1 MiB file; the nova user can stop it, owner.run_in then kills it).
FALLOCATE_DEADLINE = 60


def _fallocate_step(fd):
    # In the child, as the directory's owner, working in it (cwd).
    return fsprobe.supports_fallocate('.')


def probe_fallocate(fd, directory):
    """fsprobe's fallocate(2) probe in the directory ``fd``, run by
    owner.run_in: as the directory's owner when root runs the check.
    Raises owner.UnsafeDirectory or owner.StepFailed (StepTimedOut past
    FALLOCATE_DEADLINE).
    """
    creds = owner.credentials_for(fd, directory)
    return bool(owner.run_in(fd, directory, _fallocate_step, creds=creds,
                             deadline=FALLOCATE_DEADLINE,
                             what='the fallocate(2) probe'))


class Host:
    """One compute host, as nova.conf and the machine describe it."""

    def __init__(self, conf, config_args=(), disk_size=0,
                 qemu_conf=QEMU_CONF, nova_user=None):
        self.conf = conf
        # The oslo.config arguments the configuration was parsed from.
        self.config_args = list(config_args)
        # Size of the new disk the free-space check must fit.
        self.disk_size = disk_size
        self.qemu_conf = qemu_conf
        # The name of the user nova-compute runs as (--nova-user), or None:
        # checks/instances.py finds it from what that user cannot swap.
        self.nova_user = nova_user
        # What the first instances_path check saw (checks/instances.py):
        # (pinned facts or None, refusal or None).
        self.pin_seen = (None, None)
        self.nova_user_problem = None
        # '[group] name' of each option whose value is invalid (filled by
        # the options check, read when a later check trips on one).
        self.invalid_options = []
        self._fs = None

    @property
    def mode(self):
        """The host's Mode (raises InvalidPreallocMode or ValueError)."""
        return modes.host_mode(self.conf)

    @property
    def disk_format(self):
        """diskplan.DiskFormat of new instance disks, or None when they are
        not files the plugin handles (rbd, lvm, ploop).
        """
        return diskplan.host_disk_format(self.conf.libvirt.images_type,
                                       self.conf.use_cow_images)

    def filesystem(self):
        """Facts about the filesystem holding instances_path, measured on
        the first call: a dict with instances_path, exists, directory (the
        nearest existing directory, where the facts are measured), fs_type,
        fallocate (a real probe) and free_bytes (f_bavail * f_frsize).
        """
        if isinstance(self._fs, Exception):
            # Measured once, failed once: a step that failed or timed out
            # (stopped, killed) is not run or waited for again by every
            # check that needs the facts.
            raise self._fs
        if self._fs is None:
            path = os.path.abspath(self.conf.instances_path)
            directory = path
            while not os.path.isdir(directory):
                directory = os.path.dirname(directory)
            fd = owner.open_directory(directory)
            try:
                vfs = os.fstatvfs(fd)
                fs = {
                    'instances_path': path,
                    'exists': directory == path,
                    'directory': directory,
                    'fs_type': fsprobe.fs_type(directory),
                    'free_bytes': vfs.f_bavail * vfs.f_frsize,
                }
                fs['fallocate'] = probe_fallocate(fd, directory)
                self._fs = fs
            except owner.StepFailed as exc:
                self._fs = exc
                raise
            finally:
                os.close(fd)
        return self._fs

    def fs_facts(self):
        fs = self.filesystem()
        return diskplan.FsFacts(fallocate_ok=fs['fallocate'],
                              fstype=fs['fs_type'],
                              free_bytes=fs['free_bytes'])

    def plan(self, size, mode=None, fmt=None):
        """diskplan.make_plan's DiskPlan for a new disk of ``size`` bytes.

        ``mode``: plan for a flavor whose extra spec asks this Mode (the
        host's mode when None); ``fmt``: another DiskFormat than the host's.
        Raises what make_plan raises (FallocateUnsupported when the options
        make every such spawn fail).
        """
        return diskplan.make_plan(self.conf.prealloc_backend, {},
                                  mode or self.mode,
                                  fmt or self.disk_format, size,
                                  self.fs_facts(),
                                  path=self.filesystem()['instances_path'])
