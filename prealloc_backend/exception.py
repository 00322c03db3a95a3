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

"""Typed errors of prealloc_backend.

Each message names the value involved, what was expected and the path, so
the operator reading a fault or a log line knows what to change. The classes
derive from nova's NovaException so that nova records them as instance
faults like its own; they rebuild from their message alone, which is how
oslo.privsep re-raises an error of the privileged daemon in nova-compute.

Every error that reaches nova, an operator or the API is defined here. A
few internal signals stay beside the code that raises and catches them, on
purpose: ``fileops.SizeChanged`` and ``privsep.beneath.Unusable`` live in
syscall-only modules that import nothing from nova (the daemon's smallest
surface) and are turned into the classes below by ``privsep/fs.py``; the
operator command's argument and file-parsing errors
(``cmd/check.ConfigLoadError``, ``SizeError``, ``checks/libvirtd.
ConfSyntaxError``), adoption's outcomes of a copy (``adoption/live.
Cancelled``, ``AdoptionFailed``, ``NotConverging``) and of its lock
(``adoption/recovery.AlreadyRunning``) and the benchmark's
(``bench/tools.ToolError``, ``TooShort``, ``bench/guest.GuestError``) end
in a check result or a report line, never in nova.
"""

from nova import exception as nova_exception


class PreallocError(nova_exception.NovaException):
    msg_fmt = 'Preallocation failed: %(reason)s'


class InvalidPreallocMode(PreallocError, nova_exception.Invalid):
    msg_fmt = ('Invalid preallocation mode %(value)r from %(source)s: '
               'allowed values are %(allowed)s')


class InvalidFlavorPolicy(PreallocError, nova_exception.Invalid):
    msg_fmt = ('Invalid value %(value)r for flavor extra spec %(key)s: '
               'allowed values are %(allowed)s')


class InvalidOption(PreallocError, nova_exception.Invalid, ValueError):
    # A ValueError too, as oslo.config's own ConfigFileValueError is.
    msg_fmt = ('Invalid configuration: [%(group)s] %(name)s: %(reason)s; '
               'allowed values are %(allowed)s')


class ConflictingOptions(PreallocError, nova_exception.Invalid):
    msg_fmt = 'Conflicting configuration: %(reason)s'


class InsufficientDiskSpace(PreallocError):
    msg_fmt = ('Not enough space to preallocate disk %(path)s: '
               '%(needed)d bytes needed, %(free)d bytes free on the '
               'filesystem holding %(directory)s')


class FallocateUnsupported(PreallocError):
    msg_fmt = ('The filesystem holding %(path)s (%(fstype)s) does not support '
               'fallocate(2) and [prealloc_backend] fallocate_unsupported is '
               '"fail"; set it to "warn" or "zero-fill", or move '
               'instances_path to an extent-based filesystem')


class AllocationFailed(PreallocError):
    msg_fmt = 'Preallocating %(path)s failed: %(reason)s'


class AllocationTimeout(PreallocError):
    msg_fmt = ('Preallocating %(path)s did not finish within %(timeout)d s '
               '([prealloc_backend] allocation_timeout)')


class AllocationCancelled(PreallocError):
    msg_fmt = ('Preallocating %(path)s was cancelled: %(reason)s')


class ProcessFailed(PreallocError):
    """A command run by prealloc_backend.system.process exited non-zero
    (exit_code negative: killed by that signal) or could not start
    (exit_code None).
    """
    msg_fmt = '%(cmd)s failed with exit code %(exit_code)s: %(stderr)s'

    def __init__(self, message=None, **kwargs):
        if not message and 'stderr' in kwargs and not kwargs['stderr']:
            # Rebuilt from its message alone (privsep), it keeps this text.
            message = ('%(cmd)s failed with exit code %(exit_code)s and no '
                       'error output' % kwargs)
        super().__init__(message, **kwargs)

    @property
    def cmd(self):
        return self.kwargs.get('cmd')

    @property
    def exit_code(self):
        return self.kwargs.get('exit_code')

    @property
    def stderr(self):
        return self.kwargs.get('stderr')

    @property
    def stdout(self):
        return self.kwargs.get('stdout')


class ProcessTimeout(PreallocError):
    msg_fmt = ('%(cmd)s did not finish within %(timeout)s s; it was killed')

    @property
    def cmd(self):
        return self.kwargs.get('cmd')


class QemuImgError(ProcessFailed):
    """qemu-img failed (prealloc_backend.disk.qemu.execute)."""


class QemuImgOutputError(PreallocError):
    msg_fmt = 'Unexpected output of %(cmd)s: %(reason)s; output was %(output)r'


class Qcow2RefcountError(PreallocError):
    """A qcow2 file's refcounts could not be read, or qemu-img check found
    more than leaks (disk/refcount.py): left as it is.
    """
    msg_fmt = ('Cannot mend the refcounts of qcow2 disk %(path)s before '
               'growing it: %(reason)s; it is left as it is (qemu-img check '
               '-f qcow2 on it tells more)')


class InvalidPath(PreallocError, nova_exception.Invalid):
    msg_fmt = 'Refusing to preallocate %(path)r: %(reason)s'


class InvalidSize(PreallocError, nova_exception.Invalid):
    msg_fmt = 'Refusing size %(size)r for %(path)r: %(reason)s'


class InstancesPathUnusable(PreallocError):
    msg_fmt = ('The prealloc_backend privileged daemon cannot use '
               '[DEFAULT] instances_path %(path)r: %(reason)s; it refuses '
               'every call, trying again to pin it at each one, until it '
               'is usable')


class DiskOwnedByRoot(InvalidPath):
    msg_fmt = ('Refusing to preallocate %(path)r: it is owned by root, not '
               'by the owner of instances_path or by QEMU\'s user. libvirt '
               'hands a stopped guest\'s disk back to root:root when '
               'qemu.conf sets remember_owner = 0: keep libvirt\'s default '
               'remember_owner = 1 (prealloc-backend check tells)')


class DiskInUse(PreallocError):
    msg_fmt = ('Refusing to zero-fill %(path)s: a running guest (a QEMU '
               'process) holds its image lock (%(lock)s); a disk in use is '
               'never zero-filled')


class DiskChangedDuringFill(PreallocError):
    msg_fmt = ('Zero-filling %(path)s stopped: its size changed from '
               '%(before)d to %(after)d bytes while it was being filled '
               '(another process truncated or grew it); %(written)d bytes '
               'of zeros had been written, only where zeros were read')


class AllocationOutOfSpace(AllocationFailed):
    msg_fmt = ('Preallocating %(path)s failed: No space left on device for '
               'an unprivileged user: %(needed)d bytes still needed, '
               '%(free)d bytes free (the blocks a filesystem reserves for '
               'root are never used)')


class DiskFormatMismatch(nova_exception.InvalidDiskInfo):
    """A disk's header says another format than nova's record of it.

    An InvalidDiskInfo, as nova raises for a disk it will not open; its own
    message (nova's is a bare 'Disk info file is invalid: %(reason)s').
    """
    msg_fmt = ('Refusing disk %(path)s: nova recorded it as %(recorded)s '
               '(%(source)s) but its header says %(header)s; a disk\'s '
               'format is never taken from a header its guest can write')


class NotRecordedOverlay(PreallocError):
    """nova's and libvirt's records do not make a disk a qcow2 overlay of
    the size they give it (adoption.instances.recorded_overlay): adoption
    leaves it as it is.
    """
    msg_fmt = '%(path)s: %(reason)s'


class UnsafeDiskHeader(nova_exception.InvalidDiskInfo):
    """A qcow2 instance disk whose header names what it must not."""
    msg_fmt = ('Refusing qcow2 disk %(path)s: %(reason)s; an instance '
               'disk\'s backing file must be a raw or qcow2 file beneath '
               '%(cache_dir)s with no backing file or data-file of its own, '
               'and the disk no data-file')
