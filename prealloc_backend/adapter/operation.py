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

"""One disk operation: one nova call into the image backend for one disk.

nova asks the image backend several things per disk and request:
``cache()`` runs create_image, resize_image and the allocation one after
the other; ``libvirt_info`` builds the disk's guest XML later, with an
image object of its own. Each of these calls gets one ``DiskOperation``
(backend.py makes it), which decides and carries out its steps:

* the facts, read once: the flavor's extra specs (the caller's), the
  disk's format from nova's records, for a qcow2 disk its header check and
  ``qemu-img info`` (formats.check_qcow2_disk), the facts of its
  filesystem (fsprobe.facts); what the operation itself made or read is
  passed on, never read again (an overlay it created: its ``qemu-img
  info`` from qemu.check_overlay, its base's size from formats.checked_base);
* the disk's mode, decided once (modes.disk_mode);
* the plan of the work (diskplan.make_plan), free space checked there,
  once, before the work;
* the steps, each handed to the executors (disk/) with that data: an
  overlay made (``create_overlay``), a disk grown (``grow``: raw, or qcow2
  re-laid out first where its layout cannot be preallocated), the blocks
  of a file allocated (``allocate``), the guest's disk settings
  (``guest_disk``: discard, ``<metadata_cache>``, ``<blockio>``, the
  driver's io mode).

A fact is read again only after the operation itself changed it: a
re-layout or a growth rewrote the disk (``disk_changed``), or fallocate(2)
proved unsupported on the filesystem (``replan_without_fallocate``).
Nothing below the operation calls back into it: executors take data and
return results (allocate.fallocate_file says whether fallocate(2) was
there; allocate.zero_fill yields between its calls, where the operation
checks that the instance is not being deleted). It knows nova's instance
(flavor, task state) but never nova's image object: backend.py hands it
paths, sizes and formats.
"""

import contextlib
import os
import threading

from nova.compute import task_states
from nova import exception as nova_exception
from nova import objects
from oslo_log import log as logging

from prealloc_backend.adapter import guestxml
from prealloc_backend import conf
from prealloc_backend.disk import allocate
from prealloc_backend.disk import extend
from prealloc_backend.disk import formats
from prealloc_backend.disk import fsprobe
from prealloc_backend.disk import hostcaps
from prealloc_backend.disk import qcow2
from prealloc_backend import exception
from prealloc_backend.planner import diskplan
from prealloc_backend.planner import modes
from prealloc_backend.planner import qcow2_layout
from prealloc_backend.system import fileops

LOG = logging.getLogger(__name__)
CONF = conf.CONF


class Migration:
    """A migration being finished on this host (finish_migration): the
    instance, and the format the source host's domain XML gave each of its
    disks (disk file name -> format). That record wins over disk.info,
    which a move can leave stale or lose.
    """

    def __init__(self, instance, formats):
        self.instance = instance
        self.formats = dict(formats)

    def owns(self, path):
        """``path`` is a disk of this migration's instance."""
        return os.path.basename(os.path.dirname(path)) == self.instance.uuid

    def format_of(self, path):
        """The format the source recorded for the disk at ``path``, or
        None.
        """
        if not self.owns(path):
            return None
        return self.formats.get(os.path.basename(path))

    def converted(self, path, fmt):
        """nova (or a crash's recovery) converted the disk at ``path`` to
        ``fmt`` during the move: the record says so from now on.
        """
        if self.owns(path):
            self.formats[os.path.basename(path)] = fmt


class Migrations:
    """The migrations the driver is finishing on this host, by instance.

    nova hands finish_migration's record to the image backend through its
    own code (``_create_image``, ``_disk_raw_to_qcow2``, the image
    classes), with no argument to carry it: the driver registers the
    Migration here for the duration of finish_migration, and each
    DiskOperation of a disk of that instance is given it. nova holds the
    instance's lock meanwhile: one migration per instance at a time.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._by_uuid = {}

    @contextlib.contextmanager
    def finishing(self, instance, formats):
        migration = Migration(instance, formats)
        with self._lock:
            previous = self._by_uuid.get(instance.uuid)
            self._by_uuid[instance.uuid] = migration
        try:
            yield migration
        finally:
            with self._lock:
                if previous is None:
                    self._by_uuid.pop(instance.uuid, None)
                else:
                    self._by_uuid[instance.uuid] = previous

    def of_path(self, path):
        """The Migration whose instance owns the disk at ``path``, or
        None.
        """
        uuid = os.path.basename(os.path.dirname(path or ''))
        with self._lock:
            return self._by_uuid.get(uuid)


# The driver's: one nova-compute runs one driver.
MIGRATIONS = Migrations()


def check_not_deleted(instance, path):
    """Raise AllocationCancelled when ``instance`` is being deleted.

    Zero-filling a large disk takes minutes; a user deleting the server
    meanwhile should not wait for it, nor leave the disk behind. Nothing
    is checked for an instance without a context (no database to ask).
    """
    context = getattr(instance, '_context', None)
    if instance is None or context is None:
        return
    try:
        current = objects.Instance.get_by_uuid(context, instance.uuid,
                                               expected_attrs=[])
    except nova_exception.InstanceNotFound:
        raise exception.AllocationCancelled(
            path=path, reason='the instance was deleted')
    if current.task_state == task_states.DELETING or current.deleted:
        raise exception.AllocationCancelled(
            path=path, reason='the instance is being deleted')


def flavor_extra_specs(instance):
    """The instance's flavor extra specs; {} when there is no instance.

    NOTE(nova): read only when the caller loaded the flavor
    (``obj_attr_is_set``): reading ``instance.flavor`` otherwise makes
    nova lazy-load it from the database, which fails with
    OrphanedObjectError on an instance without a context. Every nova path
    that creates or grows a disk (spawn, rebuild, unshelve, resize,
    migration, hard reboot, rescue) passes an instance with its flavor.
    """
    if instance is None:
        return {}
    try:
        if not instance.obj_attr_is_set('flavor'):
            return {}
        return dict(instance.flavor.extra_specs or {})
    except (AttributeError, NotImplementedError,
            nova_exception.ObjectActionError):
        return {}


def disk_mode(extra_specs):
    """The mode of a disk of a flavor with ``extra_specs`` on this host."""
    return modes.disk_mode(extra_specs, modes.host_mode(CONF))


def plan_new_disk(extra_specs, path, fmt, virtual_size, backing=True,
                  directory=None):
    """The DiskPlan of a new disk this host would make at ``path`` (what a
    DiskOperation plans for it), without making it and without raising
    for space: ``fits`` and ``to_allocate`` say. For the checks a
    migration's destination makes before anything moves: ``directory``
    names the filesystem to probe while the disk's own directory does not
    exist yet.
    """
    mode = disk_mode(extra_specs)
    fs = None
    if mode.preallocates:
        fs = fsprobe.facts(directory or os.path.dirname(path))
    return diskplan.make_plan(CONF.prealloc_backend, extra_specs, mode, fmt,
                              virtual_size, fs, backing=backing, path=path)


def finishing_migration(instance):
    """``instance`` is being finished on this host by a resize or a cold
    migration (its task_state RESIZE_FINISH), read without a lazy-load (an
    instance without a context raises).
    """
    return (instance is not None and
            getattr(instance, 'obj_attr_is_set', None) is not None and
            instance.obj_attr_is_set('task_state') and
            instance.task_state == task_states.RESIZE_FINISH)


def flushed(fetch_func):
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


class DiskOperation:
    """The facts, mode and plan of one nova call for the disk at ``path``,
    and its steps.

    ``extra_specs``: the flavor's (read by the caller, once); ``made_as``:
    the format the calling backend makes disks in ('raw' or 'qcow2');
    ``disk_info_path``: nova's disk.info of the instance; ``migration``:
    the operation.Migration being finished on this host, if any (the
    source's record of each disk's format); ``instance``: nova's, for its
    deletion and its task state.
    """

    def __init__(self, path, extra_specs, made_as=None, disk_info_path=None,
                 migration=None, instance=None):
        self.path = path
        self.extra_specs = extra_specs or {}
        self.made_as = made_as
        self.disk_info_path = disk_info_path
        self.migration = migration
        self.instance = instance
        self.mode = disk_mode(self.extra_specs)
        # The plan of the work, once made (plan()).
        self.plan = None
        self._fs = None
        self._format = None
        self._refusal_logged = False
        self._qcow2 = None
        self._backing = True
        # The ImageInfo of the overlay this operation made, checked as a
        # disk read from the records is.
        self._made = None
        # {path: virtual size} of the images this operation read.
        self._sizes = {}

    @property
    def opts(self):
        return CONF.prealloc_backend

    # -- facts, read once ---------------------------------------------

    def fs(self):
        """The FsFacts of the disk's filesystem, probed once."""
        if self._fs is None:
            self._fs = fsprobe.facts(os.path.dirname(self.path))
        return self._fs

    def _migration_format(self):
        if self.migration is None:
            return None
        return self.migration.format_of(self.path)

    def _decide_format(self):
        if self._made is not None:
            # Made by this operation: what it made is known, and checked
            # as a disk read from the records is (formats.checked_overlay).
            return (diskplan.DiskFormat.QCOW2,
                    formats.checked_overlay(self.path, self._made))
        return formats.checked_format(
            self.path, self.disk_info_path, self.made_as,
            migration_format=self._migration_format())

    def disk_format(self):
        """The DiskFormat of this existing disk (formats.checked_format),
        decided once (the refusal too: raised again on each call, never
        re-read).
        """
        if self._format is None:
            try:
                fmt, checked = self._decide_format()
            except (exception.UnsafeDiskHeader,
                    exception.DiskFormatMismatch) as exc:
                self._format = exc
            else:
                self._format = fmt
                if checked is not None:
                    self._qcow2 = checked
        if isinstance(self._format, Exception):
            raise self._format
        return self._format

    def existing_format(self):
        """disk_format, or None where it is refused (a disk that already
        holds a guest's data: its start is never failed for it): the
        refusal logged once, the disk left as it is.
        """
        try:
            return self.disk_format()
        except (exception.UnsafeDiskHeader,
                exception.DiskFormatMismatch) as exc:
            if not self._refusal_logged:
                self._refusal_logged = True
                LOG.warning('%(path)s left as it is, not allocated: '
                            '%(err)s',
                            {'path': self.path, 'err': exc.format_message()})
            return None

    def checked_qcow2(self):
        """formats.Checked of this qcow2 disk: its checked backing file and
        ImageInfo, read once until the disk changes.
        """
        if self._qcow2 is None:
            self._qcow2 = formats.check_qcow2_disk(self.path)
        return self._qcow2

    def qcow2_existing(self):
        """The ExistingDisk of this qcow2 disk, from checked_qcow2's
        ImageInfo and the file's allocation now.
        """
        return qcow2.existing_from(self.path, self.checked_qcow2().info)

    def raw_existing(self):
        """The ExistingDisk of this file as it is now (its blocks)."""
        st = os.stat(self.path)
        return diskplan.ExistingDisk(allocated_bytes=st.st_blocks * 512,
                                     virtual_size=st.st_size)

    def disk_changed(self):
        """The operation rewrote or grew the disk: its ``qemu-img info``
        is read again when next needed (its format and record stand).
        """
        self._qcow2 = None
        self._made = None

    def known_size(self, path):
        """The virtual size of the image at ``path`` (a base) as this
        operation read it, or None: nova's Image.cache() asks it again.
        """
        return self._sizes.get(path)

    # -- the plan -------------------------------------------------------

    def make_plan(self, fmt, virtual_size, existing=None, backing=True):
        """The plan of this operation's work, kept as ``plan``; the
        filesystem is probed unless the mode is none. Raises
        InsufficientDiskSpace when the work does not fit: the one check of
        free space before the work.
        """
        self._backing = backing
        fs = self.fs() if self.mode.preallocates else None
        plan = diskplan.make_plan(self.opts, self.extra_specs, self.mode,
                                  fmt, virtual_size, fs, backing=backing,
                                  existing=existing, path=self.path)
        self.plan = plan
        if plan.warning:
            LOG.warning('%(path)s: %(warning)s',
                        {'path': self.path, 'warning': plan.warning})
        if not plan.fits:
            raise exception.InsufficientDiskSpace(
                path=self.path, needed=plan.to_allocate,
                free=fs.free_bytes, directory=os.path.dirname(self.path))
        return plan

    def replan_without_fallocate(self):
        """fallocate(2) proved unsupported on the disk's filesystem (the
        executor recorded it with fsprobe): the same work planned again
        with the filesystem's new facts, by the options' policy
        (``fallocate_unsupported``).
        """
        old = self.plan
        self._fs = None
        existing = None
        if old.existing:
            existing = (self.raw_existing()
                        if old.fmt is diskplan.DiskFormat.RAW
                        else self.qcow2_existing())
        return self.make_plan(old.fmt, old.virtual_size, existing=existing,
                              backing=self._backing)

    # -- a new overlay ----------------------------------------------------

    def create_overlay(self, size, base, base_info, locked=None):
        """Make the disk a qcow2 overlay of ``base`` (nova's QemuImgInfo
        ``base_info``, formats.checked_base's) of ``size`` bytes or the
        base's, laid out by this operation's plan (qcow2.create_overlay),
        inside ``locked`` (a decorator: nova's lock of the base). What it
        made is this operation's reading of the disk from then on.
        """
        self._sizes[base] = base_info.virtual_size
        virtual_size = max(size or 0, base_info.virtual_size)
        plan = self.make_plan(diskplan.DiskFormat.QCOW2, virtual_size)
        create = qcow2.create_overlay
        if locked is not None:
            create = locked(create)
        made = create(self.path, virtual_size, base, base_info.file_format,
                      plan, timeout=self.opts.allocation_timeout)
        self._made = made

    # -- growth -----------------------------------------------------------

    def grow(self, size):
        """Grow the disk to ``size`` in its recorded format (raw or qcow2,
        see disk_format), preallocating as planned; then the guest
        filesystem where nova would resize it.
        """
        try:
            fmt = self.disk_format()
        except (exception.UnsafeDiskHeader,
                exception.DiskFormatMismatch):
            # nova's cache() asks every existing disk to grow to its
            # flavor's size (a hard reboot too): one already that large is
            # left as it is (logged), never failing the instance's start;
            # growing a refused disk is refused.
            if formats.virtual_size_unchecked(self.path) >= size:
                self.existing_format()
                return
            raise
        if fmt is diskplan.DiskFormat.RAW:
            extend.grow_raw(self.path, size)
            return
        if self._grow_qcow2(size) and CONF.resize_fs_using_block_device:
            extend.resize_qcow2_fs(self.path)

    def _grow_qcow2(self, size):
        """Grow a qcow2 file (checked by disk_format) to ``size``,
        preallocating the new area: one plan, for the disk at its new
        size. False where it is that large already.
        """
        existing = self.qcow2_existing()
        if size <= existing.virtual_size:
            return False
        backing = self.checked_qcow2().backing
        if (backing and not existing.extended_l2 and
                self.mode.preallocates and self.opts.qcow2_extended_l2):
            # Rewritten first with the plan's layout, then grown by the
            # same plan: planned as a new disk of its new size.
            plan = self.make_plan(diskplan.DiskFormat.QCOW2, size)
            if self._relayout(plan):
                self.disk_changed()
            else:
                # Left as it is (a backing name qemu-img cannot take):
                # grown thin, as its layout allows.
                plan = self.make_plan(diskplan.DiskFormat.QCOW2, size,
                                      existing=existing, backing=True)
        else:
            plan = self.make_plan(diskplan.DiskFormat.QCOW2, size,
                                  existing=existing, backing=bool(backing))
        qcow2.grow(self.path, existing.virtual_size, plan,
                   timeout=self.opts.allocation_timeout)
        self.disk_changed()
        return True

    def _relayout(self, plan):
        """Rewrite an overlay without extended_l2 (stock nova's, or the
        plugin's mode none) with ``plan``'s layout, before it grows
        (qcow2.relayout_overlay), from its backing file as the check
        resolved it, never as read from the header again.

        QEMU cannot preallocate an overlay with a backing file without
        extended_l2, so a disk made in mode none and resized to a flavor
        asking for metadata, space or full would stay thin. Only while
        nova grows a disk (resize, spawn), never under a running guest.
        False where it is left as it is (qcow2.relayout_overlay).
        """
        checked = self.checked_qcow2()
        return qcow2.relayout_overlay(self.path, checked.backing,
                                      checked.backing_fmt, plan,
                                      timeout=self.opts.allocation_timeout)

    # -- allocation -------------------------------------------------------

    def allocate(self, fmt, created):
        """Allocate the blocks of the disk as it now is (``fmt``, its
        DiskFormat: nova's record or disk_format; None: nothing to do), by
        the mode: a raw file's holes (allocate_file), or a qcow2 disk nova
        copied (allocate_copied_qcow2). ``created``: this cache() made it.
        """
        if fmt is None or self.mode is modes.Mode.NONE:
            return
        if fmt is diskplan.DiskFormat.RAW:
            self.allocate_file(created)
        elif not created:
            self.allocate_copied_qcow2()

    def allocate_copied_qcow2(self):
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
        if self.mode in (modes.Mode.SPACE, modes.Mode.FULL):
            self.allocate_file(created=False)
        elif (self.mode is modes.Mode.METADATA and
                finishing_migration(self.instance)):
            allocate.dig_holes(self.path)

    def allocate_file(self, created):
        """Allocate the holes of the file as it is now, as the plan says
        (allocate_raw). A disk that existed before is planned as such:
        never failed for space, left thin. A qcow2 disk this operation just
        grew (or re-laid out and grew) is filled by its growth plan where
        that plan preallocates (falloc, full), which counted the holes (an
        existing disk's st_blocks; a re-laid out disk is planned whole); a
        growth left thin (no room, no extended_l2) has the file's holes
        planned as a raw file's, as before the growth.
        """
        plan = self.plan
        if (plan is not None and plan.fmt is diskplan.DiskFormat.QCOW2 and
                raw_action(plan) is not diskplan.RawAction.NOTHING):
            self.allocate_raw(plan)
            return
        existing = None if created else self.raw_existing()
        size = os.stat(self.path).st_size
        if (plan is None or plan.fmt is not diskplan.DiskFormat.RAW or
                plan.existing or existing is not None or
                plan.virtual_size != size):
            # Not the plan this operation checked before the work (made
            # for another size, or an existing disk): planned now.
            plan = self.make_plan(diskplan.DiskFormat.RAW, size,
                                  existing=existing)
        self.allocate_raw(plan)

    def allocate_raw(self, plan):
        """Allocate the holes of the file as ``plan`` says: a raw plan of
        this file as it is, or the growth plan of a qcow2 disk whose file
        nova copied (holes where the source reserved blocks: refilled as
        its preallocation reserves them). fallocate(2), or the zero-fill
        the plan (or its remake where fallocate(2) proved unsupported)
        asks for, with the instance's deletion checked between zero-fill
        calls.
        """
        action = raw_action(plan)
        if action is diskplan.RawAction.FALLOCATE:
            if allocate.fallocate_file(self.path):
                return
            action = raw_action(self.replan_without_fallocate())
        if action is not diskplan.RawAction.ZERO_FILL:
            return
        for _progress in allocate.zero_fill(
                self.path, os.stat(self.path).st_size,
                self.opts.allocation_timeout, self.opts.progress_interval):
            check_not_deleted(self.instance, self.path)

    # -- the guest's disk settings ----------------------------------------

    def guest_disk(self, driver_format, nova_discard):
        """The guestxml.GuestDisk of this disk as it is (the plan of
        diskplan.disk_as_is, kept as ``plan``), whose format nova records
        as ``driver_format`` and whose discard nova sets to
        ``nova_discard`` (``[libvirt] hw_disk_discard``). Only a qcow2
        disk's layout is read (``qemu-img info -f qcow2``), and only where
        it gives a ``<metadata_cache>`` or a ``<blockio>``. A guest's
        discard that frees what the mode reserved has those blocks
        reserved again here (_reserve_again).
        """
        fmt = (diskplan.DiskFormat.QCOW2 if driver_format == 'qcow2'
               else diskplan.DiskFormat.RAW)
        existing = None
        if (diskplan.layout_shown(self.opts, self.mode, fmt) and
                os.path.exists(self.path)):
            try:
                existing, _info = qcow2.existing(self.path)
            except exception.PreallocError as exc:
                LOG.warning('No <metadata_cache> or <blockio> for %(path)s: '
                            '%(err)s', {'path': self.path, 'err': exc})
        plan = diskplan.disk_as_is(self.opts, self.mode, fmt, existing)
        self.plan = plan
        discard = self._guest_discard(plan, nova_discard)
        if discard.reserve_again:
            self._reserve_again()
        return guestxml.GuestDisk(
            # As nova does for preallocate_images=space (it turns 'native'
            # back into 'threads' when the cache mode needs it).
            driver_io='native' if plan.mode.preallocates else None,
            discard=discard.discard, discard_no_unref=discard.no_unref,
            physical_block_size=plan.physical_block_size,
            metadata_cache_bytes=plan.metadata_cache_bytes)

    def _guest_discard(self, plan, nova_discard):
        """diskplan.GuestDiscard of this disk; the host's QEMU and libvirt
        are asked about discard-no-unref (once per process) only for the
        disks that could use it.
        """
        choice = self.opts.guest_discard
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


# How a qcow2 plan's preallocation fills the holes of its file.
_QCOW2_FILL = {
    qcow2_layout.Qcow2Preallocation.FALLOC: diskplan.RawAction.FALLOCATE,
    qcow2_layout.Qcow2Preallocation.FULL: diskplan.RawAction.ZERO_FILL,
}


def raw_action(plan):
    """What filling the holes of a plan's file means: a raw plan's
    ``raw_action``; for a qcow2 plan, fallocate(2) where it preallocates
    with falloc, zeros where with full, nothing otherwise.
    """
    if plan.fmt is diskplan.DiskFormat.RAW:
        return plan.raw_action or diskplan.RawAction.NOTHING
    return _QCOW2_FILL.get(plan.preallocation, diskplan.RawAction.NOTHING)
