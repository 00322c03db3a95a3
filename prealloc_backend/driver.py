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

"""The compute driver: nova's LibvirtDriver with the preallocating backend.

nova 34 imports compute drivers only from the ``nova.virt`` package
(``importutils.import_object('nova.virt.' + compute_driver)``), so
``compute_driver = prealloc_backend.driver.LibvirtDriver`` cannot work.
``register()`` makes this module importable as ``nova.virt.prealloc_backend``
without writing into nova's files; the ``prealloc-nova-compute`` console
script calls it and then runs nova-compute unchanged, with::

    [DEFAULT]
    compute_driver = prealloc_backend.LibvirtDriver
"""

import os
import shutil
import sys
import threading
import typing as ty

from nova.compute import task_states
from nova.compute import utils as compute_utils
from nova.compute import vm_states
from nova import context as nova_context
from nova import exception as nova_exception
from nova.network import model as network_model
from nova import objects
import nova.virt
from nova.virt.libvirt import driver as libvirt_driver
from nova.virt.libvirt import utils as libvirt_utils
from oslo_config import cfg
from oslo_log import log as logging
from oslo_serialization import jsonutils
from oslo_utils import units

from prealloc_backend import backend
from prealloc_backend import conf
from prealloc_backend import exception
from prealloc_backend import fsprobe
from prealloc_backend import modes
from prealloc_backend import policy
from prealloc_backend import qemu

LOG = logging.getLogger(__name__)
CONF = conf.CONF

# compute_driver = <COMPUTE_DRIVER> once register() has run.
NOVA_VIRT_NAME = 'prealloc_backend'
COMPUTE_DRIVER = NOVA_VIRT_NAME + '.LibvirtDriver'
# The instance-action event of the plugin's disk work (`openstack server
# event show`): one per host that made (or failed to make) the disks.
DISK_EVENT = 'compute_prealloc_disks'


def register():
    """Make this module importable as ``nova.virt.prealloc_backend``."""
    module = sys.modules[__name__]
    sys.modules.setdefault('nova.virt.' + NOVA_VIRT_NAME, module)
    if not hasattr(nova.virt, NOVA_VIRT_NAME):
        setattr(nova.virt, NOVA_VIRT_NAME, module)


def _overlay_images_type():
    """True when the instance disks of this host are qcow2 overlays."""
    images_type = CONF.libvirt.images_type
    return images_type == 'qcow2' or (images_type == 'default' and
                                      CONF.use_cow_images)


def _check_options():
    """Read every [prealloc_backend] option once, at start-up.

    oslo.config checks a value when it is first read: without this, a bad
    progress_interval would first fail in the middle of a zero-fill.
    """
    for opt in conf.prealloc_opts:
        try:
            value = getattr(CONF.prealloc_backend, opt.dest)
        except cfg.ConfigSourceValueError as exc:
            reason = str(exc).split(' is not valid: ', 1)[-1]
            raise exception.InvalidOption(group=conf.GROUP_NAME,
                                          name=opt.name, reason=reason,
                                          allowed=conf.allowed(opt))
        if value is None and opt.default is not None:
            raise exception.InvalidOption(group=conf.GROUP_NAME,
                                          name=opt.name,
                                          reason='an empty value',
                                          allowed=conf.allowed(opt))


def validate_config():
    """Refuse invalid and contradictory settings at start-up, naming the
    options.

    Returns the host's mode.
    """
    _check_options()
    mode = modes.host_mode(CONF)
    opts = CONF.prealloc_backend
    if (mode.preallocates and not opts.qcow2_extended_l2 and
            _overlay_images_type()):
        raise exception.ConflictingOptions(
            reason='[prealloc_backend] qcow2_extended_l2 = False with mode '
                   '%s: the instance disks are qcow2 overlays (images_type=%s'
                   ', use_cow_images=%s) and QEMU cannot preallocate an '
                   'overlay without extended_l2; set qcow2_extended_l2 = True '
                   'or mode = none' % (mode.value, CONF.libvirt.images_type,
                                       CONF.use_cow_images))
    if opts.mode is not None and opts.mode != CONF.preallocate_images:
        LOG.info('[prealloc_backend] mode = %(mode)s overrides [DEFAULT] '
                 'preallocate_images = %(nova)s for instance disks',
                 {'mode': opts.mode, 'nova': CONF.preallocate_images})
    return mode


class LibvirtDriver(libvirt_driver.LibvirtDriver):
    """nova's libvirt driver whose image backend preallocates disks."""

    def __init__(self, virtapi, read_only=False):
        super().__init__(virtapi, read_only=read_only)
        mode = validate_config()
        self._migrating = threading.local()
        self.image_backend = backend.Backend(CONF.use_cow_images)
        LOG.info('prealloc_backend: host mode %(mode)s, images_type '
                 '%(type)s, qcow2 extended_l2 %(ext)s, cluster size '
                 '%(cluster)s, L2 cache %(cache)s',
                 {'mode': mode.value, 'type': CONF.libvirt.images_type,
                  'ext': CONF.prealloc_backend.qcow2_extended_l2,
                  'cluster': CONF.prealloc_backend.qcow2_cluster_size,
                  'cache': CONF.prealloc_backend.qcow2_l2_cache})

    def _disk_raw_to_qcow2(self, path):
        """A raw disk that arrived on a qcow2 host becomes qcow2 here.

        nova converts it thin (``qemu-img convert -O qcow2``), after its
        _create_image already ran, so the destination's policy would never
        apply. The plugin converts it with the plan's layout instead: a
        standalone qcow2 (no backing file) with the mode's
        ``preallocation=``, cluster size and extended_l2, checked for room
        first; without room (an existing guest's disk is never failed for
        space) or in mode none, nova's own thin conversion.
        """
        # nova calls this static method from finish_migration without the
        # instance, right after _create_image (below) in the same thread.
        instance = getattr(self._migrating, 'instance', None)
        if instance is not None and instance.uuid not in path:
            instance = None
        extra_specs = backend._extra_specs(instance)
        mode = modes.instance_mode(CONF, extra_specs)
        if mode is modes.Mode.NONE:
            super()._disk_raw_to_qcow2(path)
        else:
            self._convert_raw_to_qcow2(path, extra_specs, mode)
        # NOTE: nova leaves disk.info saying 'raw' for the converted disk
        # (it never rewrites an entry): the record now says what it is.
        backend.converted(path, 'qcow2')

    def _convert_raw_to_qcow2(self, path, extra_specs, mode):
        directory = os.path.dirname(path)
        plan = policy.make_plan(
            CONF.prealloc_backend, extra_specs, mode, policy.DiskFormat.QCOW2,
            os.stat(path).st_size, fsprobe.facts(directory), backing=False,
            path=path)
        if not plan.fits:
            LOG.warning('%(path)s: converted to qcow2 thin: %(need)d bytes '
                        'needed to preallocate it, %(free)d free',
                        {'path': path, 'need': plan.to_allocate,
                         'free': fsprobe.facts(directory).free_bytes})
            return super()._disk_raw_to_qcow2(path)
        tmp = path + '_qcow'
        try:
            qemu.execute(
                'convert', '-t', 'none', '-f', 'raw', '-O', 'qcow2', '-o',
                'cluster_size=%d,extended_l2=%s,preallocation=%s' % (
                    plan.cluster_size, 'on' if plan.extended_l2 else 'off',
                    plan.preallocation.value),
                path, tmp, heavy=True,
                timeout=CONF.prealloc_backend.allocation_timeout or None,
                path=path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        os.rename(tmp, path)
        LOG.info('Converted %(path)s from raw to qcow2 with '
                 'preallocation=%(prealloc)s, cluster_size=%(cluster)d',
                 {'path': path, 'prealloc': plan.preallocation.value,
                  'cluster': plan.cluster_size})

    def finish_migration(
        self,
        context: nova_context.RequestContext,
        migration: 'objects.Migration',
        instance: 'objects.Instance',
        disk_info: str,
        network_info: network_model.NetworkInfo,
        image_meta: 'objects.ImageMeta',
        resize_instance: bool,
        allocations: dict[str, ty.Any],
        block_device_info: dict[str, ty.Any] | None = None,
        power_on: bool = True,
        share_info: 'objects.ShareMappingList | None' = None,
    ) -> None:
        # NOTE: disk_info is the source host's list of the instance's disks,
        # each with the format its domain XML gave QEMU ('type'): the
        # record of each disk's format while the move is finished here,
        # over disk.info (which the move may have lost or left stale) and
        # never a header the guest wrote (backend.migration_formats).
        formats = {}
        for info in jsonutils.loads(disk_info or '[]'):
            if info.get('path') and info.get('type'):
                formats[os.path.basename(info['path'])] = info['type']
        with backend.migration_formats(instance.uuid, formats):
            return super().finish_migration(
                context, migration, instance, disk_info, network_info,
                image_meta, resize_instance, allocations,
                block_device_info=block_device_info, power_on=power_on,
                share_info=share_info)

    def _create_image(self, context, instance, disk_mapping, *args,
                      **kwargs):
        # NOTE: every disk nova makes for spawn, rescue and finish_migration
        # is made here: record it as an instance-action event of this host,
        # so that the user sees where disks were made and, when they could
        # not be, why (the event's details), even when nova then
        # reschedules the build and its own events read 'Success'.
        self._migrating.instance = instance
        with _DiskEvent(context, instance):
            return super()._create_image(context, instance, disk_mapping,
                                         *args, **kwargs)

    def spawn(self, context, instance, image_meta, injected_files,
              admin_password, allocations, network_info=None,
              block_device_info=None, power_on=True, accel_info=None):
        evacuating = _evacuating_here(instance)
        instance_dir = (libvirt_utils.get_instance_path(instance)
                        if evacuating else None)
        # Non-shared storage: this spawn makes the instance directory.
        new_dir = evacuating and _missing(instance_dir)
        try:
            return super().spawn(
                context, instance, image_meta, injected_files,
                admin_password, allocations, network_info=network_info,
                block_device_info=block_device_info, power_on=power_on,
                accel_info=accel_info)
        except exception.PreallocError as exc:
            reason = _short_reason(exc)
            if (evacuating and
                    not isinstance(exc, exception.AllocationCancelled)):
                # An evacuation whose disks cannot be made here (no room,
                # no fallocate, ...) is refused instead of failed: for
                # ComputeResourcesUnavailable nova's rebuild_instance
                # keeps the instance as it was (vm_state, and host: the
                # failed host, whose disks nova removes only after an
                # evacuation that did not fail), marks the migration
                # failed and removes this host's allocation; any other
                # error would put the instance in ERROR. The reason is in
                # this host's DISK_EVENT and the instance fault. What this
                # spawn made here goes (the backend already removed the
                # disk it could not make); a directory that was here
                # before (shared storage: the source's disks) stays.
                # NOTE: nova has already bound the server's ports and
                # volume attachments to this host by the time spawn runs
                # (_do_rebuild_instance); nova's own
                # ComputeResourcesUnavailable branch does not undo that.
                # They stay bound here until the next evacuation binds
                # them to its destination (doc/source/admin/migrations.rst).
                if new_dir:
                    LOG.warning('Evacuation refused: removing %s',
                                instance_dir, instance=instance)
                    shutil.rmtree(instance_dir, ignore_errors=True)
                raise nova_exception.ComputeResourcesUnavailable(
                    reason=reason) from exc
            if instance.vm_state != vm_states.BUILDING:
                # Not a first build (rebuild, unshelve): nova's own
                # handling of a failed spawn applies.
                raise
            if isinstance(exc, (nova_exception.Invalid,
                                exception.AllocationCancelled)):
                # The same on every host (an invalid flavor policy or
                # option), or the server is being deleted: no other host
                # would do better.
                raise nova_exception.BuildAbortException(
                    instance_uuid=instance.uuid, reason=reason) from exc
            # A property of this host (no room, no fallocate, a slow or
            # failing disk): let nova try another host. nova's compute
            # manager turns this into a RescheduledException; the reason
            # stays in this host's DISK_EVENT, and in the final fault when
            # [scheduler] max_attempts runs out ("Last exception: ...").
            raise nova_exception.ComputeResourcesUnavailable(
                reason=reason) from exc

    # -- live migration --------------------------------------------------

    def check_source_migrate_data_at_dest(self, ctxt, instance, migrate_data,
                                         migration, limits, allocs):
        # NOTE: the last check nova runs on the destination of a live
        # migration (inside the compute manager's
        # check_can_live_migrate_destination), once the source said whether
        # the instance directory is shared, before anything moves. Refused
        # here (MigrationPreCheckError) the instance stays ACTIVE on its
        # source, nova's conductor tries its next host when the scheduler
        # chose this one, and the reason is the details of the
        # compute_check_can_live_migrate_destination event. Checked before
        # nova's own check, which may reserve mdevs.
        if not _shares_instance_disks(migrate_data):
            path = libvirt_utils.get_instance_path(instance)
            self._check_room(instance, self._flavor_disks(ctxt, instance,
                                                          path),
                             CONF.instances_path)
        return super().check_source_migrate_data_at_dest(
            ctxt, instance, migrate_data, migration, limits, allocs)

    def _create_images_and_backing(self, context, instance, instance_dir,
                                   disk_info, fallback_from_host=None):
        # NOTE: nova's pre_live_migration makes a block live migration's
        # disks here, on the destination. Disks with a backing file go
        # through the image backend (the plugin's overlays), but disks
        # without one (raw files, standalone qcow2) nova makes with
        # libvirt_utils.create_image directly: sparse, unchecked. During a
        # live migration the plugin first checks that all the missing disks
        # fit by this host's plans (the exact disks of the source, where
        # check_source_migrate_data_at_dest could only estimate from the
        # flavor), then makes the raw files through its backend (nova's own
        # create_image, then allocated as planned); nova's loop below skips
        # them as existing. A standalone qcow2 disk stays nova's (thin).
        # A qcow2 overlay arriving on a raw host (use_cow_images = False or
        # images_type = raw; LVM, RBD and ploop hosts keep nova's
        # behaviour) is made as a qcow2 overlay through the
        # plugin's Qcow2, by this host's mode: nova would make a raw copy
        # of the base there (its Flat), which the migrated guest, whose
        # domain XML still says qcow2, cannot open, and the migration
        # fails (stock nova 34 too).
        # In mode full the zero-fill runs inside pre_live_migration: the
        # source waits for it up to [DEFAULT] long_rpc_timeout, then rolls
        # back; the fill itself is bounded by [prealloc_backend]
        # allocation_timeout. Hard reboot (the other caller) is nova's.
        if (_loaded(instance, 'task_state') != task_states.MIGRATING or
                not disk_info):
            return super()._create_images_and_backing(
                context, instance, instance_dir, disk_info,
                fallback_from_host=fallback_from_host)
        with _DiskEvent(context, instance):
            disks = _missing_disks(instance_dir, disk_info)
            self._check_room(instance, disks, instance_dir)
            backing_files = {
                os.path.join(instance_dir, os.path.basename(info['path'])):
                info.get('backing_file') for info in disk_info}
            for path, fmt, size, backing in disks:
                if fmt is policy.DiskFormat.RAW and not backing:
                    self._create_raw_disk(instance, path, size)
                elif (fmt is policy.DiskFormat.QCOW2 and backing and
                      self.image_backend.backend() is backend.Flat):
                    self._create_overlay(context, instance, path, size,
                                         backing_files[path],
                                         fallback_from_host)
            return super()._create_images_and_backing(
                context, instance, instance_dir, disk_info,
                fallback_from_host=fallback_from_host)

    def _create_raw_disk(self, instance, path, size):
        """A raw file of ``size`` made by the backend's Flat: nova's own
        ``create_image`` (what nova makes here), checked for room first and
        allocated by the plan, removed again if that fails.
        """
        image = self.image_backend.backend('raw')(instance=instance,
                                                  path=path)

        def make(target):
            libvirt_utils.create_image(target, 'raw', size)

        # A disk generated in place: nova's Image.cache takes filename as
        # the name of a lock (and of a _base file it never makes here).
        image.cache(fetch_func=make, filename='prealloc-live-migration',
                    size=size)

    def _create_overlay(self, context, instance, path, size, backing_file,
                        fallback_from_host):
        """A qcow2 overlay at ``path`` on its base, as nova's
        _create_images_and_backing makes one (the same three kinds of
        base), but through the qcow2 backend whatever this host's default
        is. nova's loop then finds the disk made.
        """
        disk = self.image_backend.by_name(instance, path, 'qcow2')
        cache_name = os.path.basename(backing_file)
        if cache_name.startswith('ephemeral'):
            disk.cache(fetch_func=self._create_ephemeral,
                       fs_label=self._get_fs_label_ephemeral(0),
                       os_type=instance.os_type, filename=cache_name,
                       size=size, ephemeral_size=size / units.Gi, safe=True)
        elif cache_name.startswith('swap'):
            swap_mb = instance.get_flavor().swap
            disk.cache(fetch_func=self._create_swap,
                       filename='swap_%s' % swap_mb, size=swap_mb * units.Mi,
                       swap_mb=swap_mb, safe=True)
        else:
            self._try_fetch_image_cache(disk, libvirt_utils.fetch_image,
                                        context, cache_name,
                                        instance.image_ref, instance, size,
                                        fallback_from_host)

    def _flavor_disks(self, context, instance, instance_dir):
        """The local disks a block live migration would make here, sized
        from the flavor, in this host's format: the estimate the check
        before the migration can make (the source's disk list reaches this
        host only in pre_live_migration). A root disk sized by its image
        (flavor disk 0) and BDM ephemerals split from the flavor's are left
        to that later, exact check.
        """
        flavor = instance.flavor
        fmt = (policy.DiskFormat.QCOW2 if _overlay_images_type() else
               policy.DiskFormat.RAW)
        disks = []
        if flavor.root_gb and not compute_utils.is_volume_backed_instance(
                context, instance):
            disks.append(('disk', flavor.root_gb * units.Gi))
        if flavor.ephemeral_gb:
            disks.append(('disk.local', flavor.ephemeral_gb * units.Gi))
        if flavor.swap:
            disks.append(('disk.swap', flavor.swap * units.Mi))
        return [(os.path.join(instance_dir, name), fmt, size, True)
                for name, size in disks]

    def _check_room(self, instance, disks, directory):
        """Refuse a live migration whose new disks do not all fit here by
        this host's plans (``backend.plan_new_disk``: the same plan that
        makes each disk): MigrationPreCheckError naming the figures.
        ``disks``: (path, DiskFormat, virtual size, has a backing file).
        """
        if (not disks or self.image_backend.backend() not in (
                backend.Flat, backend.Qcow2)):
            return
        try:
            plans = [backend.plan_new_disk(instance, path, fmt, size,
                                           backing=has_backing,
                                           directory=directory)
                     for path, fmt, size, has_backing in disks]
            free = fsprobe.free_bytes(directory)
        except exception.PreallocError as exc:
            raise nova_exception.MigrationPreCheckError(
                reason=exc.format_message()) from exc
        except OSError as exc:
            # A refusal, never an error: any other exception here would
            # put the instance in ERROR (nova's conductor).
            raise nova_exception.MigrationPreCheckError(
                reason='cannot check the room for the instance\'s disks in '
                       '%s: %s' % (directory, exc)) from exc
        needed = sum(plan.to_allocate for plan in plans)
        if not needed:
            return
        figures = {'host': CONF.host, 'mode': plans[0].mode.value,
                   'needed': needed, 'free': free, 'dir': directory,
                   'disks': len(plans)}
        if needed > free:
            raise nova_exception.MigrationPreCheckError(
                reason='Not enough space on host %(host)s to preallocate '
                       'the instance\'s disks (mode %(mode)s): %(needed)d '
                       'bytes needed, %(free)d bytes free in %(dir)s'
                       % figures)
        LOG.info('Room for a live migration\'s %(disks)d disks in mode '
                 '%(mode)s: %(needed)d bytes needed, %(free)d free in '
                 '%(dir)s', figures, instance=instance)


def _shares_instance_disks(migrate_data):
    """The destination uses the source's disk files (shared instance
    directory or shared block storage): a live migration makes none here.
    """
    return any(migrate_data.obj_attr_is_set(name) and
               getattr(migrate_data, name)
               for name in ('is_shared_instance_path',
                            'is_shared_block_storage'))


def _missing_disks(instance_dir, disk_info):
    """(path, DiskFormat, virtual size, has a backing file) of the source's
    disks (nova's disk_info) that this host must make, in the format it
    makes them: a disk with a backing file as an overlay where disks are
    qcow2 or where the source's disk is a qcow2 overlay (its XML says
    qcow2), else as a raw copy of the base; a raw one without (nova's
    create_image, then the plugin's allocation). Standalone qcow2 disks
    are left out: nova makes them thin and the plugin does not allocate
    them, so they need no room.
    """
    disks = []
    for info in disk_info:
        path = os.path.join(instance_dir, os.path.basename(info['path']))
        if os.path.exists(path):
            continue
        has_backing = bool(info.get('backing_file'))
        if has_backing:
            # An overlay stays one (the guest's XML says qcow2), whatever
            # this host makes for new instances.
            fmt = (policy.DiskFormat.QCOW2
                   if _overlay_images_type() or info.get('type') == 'qcow2'
                   else policy.DiskFormat.RAW)
        elif info.get('type') == 'raw':
            fmt = policy.DiskFormat.RAW
        else:
            # A standalone qcow2 (or other) disk: nova makes it with its
            # own create_image, thin, and the plugin does not allocate it:
            # not counted either.
            continue
        disks.append((path, fmt, int(info['virt_disk_size']), has_backing))
    return disks


def _missing(path):
    """True only when ``path`` does not exist (not on any other error:
    an instance directory on shared storage that cannot be stat'ed for a
    moment is not 'new', and must never be removed as such).
    """
    try:
        os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def _loaded(instance, name):
    """``instance.<name>``, or None when not loaded (never a hidden
    lazy-load: an instance without a context raises).
    """
    if instance is None or not instance.obj_attr_is_set(name):
        return None
    return getattr(instance, name)


def _evacuating_here(instance):
    """This host is spawning an evacuated instance (nova moves
    ``instance.host`` here only once the evacuation succeeded).
    """
    return (_loaded(instance, 'task_state') ==
            task_states.REBUILD_SPAWNING and
            _loaded(instance, 'host') not in (None, CONF.host))


def _short_reason(exc):
    """The reason for nova's fault: nova keeps 255 characters of a fault
    message, and after a rescheduled build's "Exceeded maximum number of
    retries. ... Last exception: Insufficient compute resources: " about 80
    are left: figures first, the disk's path last.
    """
    if isinstance(exc, exception.InsufficientDiskSpace):
        return ('Not enough space to preallocate: %(needed)s bytes needed, '
                '%(free)s bytes free (disk %(path)s)' % exc.kwargs)
    return exc.format_message()


class _DiskEvent:
    """DISK_EVENT of the instance's current action, on this host.

    nova's EventReporter, with two differences:

    * nova finishes "the" event of an action by name (the first row of
      that name), so a rescheduled build's second host would overwrite the
      first host's event: each host's event gets its own name,
      DISK_EVENT, then DISK_EVENT + '_2', '_3'... in the order hosts tried;
    * an instance without a current action (an action-less operation)
      records nothing instead of failing the disk work.
    """

    def __init__(self, context, instance):
        self.context = context
        self.uuid = instance.uuid
        self.name = None

    def _free_name(self):
        action = objects.InstanceAction.get_by_request_id(
            self.context, self.uuid, self.context.request_id)
        if action is None:
            return None
        used = {event.event for event in
                objects.InstanceActionEventList.get_by_action(
                    self.context, action.id)}
        name, attempt = DISK_EVENT, 1
        while name in used:
            attempt += 1
            name = '%s_%d' % (DISK_EVENT, attempt)
        return name

    def __enter__(self):
        if self.context is None:
            return self
        try:
            name = self._free_name()
            if name:
                objects.InstanceActionEvent.event_start(
                    self.context, self.uuid, name, want_result=False,
                    host=CONF.host)
                self.name = name
        except nova_exception.InstanceActionNotFound:
            pass
        if not self.name:
            LOG.debug('No instance action to record %s in', DISK_EVENT)
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        if not self.name:
            return False
        try:
            objects.InstanceActionEvent.event_finish_with_failure(
                self.context, self.uuid, self.name, exc_val=exc_val,
                exc_tb=exc_tb, want_result=False)
        except Exception:
            # Never hide the disk work's own outcome behind the event's.
            LOG.warning('Could not record the %s event', self.name,
                        exc_info=True)
        return False
