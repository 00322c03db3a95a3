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

"""Facts about the filesystem holding a disk: fallocate support, free space.

The fallocate(2) probe runs once per filesystem, keyed by st_dev, with a
real call on a scratch file in the disk's own directory. (nova caches its
probe on the image class, so the first path's filesystem decides for every
later one.)
"""

import os
import tempfile
import threading

from oslo_log import log as logging

from prealloc_backend.planner import diskplan
from prealloc_backend.system import fileops

LOG = logging.getLogger(__name__)

PROBE_BYTES = 64 * 1024

_lock = threading.Lock()
_fallocate_support = {}


def supports_fallocate(directory):
    """True when the filesystem holding ``directory`` supports fallocate(2).

    The answer is cached per st_dev. An error other than 'not supported'
    (a full or read-only filesystem, say) is not cached and answers True:
    the allocation itself will then report the real error.
    """
    dev = os.stat(directory).st_dev
    with _lock:
        if dev in _fallocate_support:
            return _fallocate_support[dev]
    try:
        fd, name = tempfile.mkstemp(prefix='.prealloc-probe-', dir=directory)
    except OSError as exc:
        LOG.warning('Cannot probe fallocate(2) support in %(dir)s: %(err)s',
                    {'dir': directory, 'err': exc})
        return True
    try:
        fileops.fallocate(fd, 0, PROBE_BYTES, keep_size=False)
        supported = True
    except OSError as exc:
        if not fileops.is_unsupported(exc):
            LOG.warning('fallocate(2) probe in %(dir)s failed: %(err)s',
                        {'dir': directory, 'err': exc})
            return True
        supported = False
    finally:
        os.close(fd)
        os.unlink(name)
    with _lock:
        _fallocate_support[dev] = supported
    if not supported:
        LOG.warning('The filesystem holding %(dir)s (%(fstype)s, device '
                    '%(dev)d) does not support fallocate(2)',
                    {'dir': directory, 'fstype': fs_type(directory),
                     'dev': dev})
    return supported


def record_unsupported(directory):
    """Remember that fallocate(2) failed as unsupported on this filesystem
    (found by a real allocation after a probe said yes: a union or network
    filesystem can answer differently for different files).
    """
    with _lock:
        _fallocate_support[os.stat(directory).st_dev] = False


def forget(directory=None):
    """Drop cached probe results (all, or the filesystem of directory)."""
    with _lock:
        if directory is None:
            _fallocate_support.clear()
        else:
            _fallocate_support.pop(os.stat(directory).st_dev, None)


def fs_type(path):
    """Filesystem type of the mount holding ``path`` ('unknown' if unread)."""
    path = os.path.realpath(path)
    best, fstype = '', 'unknown'
    try:
        with open('/proc/self/mountinfo') as mountinfo:
            for line in mountinfo:
                fields = line.split()
                sep = fields.index('-')
                mount_point = fields[4].replace('\\040', ' ')
                if (os.path.commonpath([mount_point, path]) == mount_point and
                        len(mount_point) >= len(best)):
                    best, fstype = mount_point, fields[sep + 1]
    except (OSError, ValueError, IndexError):
        pass
    return fstype


def free_bytes(directory):
    """Bytes an unprivileged process may still allocate there."""
    vfs = os.statvfs(directory)
    return vfs.f_bavail * vfs.f_frsize


def facts(directory):
    """The FsFacts of the filesystem holding ``directory`` (probed once
    per filesystem for fallocate(2); free space read now).
    """
    return diskplan.FsFacts(fallocate_ok=supports_fallocate(directory),
                          fstype=fs_type(directory),
                          free_bytes=free_bytes(directory))
