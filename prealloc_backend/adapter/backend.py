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

This module is the adapter only: each nova call (``cache()``,
``libvirt_info``) gets one operation.DiskOperation (``op``), which reads
the disk's facts once, decides its mode once (the flavor read there) and
makes the plan of the work (free space checked there, once, before the
work); the methods below hand that operation's data to the executors in
nova's order: allocate.py (the blocks of a raw file, holes dug), qcow2.py
(overlays, growth, re-layout), extend.py (nova's raw growth and
guest-filesystem resize), journal.py (the crash journal), qemu.py
(qemu-img). ``libvirt_info`` makes the plan of the disk as it is
(``diskplan.disk_as_is``) and reads the guest XML's settings from it.

A disk's format comes from nova's records, never from its header alone:
formats.py reads the records and checks a qcow2 disk before qemu-img runs
on it. Everything here runs as the nova-compute user; only allocate.py's
calls go to the privileged daemon.
"""

import os
import threading

from nova.compute import task_states
from nova import utils as nova_utils
from nova.virt.libvirt import imagebackend
from oslo_log import log as logging
from oslo_utils import fileutils

from prealloc_backend.adapter import guestxml
from prealloc_backend.adapter import operation
from prealloc_backend import conf
from prealloc_backend.disk import allocate
from prealloc_backend.disk import extend
from prealloc_backend.disk import formats
from prealloc_backend.disk import hostcaps
from prealloc_backend.disk import journal
from prealloc_backend.disk import qcow2
from prealloc_backend import exception
from prealloc_backend.planner import diskplan
from prealloc_backend.planner import modes
from prealloc_backend.system import fileops

LOG = logging.getLogger(__name__)
CONF = conf.CONF

JOURNAL_SUFFIX = journal.JOURNAL_SUFFIX
TMP_SUFFIX = journal.TMP_SUFFIX
_Journal = journal.Journal
# Disks made by Flat that are not instance disks: nothing to allocate.
NOT_DISKS = ('kernel', 'ramdisk')

_not_applied_lock = threading.Lock()
_not_applied_logged = set()


def _flushed(fetch_func):
    """fetch_func, then the file it wrote flushed to disk.

    NOTE(nova): nova copies a raw base into the instance disk with cp, which
    finds data with SEEK_DATA. On ext4 without extents (kernel 6.18,
    coreutils 9.1 seen here) SEEK_DATA misses data not yet written back,
    so cp copies it as holes: the disk silently lacks part of its image.
    nova does not flush a download; flushing it costs one fsync.
    """
    def fetch(*args, **kwargs):
        fetch_func(*args, **kwargs)
        target = kwargs.get('target')
        if target and os.path.isfile(target):
            fileops.sync(target)
            # nova renames its download's .part to this name: the name
            # is flushed too, or an overlay published durably could name
            # a base image a power cut lost.
            fileops.fsync_dir(os.path.dirname(target))
    return fetch


class _PreallocImage:
    """What Flat and Qcow2 share: the mode, the plan, the journal, the
    guest XML.
    """

    # The operation.DiskOperation of this disk's current nova call (see
    # cache(), libvirt_info).
    op = None
    # True while cache() runs: its steps share its operation.
    _in_cache = False

    def _init_prealloc(self, instance):
        # Records its arguments only, as nova's constructors do: the
        # flavor is read and the plan made when a disk is created or
        # grown (see cache()), never here.
        self._prealloc_instance = instance
        self.op = None
        self._new_disk = False
        # nova's Image.cache() runs 'fallocate -n' on every sized call when
        # this is set: never on our disks, which we allocate ourselves.
        self.preallocate = False

    def _new_operation(self, extra_specs=None):
        """The DiskOperation of a new nova call for this disk: the
        flavor's extra specs (``extra_specs``, or the instance's) read
        once, the mode decided once.
        """
        if extra_specs is None:
            extra_specs = operation.flavor_extra_specs(
                self._prealloc_instance)
        self.op = operation.DiskOperation(
            self.path, extra_specs, made_as=self.MADE_AS,
            disk_info_path=self.disk_info_path,
            migration=operation.MIGRATIONS.of_path(self.path),
            instance=self._prealloc_instance)
        return self.op

    def _operation(self):
        """The operation of the nova call under way: cache()'s, whose
        steps (create_image, resize_image, the allocation) share it, or a
        new one for a method nova calls on its own.
        """
        if not self._in_cache or self.op is None:
            self._new_operation()
        return self.op

    @property
    def plan(self):
        """The DiskPlan of this disk's current operation, once made."""
        return self.op.plan if self.op is not None else None

    @property
    def prealloc_mode(self):
        """The mode of this disk's current operation, decided once."""
        if self.op is None:
            self._new_operation()
        return self.op.mode

    @property
    def _opts(self):
        return CONF.prealloc_backend

    # The format of the disks this backend makes (its record of a disk
    # nova's disk.info and the migration do not name).
    MADE_AS = None
    # True while cache() makes this disk (see _get_driver_format).
    _new_disk = False

    def resolve_driver_format(self):
        # NOTE(nova): nova reads disk.info first and only asks
        # _get_driver_format for a disk it does not list. While a migration
        # is finished here the source's domain XML is the record: it wins,
        # and replaces what disk.info said (a move can leave it stale: a
        # disk converted to qcow2 stays 'raw' there, nova never rewrites an
        # entry).
        # A raw disk's conversion to qcow2 that a crash interrupted is
        # finished or rolled back first: the records then say what the
        # file is (journal.Journal.reconcile).
        migration = operation.MIGRATIONS.of_path(self.path)
        if self.path:
            self._reconciled(_Journal(self.path).reconcile(), migration)
        fmt = None
        if self.disk_info_path and migration is not None:
            fmt = formats.migration_record(self.path,
                                           migration.format_of(self.path))
        if fmt:
            return fmt
        return super().resolve_driver_format()

    def _reconciled(self, fmt, migration):
        """A crash's conversion to qcow2 was finished (``fmt`` 'qcow2') by
        the journal's recovery: a migration being finished here records it
        too.
        """
        if fmt == 'qcow2' and migration is not None:
            migration.converted(self.path, fmt)

    def _get_driver_format(self):
        """A disk disk.info does not list: never its header's word.

        NOTE(nova): nova 34's Flat asks ``qemu-img info`` without ``-f``
        here and records what the header says (the class of
        https://bugs.launchpad.net/nova/+bug/1221190): a raw disk whose
        guest wrote a qcow2 header would be handed to QEMU as qcow2, its
        backing file read for the guest.
        """
        if self.MADE_AS != 'raw' or not os.path.exists(self.path):
            # nova's Qcow2: its own format (a disk recorded otherwise, or
            # whose header disagrees, is refused by the operation's
            # disk_format when it is grown or allocated).
            return super()._get_driver_format()
        return formats.unrecorded_raw_format(self.path, self._new_disk,
                                             self.disk_info_path)

    def cache(self, fetch_func, filename, size=None, safe=False, *args,
              **kwargs):
        fileutils.ensure_tree(os.path.dirname(self.path))
        op = self._new_operation()  # the flavor read once for this call
        journal = _Journal(self.path)
        self._reconciled(journal.recover(), op.migration)
        self._in_cache = True
        try:
            self._cache(journal, fetch_func, filename, size, safe, *args,
                        **kwargs)
        finally:
            self._in_cache = False

    def _cache(self, journal, fetch_func, filename, size, safe, *args,
               **kwargs):
        created = not self.exists()
        if created:
            self._check_space_for_new_disk(size)
        journal.begin(created)
        self._new_disk = created
        try:
            super().cache(_flushed(fetch_func), filename, size, safe, *args,
                          **kwargs)
            self._new_disk = False
            self._allocate_existing(created)
        except BaseException:
            self._new_disk = False
            if created and self.exists():
                LOG.warning('Removing %(path)s: creating it failed',
                            {'path': self.path})
                fileops.remove(self.path)
            fileops.remove(self.path + TMP_SUFFIX)
            try:
                journal.end()
            except OSError as exc:
                # The failure above is the one to report; the journal
                # left behind is recovered by the next cache().
                LOG.warning('%(path)s: its journal could not be removed '
                            '(%(err)s)', {'path': self.path, 'err': exc})
            raise
        journal.end()

    def _allocate_copied_qcow2(self):
        """Bring an existing qcow2 file (a Qcow2 disk, or a qcow2 disk on a
        raw host's Flat) to this host's mode after nova copied it.
        """
        # NOTE(nova): nova copies the disks of a resized or cold-migrated
        # instance with 'cp -r' (same host or shared storage) or 'rsync
        # --sparse': the blocks preallocation=falloc reserved come out as
        # holes, while the qcow2 metadata still maps every cluster (seen
        # under real libvirt: a 1 GiB space overlay resized to 2 GiB kept
        # only the new GiB allocated). Reserve the file's blocks again as
        # for a raw file; a disk this plugin just made has no holes.
        mode = self.prealloc_mode
        if mode in (modes.Mode.SPACE, modes.Mode.FULL):
            self._allocate_file(created=False)
        elif mode is modes.Mode.METADATA and self._finishing_migration():
            allocate.dig_holes(self.path)

    def _finishing_migration(self):
        instance = self._prealloc_instance
        # Never a hidden lazy-load (an instance without a context raises).
        return (instance is not None and
                getattr(instance, 'obj_attr_is_set', None) is not None and
                instance.obj_attr_is_set('task_state') and
                instance.task_state == task_states.RESIZE_FINISH)

    def _check_space_for_new_disk(self, size):
        """Hook: fail early when a disk about to be made cannot fit."""

    def _allocate_existing(self, created):
        """Hook: allocate the blocks of the disk as it now is."""

    def _allocate_file(self, created):
        """Allocate the holes of the file as it is now, as the operation's
        plan says (operation.allocate_raw). A disk that existed before is
        planned as such: never failed for space, left thin. A qcow2 disk
        this operation just grew (or re-laid out and grew) is filled by its
        growth plan where that plan preallocates (falloc, full), which
        counted the holes (an existing disk's st_blocks; a re-laid out disk
        is planned whole); a growth left thin (no room, no extended_l2) has
        the file's holes planned as a raw file's, as before the growth.
        """
        op = self.op
        plan = op.plan
        if (plan is not None and plan.fmt is diskplan.DiskFormat.QCOW2 and
                operation.raw_action(plan) is not
                diskplan.RawAction.NOTHING):
            op.allocate_raw(plan)
            return
        existing = None if created else op.raw_existing()
        size = os.stat(self.path).st_size
        if (plan is None or plan.fmt is not diskplan.DiskFormat.RAW or
                plan.existing or existing is not None or
                plan.virtual_size != size):
            # Not the plan this operation checked before the work (made
            # for another size, or an existing disk): planned now.
            plan = op.make_plan(diskplan.DiskFormat.RAW, size,
                                existing=existing)
        op.allocate_raw(plan)

    def _grow(self, size):
        """Grow the disk to ``size`` in its recorded format (raw or qcow2,
        see the operation's disk_format), preallocating as planned; then
        the guest filesystem where nova would resize it.
        """
        op = self._operation()
        try:
            fmt = op.disk_format()
        except (exception.UnsafeDiskHeader,
                exception.DiskFormatMismatch):
            # nova's cache() asks every existing disk to grow to its
            # flavor's size (a hard reboot too): one already that large is
            # left as it is (logged), never failing the instance's start;
            # growing a refused disk is refused.
            if formats.virtual_size_unchecked(self.path) >= size:
                op.existing_format()
                return
            raise
        if fmt is diskplan.DiskFormat.RAW:
            extend.grow_raw(self.path, size)
            return
        if self._grow_qcow2(size) and CONF.resize_fs_using_block_device:
            extend.resize_qcow2_fs(self.path)

    def _grow_qcow2(self, size):
        """Grow a qcow2 file (checked by the operation's disk_format) to
        ``size``, preallocating the new area: one plan, for the disk at
        its new size.
        """
        op = self.op
        existing = op.qcow2_existing()
        if size <= existing.virtual_size:
            return False
        backing = op.checked_qcow2().backing
        if (backing and not existing.extended_l2 and
                op.mode.preallocates and self._opts.qcow2_extended_l2):
            # Rewritten first with the plan's layout, then grown by the
            # same plan: planned as a new disk of its new size.
            plan = op.make_plan(diskplan.DiskFormat.QCOW2, size)
            if self._relayout_overlay(plan):
                op.disk_changed()
            else:
                # Left as it is (a backing name qemu-img cannot take):
                # grown thin, as its layout allows.
                plan = op.make_plan(diskplan.DiskFormat.QCOW2, size,
                                    existing=existing, backing=True)
        else:
            plan = op.make_plan(diskplan.DiskFormat.QCOW2, size,
                                existing=existing, backing=bool(backing))
        qcow2.grow(self.path, existing.virtual_size, plan,
                   timeout=self._opts.allocation_timeout)
        op.disk_changed()
        return True

    def _relayout_overlay(self, plan):
        """Rewrite an overlay without extended_l2 (stock nova's, or the
        plugin's mode none) with ``plan``'s layout, before it grows
        (qcow2.relayout_overlay).

        QEMU cannot preallocate an overlay with a backing file without
        extended_l2, so a disk made in mode none and resized to a flavor
        asking for metadata, space or full would stay thin. Only while
        nova grows a disk (resize, spawn), never under a running guest.
        False where it is left as it is (qcow2.relayout_overlay).
        """
        # The backing file as the operation's check resolved and checked
        # it, never as read from the header again.
        checked = self.op.checked_qcow2()
        return qcow2.relayout_overlay(self.path, checked.backing,
                                      checked.backing_fmt, plan,
                                      timeout=self._opts.allocation_timeout)

    def libvirt_info(self, cache_mode, extra_specs, boot_order=None,
                     disk_unit=None):
        # extra_specs: the flavor's, which nova passes here.
        plan = self._plan_as_is(extra_specs)
        # As nova does for preallocate_images=space (it turns 'native'
        # back into 'threads' when the cache mode needs it).
        self.driver_io = 'native' if plan.mode.preallocates else None
        info = super().libvirt_info(cache_mode, extra_specs,
                                    boot_order=boot_order,
                                    disk_unit=disk_unit)
        discard = self._guest_discard(plan, info.driver_discard)
        info.driver_discard = discard.discard
        if discard.no_unref:
            info = guestxml.with_discard_no_unref(info)
        if discard.reserve_again:
            self._reserve_again()
        if plan.physical_block_size:
            # <blockio>: a 512e disk whose physical block is a subcluster.
            info.physical_block_size = str(plan.physical_block_size)
        if plan.metadata_cache_bytes:
            info = guestxml.with_metadata_cache(info,
                                                plan.metadata_cache_bytes)
        return info

    def _guest_discard(self, plan, nova_discard):
        """diskplan.GuestDiscard of this disk; the host's QEMU and libvirt
        are asked about discard-no-unref (once per process) only for the
        disks that could use it.
        """
        choice = self._opts.guest_discard
        no_unref = False
        if diskplan.may_use_no_unref(plan.mode, plan.fmt, nova_discard,
                                     choice):
            try:
                no_unref = hostcaps.discard_no_unref().supported
            except Exception as exc:
                # A probe that cannot answer is a no: the guest is
                # defined as without the capability, never refused.
                LOG.warning('qcow2 discard-no-unref not used for %(path)s: '
                            'the host could not be asked (%(err)s)',
                            {'path': self.path, 'err': exc})
        return diskplan.guest_discard(plan.mode, plan.fmt, nova_discard,
                                      choice, no_unref=no_unref)

    def _reserve_again(self):
        """Reserve again the blocks a guest's discard freed under a disk
        of mode space or full with discard-no-unref (guest_discard =
        zero): fallocate(2) of the file's holes, contents untouched, safe
        on a file QEMU has open. A failure is logged, never raised: the
        guest runs as it did with the blocks it has.
        """
        if not os.path.exists(self.path):
            return
        try:
            if not allocate.fallocate_file(self.path):
                LOG.warning('Not reserving %s again after guest discards: '
                            'its filesystem has no fallocate(2)', self.path)
        except Exception as exc:
            # Whatever failed (the daemon could not start, the host is
            # full), the guest's definition goes on: an existing instance
            # is never put in ERROR for this.
            LOG.warning('Could not reserve %(path)s again after guest '
                        'discards: %(err)s', {'path': self.path,
                                              'err': exc})

    def _plan_as_is(self, extra_specs):
        """The plan of this disk as it is (diskplan.disk_as_is), kept as
        ``self.plan``: what its guest XML says. nova builds the XML with
        an image object of its own, after the operation that made the
        disk: this is that object's operation. Only a qcow2 disk's layout
        is read (``qemu-img info -f qcow2``), and only where it can give a
        ``<metadata_cache>`` or a ``<blockio>``.
        """
        op = self._new_operation(extra_specs or {})
        fmt = (diskplan.DiskFormat.QCOW2 if self.driver_format == 'qcow2'
               else diskplan.DiskFormat.RAW)
        existing = None
        if (diskplan.layout_shown(self._opts, op.mode, fmt) and
                os.path.exists(self.path)):
            try:
                existing, _info = qcow2.existing(self.path)
            except exception.PreallocError as exc:
                LOG.warning('No <metadata_cache> or <blockio> for %(path)s: '
                            '%(err)s', {'path': self.path, 'err': exc})
        op.plan = diskplan.disk_as_is(self._opts, op.mode, fmt, existing)
        return op.plan


class Flat(_PreallocImage, imagebackend.Flat):
    """nova's Flat (raw files, or qcow2 copies), allocated after creation."""

    MADE_AS = 'raw'

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
        # Worst case: every byte of the disk ends up allocated.
        self.op.make_plan(diskplan.DiskFormat.RAW, size)

    def resize_image(self, size):
        # NOTE(nova): right after nova's copy of the base, driver_format still
        # says 'raw' even for a qcow2 copy (force_raw_images=False): nova
        # would grow it with 'qemu-img resize -f raw', extending the qcow2
        # file as raw data, after which a preallocating qcow2 grow fails.
        self.correct_format()
        if self.driver_format in formats.FORMATS:
            self._grow(size)
        else:
            super().resize_image(size)

    def _allocate_existing(self, created):
        if (not self._is_instance_disk() or not self.exists() or
                self.prealloc_mode is modes.Mode.NONE):
            return
        if self.driver_format == 'raw':
            self._allocate_file(created)
        elif self.driver_format == 'qcow2' and not created:
            # A qcow2 disk on a raw host: nova keeps a migrated overlay
            # qcow2 (it never converts to raw); this host's mode applies.
            self._allocate_copied_qcow2()


class Qcow2(_PreallocImage, imagebackend.Qcow2):
    """nova's Qcow2, with preallocated extended_l2 overlays."""

    MADE_AS = 'qcow2'

    def __init__(self, instance=None, disk_name=None, path=None,
                 disk_info_mapping=None):
        super().__init__(instance=instance, disk_name=disk_name, path=path,
                         disk_info_mapping=disk_info_mapping)
        self._init_prealloc(instance)

    def create_image(self, prepare_template, base, size, safe=False, *args,
                     **kwargs):
        self._operation()
        if self.exists():
            # An existing disk (a migration's, a hard reboot's) whose base
            # this host may not have yet: fetched first, as nova does, so
            # that an overlay's backing file exists when it is checked.
            if not os.path.exists(base):
                prepare_template(target=base, *args, **kwargs)
            fmt = self.op.existing_format()
            if fmt is None:
                return None
            if fmt is diskplan.DiskFormat.RAW:
                # A raw disk (from a raw host, before finish_migration
                # converts it): only its base is checked here, never
                # nova's legacy-backing probe ('qemu-img info' without -f,
                # which would believe a qcow2 header its guest wrote).
                formats.checked_base(base, safe)
                imagebackend._update_utime_ignore_eacces(base)
                return None
        if self.exists() or self.prealloc_mode is modes.Mode.NONE:
            # An existing qcow2 disk, checked above (the operation's
            # disk_format): nova's code only re-creates a legacy '_<size>'
            # backing file here.
            # Mode none: nova's own overlay (see diskplan._none_plan).
            return super().create_image(prepare_template, base, size, safe,
                                        *args, **kwargs)
        if not os.path.exists(base):
            prepare_template(target=base, *args, **kwargs)
        base_info = formats.checked_base(base, safe)
        imagebackend._update_utime_ignore_eacces(base)
        self.verify_base_size(base, size)
        virtual_size = max(size or 0, base_info.virtual_size)
        plan = self.op.make_plan(diskplan.DiskFormat.QCOW2, virtual_size)

        @nova_utils.synchronized(self._get_lock_name(base), external=True,
                                 lock_path=self.lock_path)
        def create_overlay():
            qcow2.create_overlay(self.path, virtual_size, base,
                                 base_info.file_format, plan,
                                 timeout=self._opts.allocation_timeout)

        create_overlay()

    def _allocate_existing(self, created):
        if not self.exists() or created:
            return
        fmt = self.op.existing_format()
        if fmt is None:
            return
        if fmt is diskplan.DiskFormat.RAW:
            # A raw disk in a qcow2 instance (a migration from a raw host,
            # before nova converts it): allocated as a raw file.
            if self.prealloc_mode is not modes.Mode.NONE:
                self._allocate_file(created)
            return
        self._allocate_copied_qcow2()

    def resize_image(self, size):
        # Format-aware: a raw file (from a raw host) grows as raw, never
        # 'qemu-img resize -f qcow2' on it (nova 34 fails there).
        self._grow(size)


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
