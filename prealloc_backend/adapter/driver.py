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
``compute_driver = prealloc_backend.adapter.driver.LibvirtDriver`` cannot work.
``register()`` makes this module importable as ``nova.virt.prealloc_backend``
without writing into nova's files; the ``prealloc-nova-compute`` console
script calls it and then runs nova-compute unchanged, with::

    [DEFAULT]
    compute_driver = prealloc_backend.LibvirtDriver

Each method nova calls hands its work to one module per concern, as
compute-hyperv's driver does: backend.py (the image backend: every disk),
migrationops.py (room checks, a migration's disks, a raw disk converted on
arrival), events.py (the instance-action event, a failed build's outcome),
operation.py (MIGRATIONS: the source host's record of each disk's format
while a migration is finished here), inventory.py (placement's DISK_GB and
the host's trait).
"""

import copy
import os
import sys
import typing as ty

from nova import context as nova_context
from nova.network import model as network_model
from nova import objects
import nova.virt
from nova.virt.libvirt import driver as libvirt_driver
from nova.virt.libvirt import utils as libvirt_utils
from oslo_log import log as logging
from oslo_serialization import jsonutils

from prealloc_backend.adapter import backend
from prealloc_backend.adapter import events
from prealloc_backend.adapter import inventory
from prealloc_backend.adapter import migrationops
from prealloc_backend.adapter import operation
from prealloc_backend.adoption import recovery
from prealloc_backend import conf
from prealloc_backend.disk import hostcaps
from prealloc_backend import exception
from prealloc_backend.planner import hostpolicy

LOG = logging.getLogger(__name__)
CONF = conf.CONF

# compute_driver = <COMPUTE_DRIVER> once register() has run.
NOVA_VIRT_NAME = 'prealloc_backend'
COMPUTE_DRIVER = NOVA_VIRT_NAME + '.LibvirtDriver'
DISK_EVENT = events.DISK_EVENT


def register():
    """Make this module importable as ``nova.virt.prealloc_backend``."""
    module = sys.modules[__name__]
    sys.modules.setdefault('nova.virt.' + NOVA_VIRT_NAME, module)
    if not hasattr(nova.virt, NOVA_VIRT_NAME):
        setattr(nova.virt, NOVA_VIRT_NAME, module)


class LibvirtDriver(libvirt_driver.LibvirtDriver):
    """nova's libvirt driver whose image backend preallocates disks."""

    def __init__(self, virtapi, read_only=False):
        super().__init__(virtapi, read_only=read_only)
        mode = hostpolicy.validate(CONF)
        self.image_backend = backend.Backend(CONF.use_cow_images)
        LOG.info('prealloc_backend: host mode %(mode)s, images_type '
                 '%(type)s, qcow2 extended_l2 %(ext)s, cluster size '
                 '%(cluster)s, L2 cache %(cache)s',
                 {'mode': mode.value, 'type': CONF.libvirt.images_type,
                  'ext': CONF.prealloc_backend.qcow2_extended_l2,
                  'cluster': CONF.prealloc_backend.qcow2_cluster_size,
                  'cache': CONF.prealloc_backend.qcow2_l2_cache})

    def init_host(self, host):
        super().init_host(host)
        self._record_connection()
        self._recover_adoptions(host)

    def _recover_adoptions(self, host):
        """Finish or undo what an interrupted ``prealloc-backend adopt``
        left (adoption.recovery), before nova starts any guest of this host
        (init_host runs before nova's _init_instance, whose
        resume_guests_state_on_host_boot would boot a disk's name while it
        names the half-made copy), and clear the task states it left.
        While an adopt holds the host's lock, waits (recovery.RECOVERY_WAIT
        at most) for it to end or to have recovered since this boot. Never
        stops nova-compute.
        """
        path = CONF.instances_path
        try:
            # None: no adopt ever ran on this host (the lock file is never
            # created here), or a running one has recovered this boot.
            lock = recovery.wait_to_recover(path, host,
                                            timeout=recovery.RECOVERY_WAIT)
            if lock is None:
                return
        except (recovery.AlreadyRunning, OSError) as exc:
            LOG.error('prealloc_backend: what an interrupted adoption left '
                      'is not recovered (%(err)s): nova may start a guest '
                      'whose disk is a half-made copy; see prealloc-backend '
                      'adopt --dry-run', {'err': exc})
            return
        try:
            unrecovered = []
            if recovery.leftovers(path):
                conn = self._host.get_connection()
                unrecovered = recovery.recover_all(conn, path, LOG.info,
                                                   LOG.error)
            # Also the claim of an adopt killed before it made any file.
            recovery.release_stale_claims(nova_context.get_admin_context(),
                                          host, path, LOG.info)
            if not unrecovered:
                recovery.mark_recovered(path, host)
        except Exception:
            LOG.exception('prealloc_backend: recovering interrupted '
                          'adoptions failed')
        finally:
            os.close(lock)

    def _record_connection(self):
        """What the connection's libvirt and QEMU are, for the guests'
        discard-no-unref (disk.hostcaps: no API says whether they take
        it). Never stops nova-compute: without an answer the plugin
        writes no ``discard_no_unref``.
        """
        try:
            conn = self._host.get_connection()
            hostcaps.record_connection(conn.getLibVersion(),
                                       conn.getVersion())
            answer = hostcaps.discard_no_unref()
        except Exception as exc:
            LOG.warning('prealloc_backend: no qcow2 discard-no-unref for '
                        "guests' TRIM: the libvirt connection's versions "
                        'are unknown (%s)', exc)
            return
        LOG.info("prealloc_backend: qcow2 discard-no-unref for guests' "
                 'TRIM: %(yes)s (%(why)s)',
                 {'yes': 'yes' if answer.supported else 'no',
                  'why': answer.reason})

    def update_provider_tree(self, provider_tree, nodename,
                             allocations=None):
        # NOTE(nova): nova reports DISK_GB as the filesystem's size less
        # reserved_host_disk_mb, times its ratio: on a host whose mode
        # reserves, inventory.py makes it what new disks can really
        # reserve (and adds the host's trait). nova keeps a copy of the
        # tree for its own lookups: taken again after the change.
        super().update_provider_tree(provider_tree, nodename,
                                     allocations=allocations)
        inventory.update_provider_tree(provider_tree, nodename)
        self.provider_tree = copy.deepcopy(provider_tree)

    def _disk_raw_to_qcow2(self, path):
        # NOTE(nova): nova calls this static method from finish_migration
        # without the instance (finish_migration below registered it, with
        # the source's record of each disk's format); it would convert
        # thin, where this host's plan applies.
        migration = operation.MIGRATIONS.of_path(path)
        instance = migration.instance if migration is not None else None
        if not migrationops.convert_raw_disk(instance, path):
            migrationops.convert_raw_disk_thin(path)
        # NOTE(nova): nova leaves disk.info saying 'raw' for the converted disk
        # (it never rewrites an entry): qcow2.convert_raw recorded it
        # qcow2 there, and the migration's record now says so too.
        if migration is not None:
            migration.converted(path, 'qcow2')

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
        # NOTE(nova): disk_info is the source host's list of the instance's
        # disks, each with the format its domain XML gave QEMU ('type'): the
        # record of each disk's format while the move is finished here, over
        # disk.info (which the move may have lost or left stale) and never a
        # header the guest wrote (operation.Migration).
        formats_by_name = {}
        for info in jsonutils.loads(disk_info or '[]'):
            if info.get('path') and info.get('type'):
                formats_by_name[os.path.basename(info['path'])] = info['type']
        with operation.MIGRATIONS.finishing(instance, formats_by_name):
            return super().finish_migration(
                context, migration, instance, disk_info, network_info,
                image_meta, resize_instance, allocations,
                block_device_info=block_device_info, power_on=power_on,
                share_info=share_info)

    def _create_image(self, context, instance, disk_mapping, *args,
                      **kwargs):
        # NOTE(nova): every disk nova makes for spawn, rescue and
        # finish_migration is made here: record it as an instance-action event
        # of this host, so that the user sees where disks were made and, when
        # they could not be, why (the event's details), even when nova then
        # reschedules the build and its own events read 'Success'.
        with events.DiskEvent(context, instance):
            return super()._create_image(context, instance, disk_mapping,
                                         *args, **kwargs)

    def spawn(self, context, instance, image_meta, injected_files,
              admin_password, allocations, network_info=None,
              block_device_info=None, power_on=True, accel_info=None):
        try:
            with migrationops.evacuation(instance):
                return super().spawn(
                    context, instance, image_meta, injected_files,
                    admin_password, allocations, network_info=network_info,
                    block_device_info=block_device_info, power_on=power_on,
                    accel_info=accel_info)
        except exception.PreallocError as exc:
            failure = events.build_failure(instance, exc)
            if failure is exc:
                raise
            raise failure from exc

    # -- live migration --------------------------------------------------

    def check_source_migrate_data_at_dest(self, ctxt, instance, migrate_data,
                                         migration, limits, allocs):
        # NOTE(nova): the last check nova runs on the destination of a live
        # migration (inside the compute manager's
        # check_can_live_migrate_destination), once the source said whether
        # the instance directory is shared, before anything moves. Refused
        # here (MigrationPreCheckError) the instance stays ACTIVE on its
        # source, nova's conductor tries its next host when the scheduler
        # chose this one, and the reason is the details of the
        # compute_check_can_live_migrate_destination event. Checked before
        # nova's own check, which may reserve mdevs.
        if not migrationops.shares_instance_disks(migrate_data):
            path = libvirt_utils.get_instance_path(instance)
            migrationops.check_room(
                self.image_backend, instance,
                migrationops.flavor_disks(ctxt, instance, path),
                CONF.instances_path)
        return super().check_source_migrate_data_at_dest(
            ctxt, instance, migrate_data, migration, limits, allocs)

    def _create_images_and_backing(self, context, instance, instance_dir,
                                   disk_info, fallback_from_host=None):
        # NOTE(nova): nova's pre_live_migration makes a block live migration's
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
        if migrationops.live_migrating(instance) and disk_info:
            with events.DiskEvent(context, instance):
                migrationops.make_missing_disks(
                    self, context, instance, instance_dir, disk_info,
                    fallback_from_host)
                return super()._create_images_and_backing(
                    context, instance, instance_dir, disk_info,
                    fallback_from_host=fallback_from_host)
        return super()._create_images_and_backing(
            context, instance, instance_dir, disk_info,
            fallback_from_host=fallback_from_host)
