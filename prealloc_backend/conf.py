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

"""Configuration options of prealloc_backend.

``[DEFAULT] preallocate_images`` belongs to nova: it is read here, never
registered (a second definition that differs in any attribute makes
oslo.config raise DuplicateOptError, whichever module is imported first).
Importing nova.conf guarantees it exists with nova's own definition.
"""

import copy

from oslo_config import cfg
from oslo_config import types
from oslo_privsep import capabilities
from oslo_privsep import priv_context

import nova.conf

CONF = nova.conf.CONF

GROUP_NAME = 'prealloc_backend'

prealloc_group = cfg.OptGroup(
    GROUP_NAME,
    title='Preallocating image backend options',
    help="""
Options of the prealloc_backend plugin, which preallocates the instance disks
that nova's libvirt driver creates on local files (images_type raw, flat,
qcow2 or default). ``[DEFAULT] preallocate_images`` stays nova's master
switch unless ``mode`` below is set.
""")

MODE_CHOICES = [
    ('none', 'No preallocation: thin files, exactly like stock nova with '
             'preallocate_images=none.'),
    ('metadata', 'qcow2: all metadata (L1/L2 tables, refcounts) written at '
                 'creation, data clusters stay thin; first writes no longer '
                 'pay for metadata. raw: nothing to do.'),
    ('space', 'Blocks reserved with fallocate(2): qcow2 preallocation=falloc '
              '(with extended_l2 so backing data stays visible), raw files '
              'allocated over their whole size. Fast on extent-based '
              'filesystems, and the host cannot run out of space under a '
              'running guest.'),
    ('full', 'Zeros written to every block not yet holding data: qcow2 '
             'preallocation=full, raw holes zero-filled (data is never '
             'overwritten). Slow for large disks, the strongest guarantee.'),
]

CLUSTER_SIZE_CHOICES = [
    ('64K', "QEMU's default: 2K subclusters with extended_l2."),
    ('128K', 'The default: 4K subclusters, the size of most guest writes.'),
    ('256K', '8K subclusters: every 4 KiB write into a new subcluster also '
             'copies 4 KiB from the backing file (measured 0.36x a raw '
             'file).'),
    ('512K', '16K subclusters (4 KiB writes slower still).'),
    ('1M', '32K subclusters (4 KiB writes slower still).'),
    ('2M', '64K subclusters, the largest qcow2 cluster (4 KiB writes '
           'measured 0.12x a raw file).'),
]

L2_CACHE_CHOICES = [
    ('full-coverage', 'Add <metadata_cache><max_size> to each qcow2 disk of '
                      'the guest XML, sized so that the L2 cache covers the '
                      'whole virtual disk (capped by '
                      'qcow2_metadata_cache_max_mb).'),
    ('qemu-default', "Emit nothing: QEMU's default cache applies (on Linux "
                     "at most 32 MiB of L2 tables per disk)."),
]

GUEST_DISCARD_CHOICES = [
    ('keep', "A guest's TRIM/discard on a disk in mode metadata, space or "
             "full is ignored by QEMU (the disk's <driver discard='ignore'>):"
             ' the reserved blocks and the qcow2 layout stay for the '
             "disk's whole life. Where QEMU and libvirt have qcow2's "
             'discard-no-unref, qcow2 disks of mode metadata use it '
             "(discard='unmap' discard_no_unref='on'): the range reads "
             'zeros and its clusters keep their place.'),
    ('zero', "As keep, and where QEMU and libvirt have qcow2's "
             'discard-no-unref, qcow2 disks of modes space and full use it '
             'too: the range reads zeros, snapshots skip it and the '
             'clusters keep their place, but the host blocks under it are '
             'freed until the plugin reserves them again, at the next '
             'definition of the guest.'),
    ('reclaim', "nova's [libvirt] hw_disk_discard applies unchanged: with "
                "'unmap' a guest's TRIM frees the host blocks it covers, "
                'and the reservation and layout of those ranges are lost.'),
]

DISK_INVENTORY_CHOICES = [
    ('reservable', 'On a host whose mode reserves (space, full) and whose '
                   'disks are files: DISK_GB reserved so that what '
                   'placement still offers is what new disks can really '
                   'reserve on the instances filesystem, and an '
                   'allocation ratio of at most 1.0. Hosts in modes none '
                   'and metadata keep nova\'s inventory.'),
    ('nova', "nova's own DISK_GB inventory on every host (the filesystem's "
             'size, reserved_host_disk_mb, nova\'s allocation ratio): '
             'placement may then choose a reserving host without room, '
             'whose nova-compute refuses the disk (a build is '
             'rescheduled; a cold migration or resize fails after the '
             'copy began).'),
]

FALLOCATE_UNSUPPORTED_CHOICES = [
    ('warn', 'Log a warning and keep the disk thin (raw) or '
             'metadata-preallocated (qcow2); the instance boots.'),
    ('fail', 'Fail the disk creation with an error naming the filesystem.'),
    ('zero-fill', 'Write zeros instead (raw holes zero-filled, qcow2 '
                  'preallocation=full). Slow: about 20 s per GiB on ext3.'),
]


class Integer(types.Integer):
    """oslo.config's Integer, whose errors name the value.

    NOTE(oslo.config): oslo.config says 'Should be greater than or equal to 1'
    without the value it refused, and turns an empty value into None.
    """

    def __call__(self, value):
        if isinstance(value, str) and not value.strip():
            raise ValueError('an empty value is not an integer')
        try:
            return super().__call__(value)
        except ValueError as exc:
            raise ValueError('%s, but found %r' % (exc, value)) from None


def allowed(opt):
    """What ``opt`` (ours or nova's) accepts, in words, for the error
    messages of nova-compute's start and of ``prealloc-backend check``.
    """
    kind = opt.type
    if getattr(kind, 'choices', None):
        return ', '.join(str(c) for c in kind.choices)
    if isinstance(kind, types.Boolean):
        return 'true or false'
    if isinstance(kind, (types.Integer, types.Float)):
        what = 'integers' if isinstance(kind, types.Integer) else 'numbers'
        low, high = kind.min, kind.max
        if low is not None and high is not None:
            return '%s from %s to %s' % (what, low, high)
        if low is not None:
            return '%s from %s up' % (what, low)
        if high is not None:
            return '%s up to %s' % (what, high)
        return what
    return 'values of type %s' % getattr(kind, 'type_name', kind)


prealloc_opts = [
    cfg.StrOpt('mode',
        choices=MODE_CHOICES,
        default=None,
        help="""
Preallocation mode of instance disks on this host.

Unset (the default), the mode follows nova's ``[DEFAULT] preallocate_images``:
``none`` gives ``none`` and ``space`` gives ``space``, so the single line
``preallocate_images = space`` is all an operator needs. Set it to choose
``metadata`` or ``full``, which nova's option does not offer, or to override
nova's option for this plugin only. A flavor's ``prealloc:mode`` extra spec
overrides this for that flavor's instances.

raw disks have no metadata: ``metadata`` does nothing for them.
"""),
    cfg.BoolOpt('qcow2_extended_l2',
        default=True,
        help="""
Create qcow2 overlays with ``extended_l2=on`` (subclusters).

QEMU refuses to preallocate an overlay that has a backing file unless
extended_l2 is on: subcluster allocation bits keep the backing file's data
visible while the overlay's clusters are already allocated. It also halves
copy-on-write amplification. Needs QEMU 5.2, which nova 34's minimum (6.2)
guarantees. Turn it off only to create overlays that older tools must open:
nova-compute then refuses to start where the host's mode preallocates and
its instance disks are qcow2 overlays, and an overlay that a flavor's
``prealloc:mode`` asks to preallocate (or that arrives on a raw host) is left
thin, with a warning.
"""),
    cfg.StrOpt('qcow2_cluster_size',
        choices=CLUSTER_SIZE_CHOICES,
        default='128K',
        help="""
Cluster size of the qcow2 overlays this plugin creates (modes metadata,
space and full; mode ``none`` makes nova's own overlay). A flavor's
``prealloc:cluster_size`` extra spec overrides it for that flavor.

The default 128K gives 4 KiB subclusters with extended_l2 at every disk
size: a guest's 4 KiB write into a new subcluster then writes only its own
data. Larger clusters have larger subclusters, and every 4 KiB write into a
new subcluster also copies the rest of that subcluster from the backing
file: measured 0.36x a raw file at 256K, 0.12x at 2M. Larger clusters make
smaller metadata (creating a 1 TiB metadata disk: 288 MiB at 64K, 144 MiB at
128K) and need less ``<metadata_cache>`` per TiB; choose one only for
workloads that write in large blocks.
"""),
    cfg.StrOpt('qcow2_l2_cache',
        choices=L2_CACHE_CHOICES,
        default='full-coverage',
        help="""
How the guest XML sizes the qcow2 metadata cache of each disk.

``full-coverage`` writes ``<metadata_cache><max_size>`` (libvirt 7.0+, which
turns it into the qcow2 node's ``cache-size``) with exactly what covers the
whole virtual disk, when QEMU's default (32 MiB of L2 tables, which covers
256 GiB at 128K clusters) does not already and the cover fits in
``qcow2_metadata_cache_max_mb``; otherwise nothing, and QEMU's default
applies. Random reads over a disk larger than its cache covers were measured
10-20x slower than with a cache that covers it all. Modes ``none`` never
writes the element.
"""),
    cfg.Opt('qcow2_metadata_cache_max_mb',
        type=Integer(min=1, max=4096),
        default=256,
        help="""
Most memory, in MiB, that QEMU may use for the metadata cache of one guest
disk (the ``<metadata_cache>`` of ``qcow2_l2_cache = full-coverage``).

Covering a disk takes 128 MiB per TiB of virtual size at 128K clusters with
extended_l2 (64 MiB per TiB at 256K, 256 MiB at 64K), plus 4 clusters of
refcount cache: the default 256 covers disks up to 2 TiB at 128K. A disk
whose cover needs more gets no ``<metadata_cache>`` at all (a log line says
so once): a cache that covers only part of a disk was measured slower than
QEMU's default. QEMU fills the cache as the guest touches the disk and
frees entries unused for 10 minutes, so this is a ceiling per disk, not
memory taken at boot. Count it per disk of every guest on the host.
"""),
    cfg.StrOpt('fallocate_unsupported',
        choices=FALLOCATE_UNSUPPORTED_CHOICES,
        default='warn',
        help="""
What to do when the instances filesystem does not support fallocate(2)
(ext3, ext4 without extents, some NFS) and the mode is ``space``.

The default ``warn`` keeps nova's behaviour (a warning, the instance boots):
on such filesystems the only way to reserve blocks is to write zeros, about
20 s per GiB, which would turn every spawn into minutes. Choose ``zero-fill``
to get the reservation anyway, or ``fail`` to refuse to run thin. Support is
probed once per filesystem (device), with a real fallocate(2) call.
``full`` always writes zeros and is not affected.
"""),
    cfg.StrOpt('guest_discard',
        choices=GUEST_DISCARD_CHOICES,
        default='keep',
        help="""
What a guest's TRIM (discard) does to a preallocated disk when nova's
``[libvirt] hw_disk_discard = unmap`` passes guests' discards to QEMU.

With ``unmap``, QEMU turns a discard into a hole in a raw file and, in a
qcow2 overlay, drops the clusters from the image: the blocks reserved by
modes ``space`` and ``full`` are freed (the host can then run out of space
under the guest) and the next write there allocates again, the slow path
the mode was chosen to avoid. ``keep`` (the default) writes
``discard='ignore'`` for the disks of modes ``metadata``, ``space`` and
``full`` (raw disks of mode ``metadata`` have nothing reserved and keep
nova's value); the guest's TRIM then succeeds and changes nothing on the
host. ``reclaim`` leaves nova's value: thin reclaim wins over the
reservation. Disks of mode ``none`` always keep nova's value.

Where the host's QEMU (8.1.3 and later) and libvirt (9.5 and later) have
qcow2's ``discard-no-unref`` (qemu-img and libvirt's schema asked once per
process; the versions of nova-compute's libvirt connection checked, since
no API tells whether its daemon and QEMU take it), a qcow2 disk can drop
the data of a TRIM and keep its clusters' place: ``discard='unmap'
discard_no_unref='on'``. The range then reads zeros, a snapshot or
``qemu-img convert`` skips it, and the next write there allocates no
cluster. libvirt gives the same ``discard`` to the file under the image, so
QEMU also frees the host blocks under the range. With ``keep``, qcow2 disks
of mode ``metadata`` (which reserve no data blocks) get it; with ``zero``,
those of modes ``space`` and ``full`` too, and the plugin reserves the
freed blocks again (fallocate(2), contents untouched) each time it defines
the guest: between a TRIM and the guest's next start, hard reboot, resize
or cold migration those blocks are not reserved, and a mode ``full`` disk's
range is reserved again as unwritten extents, not written zeros. A live
migration carries the source's setting to the destination as it is (nova
does not redefine the disks there). Raw disks and hosts without the
capability behave as ``keep``. ``prealloc-backend check`` says what a TRIM
does on this host, and why.

Applied to the guest XML at every (re)definition, so existing instances
change at their next hard reboot, resize or migration.
"""),
    cfg.BoolOpt('advertise_physical_block_size',
        default=True,
        help="""
Tell guests that a qcow2 disk whose subclusters are 4 KiB (the plugin's
128K clusters with extended_l2) has 4 KiB physical blocks: the disk's
``<blockio physical_block_size='4096'/>``, a 512e disk (512-byte logical
blocks, so every guest write that worked still works, with the same
data). Filesystems made on it afterwards align to 4 KiB: measured in a
Linux guest, mkfs.xfs then picks 4 KiB sectors and XFS stops issuing
512-byte log writes, each of which costs a copy of the rest of its
subcluster where it lands over backing data. Disks of mode ``none``, raw
disks and other layouts are left as nova makes them. Applied to the guest
XML at every (re)definition, so existing instances see 4 KiB at their next
hard reboot, resize or migration; their filesystems keep working as they
were made. See doc/source/admin/write-size.rst.
"""),
    cfg.StrOpt('disk_inventory',
        choices=DISK_INVENTORY_CHOICES,
        default='reservable',
        help="""
What the compute node reports to placement as its DISK_GB inventory.

With ``reservable`` (the default), on a host whose mode reserves (``space``,
``full``; images_type raw, flat, qcow2 or default), nova's ``total`` stays
the instances filesystem's size and ``reserved`` also takes what is not
room for new disks: files that are not this host's instance disks (base
images, logs, anything else on the filesystem), the room its thin disks
will still take, qcow2 metadata beyond a disk's virtual size, and
``reserved_host_disk_mb``. What placement still offers is then what new
disks can really reserve, rounded down to whole GiB, and the scheduler
never picks a host without room: a build, a cold migration or a resize to
it is refused before anything moves. ``disk_allocation_ratio`` above 1.0
is lowered to 1.0 there (logged at start and by ``prealloc-backend
check``): it would promise space the mode then refuses. Whatever this
option says, a host whose mode reserves carries the trait
``CUSTOM_PREALLOC_RESERVING``, which flavors with ``prealloc:mode`` space
or full should require (``trait:CUSTOM_PREALLOC_RESERVING=required``).
Recomputed every time nova updates placement (``[DEFAULT]
update_resources_interval`` and each claim), from a stat of each disk and
its qcow2 header, never its data.
"""),
    cfg.Opt('allocation_timeout',
        type=Integer(min=0),
        default=0,
        help="""
Seconds a single disk's preallocation may take before it is abandoned, the
partly made disk removed, and the spawn failed. 0 means no limit. Applies to
zero-filling and to qemu-img creating or growing a preallocated overlay.
"""),
    cfg.Opt('progress_interval',
        type=Integer(min=1),
        default=10,
        help="""
Seconds between progress log lines while a disk is zero-filled.
"""),
    cfg.ListOpt('qemu_users',
        default=['libvirt-qemu', 'qemu'],
        help="""
Users that may own the instance disks the privileged daemon allocates,
besides the owner of ``[DEFAULT] instances_path`` (nova's user): QEMU's user
(``user`` in libvirt's qemu.conf), to which libvirt gives a running guest's
disks. Names unknown on the host are ignored; root is never accepted this way
(a root-owned disk means libvirt's ``remember_owner = 0``). Read by the
daemon from its own configuration when it starts.
"""),
]


def register_opts(conf):
    """Register the plugin's options on ``conf`` (idempotent)."""
    conf.register_group(prealloc_group)
    conf.register_opts(prealloc_opts, group=prealloc_group)


# Registered by oslo.privsep for the plugin's context
# (prealloc_backend.privsep.ctx): helper_command, user, capabilities...
PRIVSEP_GROUP = 'prealloc_backend_privsep'


privsep_group = cfg.OptGroup(
    PRIVSEP_GROUP,
    title='Privileged daemon of prealloc_backend',
    help="""
oslo.privsep options of the plugin's privileged daemon, which allocates the
blocks of instance disks (fallocate(2), zero-fill) with the single capability
CAP_DAC_OVERRIDE. nova-compute starts it through its root helper (``sudo
nova-rootwrap /etc/nova/rootwrap.conf privsep-helper --config-file ...
--privsep_context prealloc_backend.privsep.ctx ...``) unless
``helper_command`` is set. A helper command must pass the nova.conf files
(``--config-file``): the daemon checks every disk path against ``[DEFAULT]
instances_path`` as its own configuration reads it. ``prealloc-backend
check`` verifies this setup.
""")


def _privsep_opts():
    opts = copy.deepcopy(priv_context.OPTS)
    for opt in opts:
        if opt.dest == 'capabilities':
            # NOTE(oslo.privsep): the context sets this default (set_default)
            # when it is created; the library's own default is an empty list,
            # which the sample would show otherwise.
            opt.default = [capabilities.CAP_DAC_OVERRIDE]
            opt.sample_default = 'CAP_DAC_OVERRIDE'
    return opts


def list_opts():
    """Return the plugin's options for oslo-config-generator.

    Feeds the ``oslo.config.opts`` entry point ``prealloc_backend``; the
    sample configuration is generated with::

        oslo-config-generator --namespace prealloc_backend

    It includes the ``[prealloc_backend_privsep]`` section that oslo.privsep
    registers for the plugin's daemon.
    """
    return [(prealloc_group, copy.deepcopy(prealloc_opts)),
            (privsep_group, _privsep_opts())]


register_opts(CONF)
