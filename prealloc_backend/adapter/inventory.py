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

"""The compute node's DISK_GB inventory and trait, as the host's mode
needs them (the driver's update_provider_tree, after nova's own).

On a host whose mode reserves (space, full) and whose disks are files,
with ``[prealloc_backend] disk_inventory = reservable`` (the default),
nova's DISK_GB is replaced by planner.capacity.inventory's: the same
total, ``reserved`` grown by what is not room for new disks, a ratio of
at most 1.0. The facts: the instances filesystem's statvfs and each
instance disk's stat and qcow2 header (disk.usage.scan, as the nova user
nova-compute runs as), and what placement counts for each server of this
host (its flavor, from nova's database through the conductor: one query
per update, as the resource tracker makes its own).

Every host whose mode reserves carries the trait CUSTOM_PREALLOC_RESERVING;
others do not.

nova calls update_provider_tree at every update of placement: each
``update_resources_interval`` (60 s by default) and at each claim (build,
move), under its resource tracker's lock. When the facts cannot be read
(the database unreachable), the last figures known for the node are
reported again; with none yet, every disk counts whole (stricter, never
looser).
"""

import threading

from nova import context as nova_context
from nova import objects
from oslo_log import log as logging
from oslo_utils import units

from prealloc_backend import conf
from prealloc_backend.disk import usage
from prealloc_backend.planner import capacity
from prealloc_backend.planner import diskplan
from prealloc_backend.planner import modes

LOG = logging.getLogger(__name__)
CONF = conf.CONF

_lock = threading.Lock()
# nodename -> {instance UUID: FlavorDisks} last read from nova's database.
_last_counted = {}
# nodename -> last reserved GiB logged; ratios already warned about.
_last_reserved = {}
# nodename -> reserved GiB of its last reading of instances_path.
_last_decided = {}
_warned_ratios = set()
# nodename -> the problems of its last scan, logged as warnings when new
# (then at debug level: nova updates placement every minute). Only the
# last scan's: names the nova user makes cannot grow it for good.
_logged_problems = {}


def host_policy():
    """(Mode, DiskFormat or None, reserving) of this host."""
    mode = modes.host_mode(CONF)
    fmt = diskplan.host_disk_format(CONF.libvirt.images_type,
                                    CONF.use_cow_images)
    return mode, fmt, capacity.reserves(mode) and fmt is not None


def _ratio_source(ratio):
    if CONF.disk_allocation_ratio is not None:
        return '[DEFAULT] disk_allocation_ratio = %s' % ratio
    return ("placement's DISK_GB allocation_ratio %s (initial_disk_"
            'allocation_ratio, or set through the placement API)' % ratio)


def _warn_ratio(ratio, mode):
    """Once per ratio (nova-compute's first update of placement, at its
    start, or when it changes).
    """
    source = _ratio_source(ratio)
    with _lock:
        if ratio in _warned_ratios:
            return
        _warned_ratios.add(ratio)
    LOG.warning('prealloc_backend: %(source)s would let placement promise '
                '%(ratio)sx the instances filesystem, which mode %(mode)s '
                'then refuses: DISK_GB is reported with allocation_ratio '
                '1.0 ([prealloc_backend] disk_inventory = nova keeps '
                "nova's)", {'source': source, 'ratio': ratio,
                            'mode': mode.value})


def counted_flavors(context, host):
    """{instance UUID: FlavorDisks} of the instances nova's database puts
    on ``host``: what placement counts for each (its flavor's disks).
    """
    instances = objects.InstanceList.get_by_host(
        context, host, expected_attrs=['flavor'])
    return {inst.uuid: capacity.FlavorDisks.of_flavor(
        inst.flavor.root_gb, inst.flavor.ephemeral_gb, inst.flavor.swap)
        for inst in instances}


def _counted(nodename):
    try:
        counted = counted_flavors(nova_context.get_admin_context(),
                                  CONF.host)
    except Exception as exc:
        with _lock:
            last = _last_counted.get(nodename)
        LOG.warning('prealloc_backend: the servers of this host could not '
                    'be read from nova\'s database (%(exc)s): DISK_GB '
                    'reserved from %(what)s', {
                        'exc': exc,
                        'what': 'the last servers known' if last is not None
                        else 'every disk counted whole'})
        return last if last is not None else {}
    with _lock:
        _last_counted[nodename] = counted
    return counted


def decide(nova_inventory, nodename):
    """The planner.capacity.Decision for this host now."""
    mode, fmt, reserving = host_policy()
    if not reserving or CONF.prealloc_backend.disk_inventory != 'reservable':
        return capacity.inventory(nova_inventory, False)
    if nova_inventory is None:
        return capacity.inventory(None, True)
    try:
        found = usage.scan_path(
            CONF.instances_path, fmt.value,
            base_subdirectory=CONF.image_cache.subdirectory_name)
    except Exception as exc:
        # nova's own statvfs of instances_path succeeded just before; an
        # error here (EMFILE, EIO, a directory the nova user closed) must
        # neither fail nova's update nor loosen the offer.
        with _lock:
            last = _last_decided.get(nodename)
        LOG.warning('prealloc_backend: %(path)s could not be read (%(exc)s): '
                    'DISK_GB reserved %(what)s', {
                        'path': CONF.instances_path, 'exc': exc,
                        'what': 'as last decided' if last is not None
                        else 'whole: placement offers nothing new here'})
        return capacity.unread(nova_inventory, last)
    counted = _counted(nodename)
    room = capacity.room(
        found.fs, [d.use() for d in found.disks], counted,
        CONF.reserved_host_disk_mb * units.Mi,
        capacity.new_disk_overhead(CONF.prealloc_backend, mode, fmt))
    with _lock:
        known = _logged_problems.get(nodename, set())
        _logged_problems[nodename] = set(found.problems)
    for problem in found.problems:
        (LOG.warning if problem not in known else LOG.debug)(
            'prealloc_backend: %s: not read whole (%s): a disk that cannot '
            'be opened counts by its stat, anything else by the '
            "filesystem's used blocks", CONF.instances_path, problem)
    decision = capacity.inventory(nova_inventory, True, found.fs, room)
    with _lock:
        _last_decided[nodename] = decision.inventory['reserved']
    return decision


def update_provider_tree(provider_tree, nodename):
    """Adjust what nova's update_provider_tree put in ``provider_tree`` for
    ``nodename``: the trait, and DISK_GB on a reserving host. Returns the
    planner.capacity.Decision.
    """
    mode, _fmt, reserving = host_policy()
    if reserving:
        provider_tree.add_traits(nodename, capacity.RESERVING_TRAIT)
    else:
        provider_tree.remove_traits(nodename, capacity.RESERVING_TRAIT)
    inventory = dict(provider_tree.data(nodename).inventory)
    decision = decide(inventory.get(capacity.DISK_GB), nodename)
    if not decision.changed:
        return decision
    if decision.ratio_overridden is not None:
        _warn_ratio(decision.ratio_overridden, mode)
    inventory[capacity.DISK_GB] = decision.inventory
    provider_tree.update_inventory(nodename, inventory)
    _log(nodename, decision)
    return decision


def _log(nodename, decision):
    reserved = decision.inventory['reserved']
    with _lock:
        changed = _last_reserved.get(nodename) != reserved
        _last_reserved[nodename] = reserved
    room = decision.room
    if room is None:
        (LOG.info if changed else LOG.debug)(
            'prealloc_backend: DISK_GB of %(node)s: total %(total)d GiB, '
            'reserved %(reserved)d GiB (%(reason)s), allocation_ratio '
            '%(ratio)s', {'node': nodename,
                          'total': decision.inventory['total'],
                          'reserved': reserved, 'reason': decision.reason,
                          'ratio': decision.inventory['allocation_ratio']})
        return
    (LOG.info if changed else LOG.debug)(
        'prealloc_backend: DISK_GB of %(node)s: total %(total)d GiB, '
        'reserved %(reserved)d GiB (files other than instance disks '
        '%(other)d B, thin disks and metadata still to come %(promised)d B, '
        'reserved_host_disk_mb %(host)d B, a new disk\'s metadata %(new)d '
        'B), allocation_ratio %(ratio)s', {
            'node': nodename, 'total': decision.inventory['total'],
            'reserved': reserved, 'other': room.other,
            'promised': room.promised, 'host': room.host_reserved,
            'new': room.new_disk_overhead,
            'ratio': decision.inventory['allocation_ratio']})
