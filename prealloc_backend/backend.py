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

"""The image backend: nova's Flat and Qcow2, preallocating.

Every file disk nova's libvirt driver creates or grows goes through
``Image.cache()`` (root, ephemeral, swap, rescue, unshelve, rebuild, hard
reboot, resize and migration targets). The subclasses here:

* create qcow2 overlays themselves, with extended_l2, a cluster size chosen
  for the disk and ``preallocation=`` for the mode, into a temporary file
  renamed into place only when complete;
* grow qcow2 disks with ``qemu-img resize --preallocation``;
* allocate raw disks after nova made them (fallocate, or zero-fill of the
  holes), through the plugin's privsep daemon;
* switch off nova's own ``fallocate -n`` step (``self.preallocate``), which
  inflates metadata-mode overlays to full allocation;
* add ``<metadata_cache>`` to qcow2 disks in the guest XML;
* keep a journal file beside a disk while it is being made, so that a
  creation interrupted by a crash is removed, not reused, next time.

LVM, RBD and ploop keep nova's classes and behaviour.
"""

import errno
import json
import os
import threading
import time

from nova.compute import task_states
from nova import exception as nova_exception
from nova import objects
from nova import utils as nova_utils
from nova.virt import images
from nova.virt.libvirt import imagebackend
from oslo_concurrency import processutils
from oslo_log import log as logging
from oslo_utils import fileutils
from oslo_utils.imageutils import format_inspector
from oslo_utils import units

from prealloc_backend import conf
from prealloc_backend import exception
from prealloc_backend import fileops
from prealloc_backend import fsprobe
from prealloc_backend import guestxml
from prealloc_backend import modes
from prealloc_backend import policy
import prealloc_backend.privsep.fs
from prealloc_backend import qemu

LOG = logging.getLogger(__name__)
CONF = conf.CONF

# Beside a disk while the plugin makes or grows it; see _Journal.
JOURNAL_SUFFIX = '.prealloc-journal'
# A qcow2 overlay is created under this name and renamed when complete.
TMP_SUFFIX = '.prealloc-tmp'
# Bytes zero-filled per privileged call: progress, timeout and cancellation
# are checked between calls.
ZERO_FILL_CALL_BYTES = 256 * units.Mi
# Disks made by Flat that are not instance disks: nothing to allocate.
NOT_DISKS = ('kernel', 'ramdisk')

_not_applied_lock = threading.Lock()
_not_applied_logged = set()


def _extra_specs(instance):
    """The instance's flavor extra specs; {} when there is no instance."""
    if instance is None:
        return {}
    try:
        return dict(instance.flavor.extra_specs or {})
    except (AttributeError, NotImplementedError,
            nova_exception.ObjectActionError):
        return {}


# OSError errnos of a call whose privsep daemon died under it (None: the
# 'Premature eof' of oslo.privsep).
_DAEMON_GONE = (errno.EPIPE, errno.ECONNRESET, None)


def _privileged(func, *args):
    """Call a privileged entrypoint of prealloc_backend.privsep.fs.

    The entrypoints are idempotent (fallocate, zero-fill of holes): when
    the daemon died under a call, the call is made once more, which starts
    a new daemon. Other errors propagate.
    """
    try:
        return func(*args)
    except OSError as exc:
        if exc.errno not in _DAEMON_GONE:
            raise
        LOG.warning('The prealloc_backend privsep daemon died during '
                    '%(call)s (%(err)s): calling it again',
                    {'call': getattr(func, '__name__', func), 'err': exc})
        return func(*args)


def _flushed(fetch_func):
    """fetch_func, then the file it wrote flushed to disk.

    NOTE: nova copies a raw base into the instance disk with cp, which
    finds data with SEEK_DATA. On ext4 without extents (kernel 6.18,
    coreutils 9.1 seen here) SEEK_DATA misses data not yet written back,
    so cp copies it as holes: the disk silently lacks part of its image.
    nova does not flush a download; flushing it costs one fsync.
    """
    def fetch(*args, **kwargs):
        fetch_func(*args, **kwargs)
        target = kwargs.get('target')
        if target and os.path.isfile(target):
            fd = os.open(target, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    return fetch


class _Journal:
    """A small JSON file beside a disk while the plugin makes or grows it.

    It records whether the disk existed before. If nova-compute dies (or the
    work is killed) before the journal is removed, the next attempt on the
    same disk finds it: a disk this plugin was *creating* is removed (it may
    be half-made), a disk that existed before is kept (its data is intact;
    the allocation is simply done again).
    """

    def __init__(self, path):
        self.disk = path
        self.path = path + JOURNAL_SUFFIX

    def recover(self):
        fileutils.delete_if_exists(self.path + '.part')
        if not os.path.exists(self.path):
            fileutils.delete_if_exists(self.disk + TMP_SUFFIX)
            return
        try:
            with open(self.path) as f:
                created = bool(json.load(f).get('created'))
        except (OSError, ValueError, AttributeError):
            # NOTE: begin() completes (written, fsynced, renamed) before
            # the work on the disk starts, so an unreadable journal means a
            # crash inside begin(): whatever disk is there was not made by
            # this plugin (it may hold a guest's data). Keep it.
            LOG.warning('Unreadable journal %(journal)s: keeping %(disk)s',
                        {'journal': self.path, 'disk': self.disk})
            created = False
        if created and os.path.exists(self.disk):
            LOG.warning('Removing %(disk)s: its creation was interrupted '
                        '(journal %(journal)s found); it will be created '
                        'again', {'disk': self.disk, 'journal': self.path})
            fileutils.delete_if_exists(self.disk)
        fileutils.delete_if_exists(self.disk + TMP_SUFFIX)
        fileutils.delete_if_exists(self.path)

    def begin(self, created):
        # Written aside and renamed: a journal is complete or absent.
        partial = self.path + '.part'
        with open(partial, 'w') as f:
            json.dump({'created': created, 'pid': os.getpid(),
                       'time': time.time()}, f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(partial, self.path)
        directory = os.open(os.path.dirname(self.path) or '.', os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def end(self):
        fileutils.delete_if_exists(self.path)


class _PreallocImage:
    """What Flat and Qcow2 share: the mode, the journal, the guest XML."""

    def _init_prealloc(self, instance):
        self._prealloc_instance = instance
        self._prealloc_mode = None
        # nova's Image.cache() runs 'fallocate -n' on every sized call when
        # this is set: never on our disks, which we allocate ourselves.
        self.preallocate = False
        # As nova does for preallocate_images=space (it turns 'native' back
        # into 'threads' when the cache mode needs it).
        try:
            preallocates = self.prealloc_mode.preallocates
        except exception.PreallocError:
            preallocates = False  # reported when a disk is made
        self.driver_io = 'native' if preallocates else None

    @property
    def prealloc_mode(self):
        if self._prealloc_mode is None:
            self._prealloc_mode = modes.instance_mode(
                CONF, _extra_specs(self._prealloc_instance))
        return self._prealloc_mode

    @property
    def _opts(self):
        return CONF.prealloc_backend

    def _fallocate_ok(self):
        return fsprobe.supports_fallocate(os.path.dirname(self.path))

    def _fstype(self):
        return fsprobe.fs_type(self.path)

    def cache(self, fetch_func, filename, size=None, safe=False, *args,
              **kwargs):
        fileutils.ensure_tree(os.path.dirname(self.path))
        journal = _Journal(self.path)
        journal.recover()
        created = not self.exists()
        if created:
            self._check_space_for_new_disk(size)
        journal.begin(created)
        try:
            super().cache(_flushed(fetch_func), filename, size, safe, *args,
                          **kwargs)
            self._allocate_existing()
        except BaseException:
            if created and self.exists():
                LOG.warning('Removing %(path)s: creating it failed',
                            {'path': self.path})
                fileutils.delete_if_exists(self.path)
            fileutils.delete_if_exists(self.path + TMP_SUFFIX)
            journal.end()
            raise
        journal.end()

    def _check_space_for_new_disk(self, size):
        """Hook: fail early when a disk about to be made cannot fit."""

    def _allocate_existing(self):
        """Hook: allocate the blocks of the disk as it now is."""

    def _raw_plan(self):
        return policy.raw_plan(self.prealloc_mode, self._fallocate_ok(),
                               self._opts.fallocate_unsupported, self.path,
                               self._fstype())

    def _allocate_file(self):
        """Allocate every block of the file as it is now (holes only):
        fallocate, or zero-fill, as the mode and the filesystem say.
        """
        plan = self._raw_plan()
        if plan.warning:
            LOG.warning('%(path)s: %(warning)s',
                        {'path': self.path, 'warning': plan.warning})
        if plan.action == policy.RAW_NOTHING:
            return
        st = os.stat(self.path)
        size = st.st_size
        # NOTE: st_blocks, not SEEK_HOLE: blocks reserved by fallocate are
        # unwritten extents that SEEK_HOLE may report as holes, and a disk
        # allocated long ago must not fail a hard reboot on a full host.
        unallocated = max(0, size - st.st_blocks * 512)
        if not unallocated and plan.action == policy.RAW_FALLOCATE:
            return
        fsprobe.check_free_space(self.path, unallocated)
        if plan.action == policy.RAW_FALLOCATE:
            try:
                _privileged(prealloc_backend.privsep.fs.fallocate_range,
                            self.path, 0, size)
                LOG.info('Allocated %(path)s (%(size)d bytes, '
                         '%(holes)d were not allocated)',
                         {'path': self.path, 'size': size,
                          'holes': unallocated})
                return
            except OSError as exc:
                if not fileops.is_unsupported(exc):
                    raise exception.AllocationFailed(path=self.path,
                                                     reason=str(exc))
                fsprobe.record_unsupported(os.path.dirname(self.path))
                plan = self._raw_plan()
                if plan.warning:
                    LOG.warning('%(path)s: %(warning)s',
                                {'path': self.path, 'warning': plan.warning})
                if plan.action != policy.RAW_ZERO_FILL:
                    return
        self._zero_fill(size)

    def _check_not_deleted(self):
        """Raise AllocationCancelled when the instance is being deleted.

        Zero-filling a large disk takes minutes; a user deleting the server
        meanwhile should not wait for it, nor leave the disk behind.
        """
        instance = self._prealloc_instance
        context = getattr(instance, '_context', None)
        if instance is None or context is None:
            return
        try:
            current = objects.Instance.get_by_uuid(context, instance.uuid,
                                                   expected_attrs=[])
        except nova_exception.InstanceNotFound:
            raise exception.AllocationCancelled(
                path=self.path, reason='the instance was deleted')
        if current.task_state == task_states.DELETING or current.deleted:
            raise exception.AllocationCancelled(
                path=self.path, reason='the instance is being deleted')

    def _zero_fill(self, size):
        timeout = self._opts.allocation_timeout
        interval = self._opts.progress_interval
        started = last_log = time.monotonic()
        written = 0
        for offset in range(0, size, ZERO_FILL_CALL_BYTES):
            length = min(ZERO_FILL_CALL_BYTES, size - offset)
            try:
                written += _privileged(
                    prealloc_backend.privsep.fs.zero_fill_range,
                    self.path, offset, length)
            except OSError as exc:
                raise exception.AllocationFailed(path=self.path,
                                                 reason=str(exc))
            now = time.monotonic()
            if timeout and now - started > timeout:
                raise exception.AllocationTimeout(path=self.path,
                                                  timeout=timeout)
            if now - last_log >= interval:
                last_log = now
                self._check_not_deleted()
                done = offset + length
                LOG.info('Zero-filling %(path)s: %(done)d of %(total)d MiB '
                         '(%(pct)d%%), %(rate).0f MiB/s',
                         {'path': self.path, 'done': done // units.Mi,
                          'total': size // units.Mi,
                          'pct': 100 * done // size,
                          'rate': written / units.Mi / (now - started)})
        LOG.info('Zero-filled %(path)s: %(written)d bytes written in '
                 '%(secs).1f s', {'path': self.path, 'written': written,
                                  'secs': time.monotonic() - started})

    def _grow_qcow2(self, size):
        """Grow a qcow2 file to ``size``, preallocating the new area."""
        info = qemu.info(self.path, 'qcow2')
        current = info['virtual-size']
        if size <= current:
            return False
        mode = self.prealloc_mode
        preallocation = policy.QEMU_PREALLOCATION[mode]
        if mode is modes.Mode.SPACE and not self._fallocate_ok():
            preallocation = policy.qcow2_overlay_layout(
                mode, size, True, '128K', False,
                self._opts.fallocate_unsupported, self.path,
                self._fstype()).preallocation
        data = info.get('format-specific', {}).get('data', {})
        extended_l2 = bool(data.get('extended-l2', False))
        if (preallocation != 'off' and info.get('backing-filename') and
                not extended_l2):
            LOG.warning('Growing %(path)s without preallocation: it has a '
                        'backing file but no extended_l2 (made before this '
                        'plugin), and QEMU cannot preallocate such a '
                        'disk', {'path': self.path})
            preallocation = 'off'
        cluster = info.get('cluster-size') or policy.MIN_CLUSTER
        needed = (qemu.measure(size, preallocation, cluster, extended_l2) -
                  qemu.measure(current, preallocation, cluster, extended_l2))
        fsprobe.check_free_space(self.path, max(needed, 0))
        LOG.info('Growing %(path)s from %(old)d to %(new)d bytes with '
                 'preallocation=%(prealloc)s',
                 {'path': self.path, 'old': current, 'new': size,
                  'prealloc': preallocation})
        qemu.resize(self.path, 'qcow2', size, preallocation,
                    timeout=self._opts.allocation_timeout)
        grown = qemu.info(self.path, 'qcow2')['virtual-size']
        if grown < size:
            raise exception.QemuImgOutputError(
                cmd='qemu-img resize', reason='it reported success but the '
                'virtual size is %d, not %d' % (grown, size),
                output=self.path)
        if CONF.resize_fs_using_block_device:
            LOG.warning('%(path)s grown with preallocation; its filesystem '
                        'is not resized ([DEFAULT] '
                        'resize_fs_using_block_device is not supported by '
                        'prealloc_backend)', {'path': self.path})
        return True

    def libvirt_info(self, cache_mode, extra_specs, boot_order=None,
                     disk_unit=None):
        info = super().libvirt_info(cache_mode, extra_specs,
                                    boot_order=boot_order,
                                    disk_unit=disk_unit)
        if (self.driver_format != 'qcow2' or
                self._opts.qcow2_l2_cache != 'full-coverage' or
                not os.path.exists(self.path)):
            return info
        try:
            qinfo = qemu.info(self.path, 'qcow2')
        except exception.PreallocError as exc:
            LOG.warning('No <metadata_cache> for %(path)s: %(err)s',
                        {'path': self.path, 'err': exc})
            return info
        data = qinfo.get('format-specific', {}).get('data', {})
        max_size = policy.metadata_cache_for(
            self._opts, qinfo['virtual-size'], qinfo.get('cluster-size'),
            bool(data.get('extended-l2', False)))
        if max_size:
            info = guestxml.with_metadata_cache(info, max_size)
        return info


class Flat(_PreallocImage, imagebackend.Flat):
    """nova's Flat (raw files, or qcow2 copies), allocated after creation."""

    def __init__(self, instance=None, disk_name=None, path=None,
                 disk_info_mapping=None):
        super().__init__(instance=instance, disk_name=disk_name, path=path,
                         disk_info_mapping=disk_info_mapping)
        self._init_prealloc(instance)

    def _is_instance_disk(self):
        return self.disk_name not in NOT_DISKS

    def _check_space_for_new_disk(self, size):
        if not size or not self._is_instance_disk():
            return
        if self.prealloc_mode in (modes.Mode.SPACE, modes.Mode.FULL):
            # Worst case: every byte of the disk ends up allocated.
            fsprobe.check_free_space(self.path, size)

    def resize_image(self, size):
        # NOTE: right after nova's copy of the base, driver_format still
        # says 'raw' even for a qcow2 copy (force_raw_images=False): nova
        # would grow it with 'qemu-img resize -f raw', extending the qcow2
        # file as raw data, after which a preallocating qcow2 grow fails.
        self.correct_format()
        if self.driver_format == 'qcow2':
            self._grow_qcow2(size)
        super().resize_image(size)

    def _allocate_existing(self):
        if (not self._is_instance_disk() or self.driver_format != 'raw' or
                not self.exists()):
            return
        self._allocate_file()


class Qcow2(_PreallocImage, imagebackend.Qcow2):
    """nova's Qcow2, with preallocated extended_l2 overlays."""

    def __init__(self, instance=None, disk_name=None, path=None,
                 disk_info_mapping=None):
        super().__init__(instance=instance, disk_name=disk_name, path=path,
                         disk_info_mapping=disk_info_mapping)
        self._init_prealloc(instance)

    def create_image(self, prepare_template, base, size, safe=False, *args,
                     **kwargs):
        if self.exists():
            # Nothing to create: nova's code only re-creates a legacy
            # '_<size>' backing file for an existing overlay here.
            return super().create_image(prepare_template, base, size, safe,
                                        *args, **kwargs)
        if not os.path.exists(base):
            prepare_template(target=base, *args, **kwargs)
        base_info = self._checked_base(base, safe)
        imagebackend._update_utime_ignore_eacces(base)
        self.verify_base_size(base, size)
        virtual_size = max(size or 0, base_info.virtual_size)
        layout = policy.qcow2_overlay_layout(
            self.prealloc_mode, virtual_size, self._opts.qcow2_extended_l2,
            self._opts.qcow2_cluster_size, self._fallocate_ok(),
            self._opts.fallocate_unsupported, self.path, self._fstype())
        if layout.warning:
            LOG.warning('%(path)s: %(warning)s',
                        {'path': self.path, 'warning': layout.warning})
        needed = policy.qcow2_needed_bytes(
            virtual_size, policy.Qcow2Preallocation(layout.preallocation),
            layout.cluster_size, layout.extended_l2)
        fsprobe.check_free_space(self.path, needed)
        tmp = self.path + TMP_SUFFIX

        @nova_utils.synchronized(self._get_lock_name(base), external=True,
                                 lock_path=self.lock_path)
        def create_overlay():
            started = time.monotonic()
            with fileutils.remove_path_on_error(tmp):
                qemu.create_overlay(tmp, virtual_size, base,
                                    base_info.file_format, layout,
                                    timeout=self._opts.allocation_timeout)
                qemu.check_overlay(tmp, virtual_size, base, layout)
                os.rename(tmp, self.path)
            LOG.info('Created %(path)s: qcow2 overlay of %(base)s, '
                     '%(size)d bytes, preallocation=%(prealloc)s, '
                     'cluster_size=%(cluster)d, extended_l2=%(ext)s in '
                     '%(secs).2f s',
                     {'path': self.path, 'base': base, 'size': virtual_size,
                      'prealloc': layout.preallocation,
                      'cluster': layout.cluster_size,
                      'ext': layout.extended_l2,
                      'secs': time.monotonic() - started})

        create_overlay()

    def _allocate_existing(self):
        # NOTE: nova copies the disks of a resized or cold-migrated
        # instance with 'cp -r' (same host or shared storage) or 'rsync
        # --sparse': the blocks preallocation=falloc reserved come out as
        # holes, while the qcow2 metadata still maps every cluster (seen
        # under real libvirt: a 1 GiB space overlay resized to 2 GiB kept
        # only the new GiB allocated). Reserve the file's blocks again as
        # for a raw file; a disk this plugin just made has no holes.
        if (self.exists() and
                self.prealloc_mode in (modes.Mode.SPACE, modes.Mode.FULL)):
            self._allocate_file()
        elif (self.exists() and self.prealloc_mode == modes.Mode.METADATA and
              self._finishing_migration()):
            self._thin_copied_zeros()

    def _finishing_migration(self):
        instance = self._prealloc_instance
        return (instance is not None and
                getattr(instance, 'task_state', None) ==
                task_states.RESIZE_FINISH)

    def _thin_copied_zeros(self):
        """A metadata-mode disk that arrived on this host fully written.

        NOTE (issue 15): nova's default transport (ssh: scp) writes every
        byte of a cold-migrated disk, zeros included, so a metadata overlay
        (mapped clusters, no data blocks) arrives fully allocated. Punch
        holes where whole blocks read as zeros (util-linux ``fallocate
        --dig-holes``): what the guest reads is unchanged (a hole reads as
        zeros, the qcow2 metadata keeps every cluster mapped), the disk is
        what metadata preallocation makes. Only in finish_migration, where
        the copy just happened: it reads the whole file.
        """
        before = os.stat(self.path).st_blocks * 512
        if before <= os.stat(self.path).st_size // 2:
            return
        processutils.execute('fallocate', '--dig-holes', self.path)
        LOG.info('%(path)s arrived fully written (a full copy): holes '
                 'punched where it read zeros for mode metadata, %(before)d '
                 'then %(after)d bytes allocated',
                 {'path': self.path, 'before': before,
                  'after': os.stat(self.path).st_blocks * 512})

    @staticmethod
    def _checked_base(base, safe):
        """nova's checks of a backing file before an overlay is made on it
        (nova.virt.libvirt.utils.create_image does the same), called through
        nova's own helpers. Returns the base's QemuImgInfo.
        """
        if not CONF.workarounds.disable_deep_image_inspection and not safe:
            try:
                images.get_image_format(base).safety_check()
            except format_inspector.SafetyCheckFailed as exc:
                LOG.warning('Base image %s failed safety check: %s', base,
                            exc)
                raise nova_exception.InvalidDiskInfo(
                    reason='Base image failed safety check')
        base_info = images.qemu_img_info(base)
        if base_info.file_format == 'vmdk':
            images.check_vmdk_image('base', base_info)
        try:
            data_file = base_info.format_specific['data']['data-file']
        except (KeyError, TypeError, AttributeError):
            data_file = None
        if base_info.backing_file is not None or data_file is not None:
            LOG.warning('Base image %s failed safety check', base)
            raise nova_exception.InvalidDiskInfo(
                reason='Base image failed safety check')
        return base_info

    def resize_image(self, size):
        self._grow_qcow2(size)
        # Only resizes the guest filesystem where nova would (it finds the
        # disk already at its size).
        super().resize_image(size)


class Backend(imagebackend.Backend):
    """nova's Backend with the preallocating Flat and Qcow2."""

    def __init__(self, use_cow):
        super().__init__(use_cow)
        self.BACKEND.update({
            'raw': Flat,
            'flat': Flat,
            'qcow2': Qcow2,
            'default': Qcow2 if use_cow else Flat,
        })

    def backend(self, image_type=None):
        image = super().backend(image_type)
        if image not in (Flat, Qcow2):
            name = image_type or CONF.libvirt.images_type
            with _not_applied_lock:
                first = name not in _not_applied_logged
                _not_applied_logged.add(name)
            if first:
                LOG.info('prealloc_backend does not apply to images_type='
                         '%s: its disks keep nova\'s own behaviour', name)
        return image
