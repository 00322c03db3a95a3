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
(backend.py makes it). It

* reads the facts once: the flavor's extra specs (the caller's), the
  disk's format from nova's records, for a qcow2 disk its header check and
  ``qemu-img info`` (formats.check_qcow2_disk), the facts of its
  filesystem (fsprobe.facts);
* decides the disk's mode once (modes.disk_mode);
* makes the plan of the work (diskplan.make_plan), checking free space
  there, once, before the work;
* and hands that data to the executors (disk/) in order.

A fact is read again only after the operation itself changed it: a
re-layout or a growth rewrote the disk (``disk_changed``), or fallocate(2)
proved unsupported on the filesystem (``replan_without_fallocate``).
Nothing below the operation calls back into it: executors take data and
return results (allocate.fallocate_file says whether fallocate(2) was
there; allocate.zero_fill yields between its calls, where the operation
checks that the instance is not being deleted).
"""

import contextlib
import os
import threading

from nova.compute import task_states
from nova import exception as nova_exception
from nova import objects
from oslo_log import log as logging

from prealloc_backend import conf
from prealloc_backend.disk import allocate
from prealloc_backend.disk import formats
from prealloc_backend.disk import fsprobe
from prealloc_backend.disk import qcow2
from prealloc_backend import exception
from prealloc_backend.planner import diskplan
from prealloc_backend.planner import modes
from prealloc_backend.planner import qcow2_layout

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


class DiskOperation:
    """The facts, mode and plan of one nova call for the disk at ``path``.

    ``extra_specs``: the flavor's (read by the caller, once); ``made_as``:
    the format the calling backend makes disks in ('raw' or 'qcow2');
    ``disk_info_path``: nova's disk.info of the instance; ``migration``:
    the operation.Migration being finished on this host, if any (the
    source's record of each disk's format).
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

    def disk_format(self):
        """The DiskFormat of this existing disk (formats.checked_format),
        decided once (the refusal too: raised again on each call, never
        re-read).
        """
        if self._format is None:
            try:
                fmt, checked = formats.checked_format(
                    self.path, self.disk_info_path, self.made_as,
                    migration_format=self._migration_format())
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
        ``qemu-img info``, read once until the disk changes.
        """
        if self._qcow2 is None:
            self._qcow2 = formats.check_qcow2_disk(self.path)
        return self._qcow2

    def qcow2_existing(self):
        """The ExistingDisk of this qcow2 disk, from checked_qcow2's
        ``qemu-img info`` and the file's allocation now.
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

    # -- raw allocation ---------------------------------------------------

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
