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

"""Check: capacity, as placement and operators see it; the figures of
``prealloc-backend report``.

``measure(host)`` gathers, for this host:

- the instances filesystem and every instance disk (disk.usage.scan with
  FIEMAP): run in a child process that dropped to the owner of
  instances_path (checks/owner.py), working in the directory pinned by the
  privileged daemon's own rules (privsep.fs.pin: no symlink in any
  component, not root's), so that root reads nothing the nova user could
  point it at. The child answers JSON; nothing is written.
- each guest libvirt knows (a read-only connection, as root): whether it
  is paused on an I/O error (state PAUSED, reason
  VIR_DOMAIN_PAUSED_IOERROR: ENOSPC among others), and its flavor from the
  nova metadata nova writes into its domain XML (disk, ephemeral and swap
  sizes, extra specs): what placement counts for it and the mode of its
  disks. No nova database is needed on the compute host.
- what the driver reports to placement, computed from the same figures
  (planner.capacity): DISK_GB's total, reserved and ratio, and what it
  still offers once this host's servers are counted.

``check_capacity(host)`` is the check's row; its facts carry every figure
(per host, per disk, per guest), as ``report`` exports them.
"""

import dataclasses
import time

from lxml import etree
from oslo_utils import units

from prealloc_backend.checks import owner
from prealloc_backend.checks import result
from prealloc_backend.disk import fsprobe
from prealloc_backend.disk import usage
from prealloc_backend import exception
from prealloc_backend.planner import adoption
from prealloc_backend.planner import capacity
from prealloc_backend.planner import diskplan
from prealloc_backend.planner import modes
import prealloc_backend.privsep.fs
from prealloc_backend import sizes

GiB = units.Gi
# Seconds the scan's child may take: a stat, 104 bytes and an extent map
# per disk; thousands of disks take seconds (doc/source/cli/
# prealloc-backend-report.rst). Past it the child is killed.
SCAN_DEADLINE = 300
# The scan's answer: about 120 bytes per disk.
MAX_ANSWER = 64 * units.Mi
NOVA_NS = 'http://openstack.org/xmlns/libvirt/nova/1.1'
# libvirt's virDomainState PAUSED and virDomainPausedReason IOERROR
# (libvirt-domain.h), also when the binding is not importable.
VIR_DOMAIN_PAUSED = 3
VIR_DOMAIN_PAUSED_IOERROR = 5
VIR_DOMAIN_METADATA_ELEMENT = 2


@dataclasses.dataclass(frozen=True)
class Guest:
    """A domain libvirt knows on this host."""
    uuid: str
    state: int
    reason: int
    flavor: capacity.FlavorDisks = None   # None: no nova metadata
    extra_specs: dict = None

    @property
    def paused_io_error(self):
        return (self.state == VIR_DOMAIN_PAUSED and
                self.reason == VIR_DOMAIN_PAUSED_IOERROR)


def libvirt_uri(conf):
    """nova's own choice (LibvirtDriver._uri)."""
    if conf.libvirt.virt_type == 'lxc':
        return conf.libvirt.connection_uri or 'lxc:///'
    if conf.libvirt.virt_type == 'parallels':
        return conf.libvirt.connection_uri or 'parallels:///system'
    return conf.libvirt.connection_uri or 'qemu:///system'


def _children(node, name):
    """The child elements of ``node`` called ``name``, in nova's namespace
    or in none: libvirt (9.0 seen) answers virDomainGetMetadata with the
    element nova wrote stripped of its namespace (``<instance>``, not
    ``<nova:instance>``).
    """
    return [child for child in node
            if isinstance(child.tag, str) and
            etree.QName(child).localname == name and
            etree.QName(child).namespace in (None, NOVA_NS)]


def nova_metadata(xml):
    """(FlavorDisks, extra specs) of a domain's nova metadata element
    (``<instance>``), or (None, None) without a flavor in it.
    """
    try:
        root = etree.fromstring(xml.encode() if isinstance(xml, str)
                                else xml)
    except (etree.XMLSyntaxError, ValueError):
        return None, None
    flavors = _children(root, 'flavor')
    if not flavors:
        return None, None
    flavor = flavors[0]

    def number(name):
        nodes = _children(flavor, name)
        try:
            return int(nodes[0].text) if nodes else 0
        except (TypeError, ValueError):
            return 0

    specs = {}
    for holder in _children(flavor, 'extraSpecs'):
        for node in _children(holder, 'extraSpec'):
            if node.get('name'):
                specs[node.get('name')] = node.text or ''
    return (capacity.FlavorDisks.of_flavor(number('disk'),
                                           number('ephemeral'),
                                           number('swap')), specs)


def read_guests(uri, connect=None):
    """{UUID: Guest} of every domain of the libvirt at ``uri``, through a
    read-only connection (one state and one metadata call per domain).
    ``connect``: a function(uri) -> connection (libvirt.openReadOnly by
    default). Raises what the connection raises.
    """
    if connect is None:
        import libvirt
        connect = libvirt.openReadOnly
    conn = connect(uri)
    try:
        found = {}
        for dom in conn.listAllDomains(0):
            try:
                uuid = dom.UUIDString()
                state, reason = dom.state()
            except Exception:
                # libvirtError: the domain went away since the list (a
                # server deleted meanwhile): the others are still read.
                continue
            try:
                xml = dom.metadata(VIR_DOMAIN_METADATA_ELEMENT, NOVA_NS, 0)
            except Exception:
                # libvirtError: a domain without nova's metadata.
                xml = None
            flavor, specs = nova_metadata(xml) if xml else (None, None)
            found[uuid] = Guest(uuid, state, reason, flavor, specs)
        return found
    finally:
        conn.close()


def _scan_step(fd, host_format, base_subdirectory, max_extents):
    # In the child, as the owner of instances_path, working in it (cwd).
    import os
    directory = os.open('.', os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return usage.scan(directory, host_format,
                          base_subdirectory=base_subdirectory, fiemap=True,
                          max_extents=max_extents).to_dict()
    finally:
        os.close(directory)


def scan_as_owner(conf, host_format, deadline=SCAN_DEADLINE,
                  max_extents=usage.MAX_EXTENTS):
    """disk.usage.Scan of instances_path, made by a child process as the
    owner of the directory pinned by the daemon's rules. Raises
    InstancesPathUnusable (the pin refused), owner.UnsafeDirectory,
    owner.StepFailed or owner.StepTimedOut.
    """
    root = prealloc_backend.privsep.fs.pin(conf.instances_path,
                                           root_may_own=False)
    try:
        creds = owner.credentials_for(root.fd, root.path)
        answer = owner.run_in(
            root.fd, root.path, _scan_step, host_format,
            conf.image_cache.subdirectory_name, max_extents, creds=creds,
            deadline=deadline, what='the scan of instances_path',
            max_answer=MAX_ANSWER)
    finally:
        root.close()
    return usage.Scan.from_dict(answer)


def nova_inventory(conf, fs):
    """The DISK_GB inventory nova's driver makes from nova.conf (its
    ``_get_local_gb_info`` total, ``reserved_host_disk_mb`` and its ratio
    logic from the configuration: a ratio set through placement's API is
    not seen here).
    """
    total = fs.size // GiB
    if not total:
        return None
    ratio = conf.disk_allocation_ratio
    if ratio is None:
        ratio = conf.initial_disk_allocation_ratio
    return {'total': total, 'min_unit': 1, 'max_unit': total,
            'step_size': 1, 'allocation_ratio': ratio,
            'reserved': -(-conf.reserved_host_disk_mb // 1024)}


@dataclasses.dataclass
class DiskFigures:
    """One disk as the report shows it."""
    facts: usage.DiskFacts
    mode: modes.Mode
    at_policy: bool          # None where it cannot be judged
    paused_io_error: bool    # its guest's


@dataclasses.dataclass
class Figures:
    """Everything measure() found."""
    instances_path: str
    mode: modes.Mode
    fmt: diskplan.DiskFormat
    scan: usage.Scan
    guests: dict                 # {UUID: Guest}, {} when libvirt failed
    libvirt_error: str           # None when libvirt answered
    room: capacity.Room
    decision: capacity.Decision
    offered: int                 # bytes placement still offers, or None
    disks: list                  # [DiskFigures]
    measured_at: float
    seconds: float
    disk_inventory: str = 'reservable'   # the option

    @property
    def reserving(self):
        return capacity.reserves(self.mode) and self.fmt is not None

    @property
    def unwritten(self):
        return sum(d.unwritten or 0 for d in self.scan.disks)

    @property
    def thin_promised(self):
        return sum(max(0, d.eventual - d.allocated) for d in self.scan.disks)

    @property
    def paused_guests(self):
        return sorted(g.uuid for g in self.guests.values()
                      if g.paused_io_error)

    def host_facts(self):
        fs = self.scan.fs
        inv = self.decision.inventory or {}
        return {
            'instances_path': self.instances_path,
            'mode': self.mode.value,
            'format': self.fmt.value if self.fmt else None,
            'reserving': self.reserving,
            'disk_inventory': self.disk_inventory,
            'fs_size_bytes': fs.size,
            'fs_free_bytes': fs.available,
            'reserved_unwritten_bytes': self.unwritten,
            'thin_promised_bytes': self.thin_promised,
            'base_images_bytes': self.scan.base_bytes,
            'base_images': self.scan.base_files,
            'other_bytes': self.room.other,
            'reservable_bytes': self.room.reservable,
            'disks': len(self.scan.disks),
            'disks_not_at_policy': sum(1 for d in self.disks
                                       if d.at_policy is False),
            'guests_paused_io_error': self.paused_guests,
            'placement': {
                'total_gb': inv.get('total'),
                'reserved_gb': inv.get('reserved'),
                'allocation_ratio': inv.get('allocation_ratio'),
                'offered_bytes': self.offered,
                'ratio_overridden': self.decision.ratio_overridden,
                'trait': (capacity.RESERVING_TRAIT if self.reserving
                          else None),
            },
            'problems': list(self.scan.problems),
            'libvirt_error': self.libvirt_error,
            'measured_at': self.measured_at,
            'seconds': round(self.seconds, 3),
        }

    def disk_facts(self):
        return [{'instance_uuid': d.facts.instance, 'disk': d.facts.name,
                 'format': d.facts.fmt, 'mode': d.mode.value,
                 'at_policy': d.at_policy,
                 'virtual_bytes': d.facts.virtual_size,
                 'allocated_bytes': d.facts.allocated,
                 'unwritten_bytes': d.facts.unwritten,
                 'guest_paused_io_error': d.paused_io_error}
                for d in self.disks]


def judge(opts, facts, mode, fs, extra_specs):
    """Whether a disk has what its Mode asks: planner.adoption's verdict
    for a qcow2 disk (the decision ``adopt`` takes), capacity.raw_at_policy
    for a raw one; None when its flavor's policy is invalid.
    """
    if facts.fmt == 'raw':
        return capacity.raw_at_policy(mode, facts.allocated, facts.size)
    overlay = diskplan.ExistingDisk(
        virtual_size=facts.virtual_size, cluster_size=facts.cluster_size,
        extended_l2=facts.extended_l2, allocated_bytes=facts.allocated)
    try:
        return adoption.verdict(opts, extra_specs, mode, overlay, fs,
                                path=facts.name).at_policy
    except exception.PreallocError:
        return None


def figures(conf, scan, guests, libvirt_error=None, measured_at=None,
            seconds=0.0):
    """The Figures of this host from a Scan and {UUID: Guest}."""
    mode = modes.host_mode(conf)
    fmt = diskplan.host_disk_format(conf.libvirt.images_type,
                                    conf.use_cow_images)
    opts = conf.prealloc_backend
    counted = {uuid: g.flavor for uuid, g in guests.items()
               if g.flavor is not None}
    overhead = (capacity.new_disk_overhead(opts, mode, fmt)
                if fmt is not None and mode.preallocates else None)
    room = capacity.room(scan.fs, [d.use() for d in scan.disks], counted,
                         conf.reserved_host_disk_mb * units.Mi, overhead)
    reserving = capacity.reserves(mode) and fmt is not None
    decision = capacity.inventory(
        nova_inventory(conf, scan.fs),
        reserving and opts.disk_inventory == 'reservable', scan.fs, room)
    offered = None
    if decision.inventory is not None and not libvirt_error:
        offered = capacity.offered_bytes(
            decision.inventory, sum(f.total for f in counted.values()))
    fs = diskplan.FsFacts(fallocate_ok=True,
                          fstype=fsprobe.fs_type(conf.instances_path),
                          free_bytes=scan.fs.available)
    disks = []
    for facts in scan.disks:
        guest = guests.get(facts.instance)
        specs = guest.extra_specs if guest and guest.extra_specs else {}
        try:
            disk_mode = modes.disk_mode(specs, mode)
        except exception.PreallocError:
            disk_mode = mode
        disks.append(DiskFigures(
            facts, disk_mode, judge(opts, facts, disk_mode, fs, specs),
            bool(guest and guest.paused_io_error)))
    return Figures(instances_path=conf.instances_path, mode=mode, fmt=fmt,
                   scan=scan, guests=guests, libvirt_error=libvirt_error,
                   room=room, decision=decision, offered=offered,
                   disks=disks,
                   measured_at=measured_at if measured_at is not None
                   else time.time(), seconds=seconds,
                   disk_inventory=opts.disk_inventory)


def measure(conf, deadline=SCAN_DEADLINE, max_extents=usage.MAX_EXTENTS,
            connect=None, clock=time.monotonic):
    """The Figures of this host now (see the module's docstring). Raises
    what scan_as_owner raises; a libvirt that does not answer is recorded
    (``libvirt_error``), not raised.
    """
    start = clock()
    measured_at = time.time()
    fmt = diskplan.host_disk_format(conf.libvirt.images_type,
                                    conf.use_cow_images)
    scan = scan_as_owner(conf, (fmt or diskplan.DiskFormat.RAW).value,
                         deadline=deadline, max_extents=max_extents)
    try:
        guests, error = read_guests(libvirt_uri(conf), connect), None
    except Exception as exc:
        guests, error = {}, '%s: %s' % (type(exc).__name__, exc)
    return figures(conf, scan, guests, error, measured_at,
                   clock() - start)


def check_capacity(host):
    """What placement is told and what the instances filesystem holds."""
    conf = host.conf
    try:
        found = measure(conf)
    except exception.InstancesPathUnusable as exc:
        reason = exc.kwargs['reason']
        if 'does not exist' in reason:
            return result.success('%s does not exist yet: nothing to '
                                  'measure.' % conf.instances_path)
        return result.failure(
            'Not measured: the privileged daemon\'s pin rules refuse '
            'instances_path %r (%s), and nothing is read there as root.'
            % (conf.instances_path, reason),
            'See the Instances path check.', instances_path=(
                conf.instances_path), refusal=reason)
    facts = found.host_facts()
    facts['disks'] = found.disk_facts()
    facts['disk_count'] = len(found.scan.disks)
    inv = found.decision.inventory
    text = ('%s (%s): %s of %s free, %s reserved but not yet written, thin '
            'disks may still take %s, base images %s; %d disk(s), %d not at '
            'their policy.' % (
                found.instances_path, found.mode.value,
                sizes.human(found.scan.fs.available),
                sizes.human(found.scan.fs.size),
                sizes.human(found.unwritten),
                sizes.human(found.thin_promised),
                sizes.human(found.scan.base_bytes), len(found.scan.disks),
                facts['disks_not_at_policy']))
    if inv:
        text += (' Placement is told DISK_GB total %d GiB, reserved %d GiB, '
                 'allocation ratio %s%s.' % (
                     inv['total'], inv['reserved'],
                     inv['allocation_ratio'],
                     ', offering %s more' % sizes.human(found.offered)
                     if found.offered is not None else ''))
    warnings, fixes = [], []
    opts = conf.prealloc_backend
    if found.reserving and opts.disk_inventory == 'reservable':
        text += (' Mode %s reserves: the offer is what new disks can '
                 'reserve here (%s), and the host has the trait %s.' % (
                     found.mode.value, sizes.human(found.room.reservable),
                     capacity.RESERVING_TRAIT))
        if found.decision.ratio_overridden is not None:
            warnings.append('a DISK_GB allocation ratio of %s would promise '
                            'space mode %s refuses: it is reported as 1.0'
                            % (found.decision.ratio_overridden,
                               found.mode.value))
            fixes.append('Set [DEFAULT] disk_allocation_ratio = 1.0 (or '
                         'unset it) on this host.')
    elif found.reserving:
        warnings.append('[prealloc_backend] disk_inventory = nova: placement '
                        'may choose this host without room, and moves to it '
                        'then fail after the copy began')
        fixes.append('Set [prealloc_backend] disk_inventory = reservable.')
    else:
        text += (' Mode %s does not reserve: nova\'s inventory stands; '
                 'flavors with prealloc:mode space or full should require '
                 'trait:%s=required to keep off this host.'
                 % (found.mode.value, capacity.RESERVING_TRAIT))
    if found.paused_guests:
        warnings.append('%d guest(s) paused on an I/O error (%s): a full '
                        'filesystem is the usual cause'
                        % (len(found.paused_guests),
                           ', '.join(found.paused_guests)))
        fixes.append('Free space in %s, then resume the guest(s) (virsh '
                     'resume).' % found.instances_path)
    if found.thin_promised > found.scan.fs.available:
        warnings.append('thin disks may still take %s, more than the %s '
                        'free' % (sizes.human(found.thin_promised),
                                  sizes.human(found.scan.fs.available)))
        fixes.append('Move servers off this host or adopt their disks '
                     '(prealloc-backend adopt) where the mode reserves.')
    if found.libvirt_error:
        text += ' libvirt did not answer (%s): guests not read.' % (
            found.libvirt_error)
    if warnings:
        return result.warning(text + ' Warning: ' + '; '.join(warnings) +
                              '.', ' '.join(fixes), **facts)
    return result.success(text, **facts)
