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
reboot, resize and migration targets). The subclasses here keep nova's
methods and their order, and hand each call to one
operation.DiskOperation (``op``), which decides and carries out the steps
(operation.py): qcow2 overlays created with extended_l2, a cluster size
chosen for the disk and ``preallocation=`` for the mode; qcow2 disks grown
with ``qemu-img resize --preallocation`` (re-laid out first where needed);
raw disks allocated after nova made them (fallocate, or zero-fill of the
holes, through the plugin's privsep daemon); ``<metadata_cache>``,
``<blockio>`` and the discard settings of the guest XML. What stays here is
nova's side of each call:

* which operation a call belongs to: ``cache()``'s steps (create_image,
  resize_image, the allocation) share one, ``libvirt_info`` has its own;
* the journal around ``cache()`` (journal.py), so that a creation
  interrupted by a crash is removed, not reused, next time;
* nova's own ``fallocate -n`` switched off (``self.preallocate``), which
  inflates metadata-mode overlays to full allocation;
* a disk's format from nova's records, never from its header alone
  (resolve_driver_format, _get_driver_format: formats.py).

LVM, RBD and ploop keep nova's classes and behaviour. Everything here runs
as the nova-compute user; only allocate.py's calls go to the privileged
daemon.
"""

import os
import threading

from nova import utils as nova_utils
from nova.virt.libvirt import imagebackend
from oslo_log import log as logging
from oslo_utils import fileutils

from prealloc_backend.adapter import guestxml
from prealloc_backend.adapter import operation
from prealloc_backend import conf
from prealloc_backend.disk import formats
from prealloc_backend.disk import journal
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
            super().cache(operation.flushed(fetch_func), filename, size,
                          safe, *args, **kwargs)
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

    def _check_space_for_new_disk(self, size):
        """Hook: fail early when a disk about to be made cannot fit."""

    def _allocate_existing(self, created):
        """Hook: allocate the blocks of the disk as it now is."""

    def _grow(self, size):
        self._operation().grow(size)

    def get_disk_size(self, name):
        # NOTE(nova): Image.cache() asks the base's virtual size after
        # create_image, which read it (formats.checked_base): the
        # operation answers from that reading.
        known = self.op.known_size(name) if self._in_cache else None
        if known is not None:
            return known
        return super().get_disk_size(name)

    def libvirt_info(self, cache_mode, extra_specs, boot_order=None,
                     disk_unit=None):
        # extra_specs: the flavor's, which nova passes here. nova builds
        # the XML with an image object of its own, after the operation that
        # made the disk: this is that object's operation.
        op = self._new_operation(extra_specs or {})
        guest = op.guest_disk(self.driver_format, self.discard_mode)
        self.driver_io = guest.driver_io
        info = super().libvirt_info(cache_mode, extra_specs,
                                    boot_order=boot_order,
                                    disk_unit=disk_unit)
        return guestxml.apply(info, guest)


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
        # By nova's record (driver_format): a raw file, or a qcow2 disk on
        # a raw host (nova keeps a migrated overlay qcow2, it never
        # converts to raw), to which this host's mode applies.
        if self._is_instance_disk() and self.exists():
            self.op.allocate(formats.FORMATS.get(self.driver_format),
                             created)


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
        op = self._operation()
        if self.exists():
            # An existing disk (a migration's, a hard reboot's) whose base
            # this host may not have yet: fetched first, as nova does, so
            # that an overlay's backing file exists when it is checked.
            if not os.path.exists(base):
                prepare_template(target=base, *args, **kwargs)
            fmt = op.existing_format()
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
        if self.exists() or op.mode is modes.Mode.NONE:
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
        self.verify_base_size(base, size, base_size=base_info.virtual_size)
        op.create_overlay(size, base, base_info, nova_utils.synchronized(
            self._get_lock_name(base), external=True,
            lock_path=self.lock_path))

    def _allocate_existing(self, created):
        # A raw disk in a qcow2 instance (a migration from a raw host,
        # before nova converts it) is allocated as a raw file; the format
        # decided by the operation, checked (a refused disk: None).
        if self.exists() and not created:
            self.op.allocate(self.op.existing_format(), created)

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
