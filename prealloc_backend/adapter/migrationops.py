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


"""Moving an instance here: the room checks of a live migration and an
evacuation, the disks a block live migration makes, the conversion of a
raw disk that arrived on a qcow2 host.

Each check uses the plan that makes the disk (``operation.plan_new_disk``),
so what is refused is what would not fit. A refusal is the exception nova
turns into keeping the instance where it was: MigrationPreCheckError for a
live migration, ComputeResourcesUnavailable for an evacuation.

compute-hyperv splits this into livemigrationops.py and
migrationops.py, classes holding the driver's helpers. Here the live
migration and the evacuation share the room check, and the few nova
helpers a disk needs are the driver's methods: plain functions, handed the
driver where they call it.
"""

import contextlib
import os
import shutil

from nova.compute import task_states
from nova.compute import utils as compute_utils
from nova import exception as nova_exception
from nova.virt.libvirt import utils as libvirt_utils
from oslo_log import log as logging
from oslo_utils import units

from prealloc_backend.adapter import backend
from prealloc_backend.adapter import events
from prealloc_backend.adapter import operation
from prealloc_backend import conf
from prealloc_backend.disk import fsprobe
from prealloc_backend.disk import qcow2
from prealloc_backend import exception
from prealloc_backend.planner import diskplan

LOG = logging.getLogger(__name__)
CONF = conf.CONF


def overlay_images_type():
    """True when the instance disks of this host are qcow2 overlays."""
    return diskplan.host_disk_format(
        CONF.libvirt.images_type,
        CONF.use_cow_images) is diskplan.DiskFormat.QCOW2


def shares_instance_disks(migrate_data):
    """The destination uses the source's disk files (shared instance
    directory or shared block storage): a live migration makes none here.
    """
    return any(migrate_data.obj_attr_is_set(name) and
               getattr(migrate_data, name)
               for name in ('is_shared_instance_path',
                            'is_shared_block_storage'))


def flavor_disks(context, instance, instance_dir):
    """The local disks a block live migration would make here, sized
    from the flavor, in this host's format: the estimate the check
    before the migration can make (the source's disk list reaches this
    host only in pre_live_migration). A root disk sized by its image
    (flavor disk 0) and BDM ephemerals split from the flavor's are left
    to that later, exact check.
    """
    flavor = instance.flavor
    fmt = (diskplan.DiskFormat.QCOW2 if overlay_images_type() else
           diskplan.DiskFormat.RAW)
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


def check_room(image_backend, instance, disks, directory):
    """Refuse a live migration whose new disks do not all fit here by
    this host's plans (``operation.plan_new_disk``: the same plan that
    makes each disk): MigrationPreCheckError naming the figures.
    ``disks``: (path, DiskFormat, virtual size, has a backing file);
    ``image_backend``: the driver's (nothing is checked for LVM, RBD,
    ploop).
    """
    if (not disks or image_backend.backend() not in (
            backend.Flat, backend.Qcow2)):
        return
    try:
        extra_specs = operation.flavor_extra_specs(instance)
        plans = [operation.plan_new_disk(extra_specs, path, fmt, size,
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


def missing_disks(instance_dir, disk_info):
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
            fmt = (diskplan.DiskFormat.QCOW2
                   if overlay_images_type() or info.get('type') == 'qcow2'
                   else diskplan.DiskFormat.RAW)
        elif info.get('type') == 'raw':
            fmt = diskplan.DiskFormat.RAW
        else:
            # A standalone qcow2 (or other) disk: nova makes it with its
            # own create_image, thin, and the plugin does not allocate it:
            # not counted either.
            continue
        disks.append((path, fmt, int(info['virt_disk_size']), has_backing))
    return disks


def missing(path):
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


def loaded(instance, name):
    """``instance.<name>``, or None when not loaded (never a hidden
    lazy-load: an instance without a context raises).
    """
    if instance is None or not instance.obj_attr_is_set(name):
        return None
    return getattr(instance, name)


def evacuating_here(instance):
    """This host is spawning an evacuated instance (nova moves
    ``instance.host`` here only once the evacuation succeeded).
    """
    return (loaded(instance, 'task_state') ==
            task_states.REBUILD_SPAWNING and
            loaded(instance, 'host') not in (None, CONF.host))


def live_migrating(instance):
    """nova's pre_live_migration is making this instance's disks here."""
    return loaded(instance, 'task_state') == task_states.MIGRATING


@contextlib.contextmanager
def evacuation(instance):
    """Refuse an evacuation whose disks cannot be made here.

    An evacuation whose disks cannot be made here (no room, no fallocate,
    ...) is refused instead of failed: for ComputeResourcesUnavailable
    nova's rebuild_instance keeps the instance as it was (vm_state, and
    host: the failed host, whose disks nova removes only after an
    evacuation that did not fail), marks the migration failed and removes
    this host's allocation; any other error would put the instance in
    ERROR. The reason is in this host's DISK_EVENT and the instance
    fault. What this spawn made here goes (the backend already removed
    the disk it could not make); a directory that was here before (shared
    storage: the source's disks) stays. A cancelled allocation (the
    instance is being deleted) goes through as it is.
    """
    if not evacuating_here(instance):
        yield
        return
    instance_dir = libvirt_utils.get_instance_path(instance)
    # Non-shared storage: this spawn makes the instance directory.
    new_dir = missing(instance_dir)
    try:
        yield
    except exception.PreallocError as exc:
        if isinstance(exc, exception.AllocationCancelled):
            raise
        # NOTE(nova): nova has already bound the server's ports and
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
            reason=events.short_reason(exc)) from exc


def make_missing_disks(driver, context, instance, instance_dir, disk_info,
                       fallback_from_host):
    """Make the disks of a block live migration that nova would make
    unchecked: all checked for room first (``check_room``, the exact
    disks of the source), then each raw file without a backing file
    through the backend (nova's create_image, allocated as planned), and
    each qcow2 overlay on a host whose backend is Flat through the qcow2
    backend. ``driver``: the LibvirtDriver, whose helpers make the bases.
    """
    disks = missing_disks(instance_dir, disk_info)
    check_room(driver.image_backend, instance, disks, instance_dir)
    backing_files = {
        os.path.join(instance_dir, os.path.basename(info['path'])):
        info.get('backing_file') for info in disk_info}
    for path, fmt, size, backing in disks:
        if fmt is diskplan.DiskFormat.RAW and not backing:
            create_raw_disk(driver.image_backend, instance, path, size)
        elif (fmt is diskplan.DiskFormat.QCOW2 and backing and
              driver.image_backend.backend() is backend.Flat):
            create_overlay(driver, context, instance, path, size,
                           backing_files[path], fallback_from_host)


def create_raw_disk(image_backend, instance, path, size):
    """A raw file of ``size`` made by the backend's Flat: nova's own
    ``create_image`` (what nova makes here), checked for room first and
    allocated by the plan, removed again if that fails.
    """
    image = image_backend.backend('raw')(instance=instance, path=path)

    def make(target):
        libvirt_utils.create_image(target, 'raw', size)

    # A disk generated in place: nova's Image.cache takes filename as
    # the name of a lock (and of a _base file it never makes here).
    image.cache(fetch_func=make, filename='prealloc-live-migration',
                size=size)


def create_overlay(driver, context, instance, path, size, backing_file,
                   fallback_from_host):
    """A qcow2 overlay at ``path`` on its base, as nova's
    _create_images_and_backing makes one (the same three kinds of
    base), but through the qcow2 backend whatever this host's default
    is. nova's loop then finds the disk made.
    """
    disk = driver.image_backend.by_name(instance, path, 'qcow2')
    cache_name = os.path.basename(backing_file)
    if cache_name.startswith('ephemeral'):
        disk.cache(fetch_func=driver._create_ephemeral,
                   fs_label=driver._get_fs_label_ephemeral(0),
                   os_type=instance.os_type, filename=cache_name,
                   size=size, ephemeral_size=size / units.Gi, safe=True)
    elif cache_name.startswith('swap'):
        swap_mb = instance.get_flavor().swap
        disk.cache(fetch_func=driver._create_swap,
                   filename='swap_%s' % swap_mb, size=swap_mb * units.Mi,
                   swap_mb=swap_mb, safe=True)
    else:
        driver._try_fetch_image_cache(disk, libvirt_utils.fetch_image,
                                      context, cache_name,
                                      instance.image_ref, instance, size,
                                      fallback_from_host)


def convert_raw_disk(instance, path):
    """A raw disk that arrived on a qcow2 host becomes qcow2 here, laid
    out by this host's plan: a standalone qcow2 (no backing file) with the
    mode's ``preallocation=``, cluster size and extended_l2, checked for
    room first. Returns False, doing nothing, where nova's own thin
    conversion applies: mode none, or no room (an existing guest's disk is
    never failed for space).

    NOTE(nova): nova converts it thin (``qemu-img convert -O qcow2``), after
    its _create_image already ran, so the destination's policy would never
    apply.
    """
    plan = operation.plan_new_disk(operation.flavor_extra_specs(instance),
                                   path, diskplan.DiskFormat.QCOW2,
                                   os.stat(path).st_size, backing=False)
    if plan.stock:
        return False
    if not plan.fits:
        LOG.warning('%(path)s: converted to qcow2 thin: %(need)d bytes '
                    'needed to preallocate it, %(free)d free',
                    {'path': path, 'need': plan.to_allocate,
                     'free': fsprobe.facts(os.path.dirname(path)).free_bytes})
        return False
    qcow2.convert_raw(path, plan,
                      timeout=CONF.prealloc_backend.allocation_timeout)
    return True


def convert_raw_disk_thin(path):
    """What nova's own _disk_raw_to_qcow2 makes (``qemu-img convert -O
    qcow2``: 64K clusters, no extended_l2, no preallocation), made the way
    qcow2.convert_raw makes a conversion durable and recoverable: nova's
    renames its ``_qcow`` file over the disk with no flush and no journal,
    so a crash between the rename and disk.info's update left a qcow2
    file recorded raw.
    """
    qcow2.convert_raw(path, qcow2.THIN, timeout=None)
