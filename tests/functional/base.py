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

"""Harness: nova's in-process services with the plugin's real backend.

nova's API, conductor, scheduler and compute services run in this process
on sqlite, with nova's fake libvirt. Everything below the libvirt API is
real: the compute driver is loaded by nova.virt.driver.load_compute_driver
from ``compute_driver = prealloc_backend.LibvirtDriver`` (after
prealloc_backend.adapter.driver.register(), exactly what the
prealloc-nova-compute wrapper does), images come from a Glance fixture
serving real image bytes, and the disks are real files in a temporary
instances_path made by real qemu-img, cp, mkfs, mkswap and fallocate(2).

nova's own libvirt functional base (ServersTestBase) mocks the image backend
(LibvirtImageBackendFixture) and LibvirtDriver._create_image: this harness
reuses its compute start-up helpers but not its setUp, so that neither mock
is installed.
"""

import json
import os
import re
import subprocess
import sys

import fixtures
from lxml import etree
from nova.tests import fixtures as nova_fixtures
from nova.tests.functional import integrated_helpers
from nova.tests.functional.libvirt import base as libvirt_base
from nova.virt.libvirt import host as libvirt_host
from nova.virt.libvirt import imagecache
from oslo_log import log as logging
from oslo_utils import units

from prealloc_backend.adapter import driver
from prealloc_backend import conf
from prealloc_backend.disk import fsprobe
from tests import fixtures as pb_fixtures

LOG = logging.getLogger(__name__)
CONF = conf.CONF

# Glance images: small, but with real data spread over the whole image
# (tests.fixtures.write_pattern: 64 KiB of random bytes every 256 KiB).
IMAGE_SIZE = 4 * units.Mi
# Slack for filesystem and qcow2 metadata when comparing allocations.
SLACK = 2 * units.Mi
# qcow2 cluster size for each [prealloc_backend] qcow2_cluster_size (its
# help: 128K by default at every disk size).
CLUSTER_SIZES = {'64K': 64 * units.Ki, '128K': 128 * units.Ki,
                 '256K': 256 * units.Ki}
# Mode none makes stock nova's overlay: qemu-img's default cluster size over
# the tests' raw images, no extended_l2.
NOVA_CLUSTER_SIZE = 64 * units.Ki
# QEMU's default L2 cache on Linux (32 MiB of L2 tables).
QEMU_DEFAULT_L2_CACHE = 32 * units.Mi
# How long a test waits for a server to reach a state or for a
# notification: preallocating writes disks, which takes seconds on a busy
# 2-core machine (nova's helpers wait 5 s for a state, 10 s for a
# notification).
WAIT_SECONDS = 180
# RPC timeouts for calls that wait for a disk to be written (CastAsCall
# turns the build cast into a call).
RPC_TIMEOUT = 300


# assertServerDisks: the guest disks' io attribute follows the mode.
FROM_MODE = object()
# assertGuestDisk: the io attribute is not checked.
UNCHECKED = object()


def record_figures(test, path, mode, figures):
    """Log the figures measured on a disk; with PREALLOC_FUNCTIONAL_FIGURES
    set, also append them as a JSON line to that file (for reports).
    """
    LOG.info('%(path)s (%(mode)s): %(figures)s',
             {'path': path, 'mode': mode, 'figures': figures})
    out = os.environ.get('PREALLOC_FUNCTIONAL_FIGURES')
    if out:
        with open(out, 'a') as f:
            f.write(json.dumps({'test': test.id(),
                                'disk': os.path.basename(path),
                                'mode': mode, **figures}) + '\n')


def qemu_img_map(path):
    out = subprocess.run(['qemu-img', 'map', '--output=json',
                          '--force-share', path], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def expected_metadata_cache(virtual_size, cluster_size, extended_l2=True,
                            cap_mb=256):
    """What qcow2_l2_cache = full-coverage promises for
    <metadata_cache><max_size>: None where QEMU's default 32 MiB L2 cache
    already covers the disk; else the L2 tables of the whole disk (whole
    clusters of 8-byte entries, 16 with extended_l2) plus QEMU's minimum
    refcount cache (4 clusters) when that is within the cap, and None (never
    a partial cover) when it is not.
    """
    entry = 16 if extended_l2 else 8
    if QEMU_DEFAULT_L2_CACHE // entry * cluster_size >= virtual_size:
        return None
    entries = -(-virtual_size // cluster_size)
    l2_bytes = -(-entries * entry // cluster_size) * cluster_size
    wanted = l2_bytes + 4 * cluster_size
    return wanted if wanted <= cap_mb * units.Mi else None


class GuestXMLSpy(fixtures.Fixture):
    """Every domain XML nova hands to libvirt, as nova wrote it.

    Recorded in Host.write_instance_config, before the fake libvirt parses
    it (its XMLDesc drops the children of <driver>).
    """

    def _setUp(self):
        self.xmls = []
        original = libvirt_host.Host.write_instance_config
        recorded = self.xmls

        def write_instance_config(host, xml):
            recorded.append(xml)
            return original(host, xml)

        self.useFixture(fixtures.MonkeyPatch(
            'nova.virt.libvirt.host.Host.write_instance_config',
            write_instance_config))

    def for_server(self, server_id):
        return [xml for xml in self.xmls
                if '<uuid>%s</uuid>' % server_id in xml]


class GlanceImageData(fixtures.Fixture):
    """nova's GlanceFixture keeps the bytes of images created with data,
    but drops what update() uploads (the snapshot nova takes to shelve):
    keep those too, so that an unshelved server boots from its real
    snapshot.
    """

    def __init__(self, glance):
        super().__init__()
        self.glance = glance

    def _setUp(self):
        glance = self.glance
        original = glance.update

        def update(context, image_id, metadata, data=None,
                   purge_props=False):
            image = original(context, image_id, metadata,
                             purge_props=purge_props)
            if data is not None:
                payload = (data.read() if hasattr(data, 'read')
                           else b''.join(data))
                glance._imagedata[image_id] = payload
                image['size'] = len(payload)
            return image

        glance.update = update
        self.addCleanup(delattr, glance, 'update')


class ServersTestBase(libvirt_base.ServersTestBase):
    """Boot servers on a compute host running the plugin's driver."""

    microversion = 'latest'
    ADMIN_API = False

    def setUp(self):
        driver.register()
        self.computes = {}
        self.compute_rp_uuids = {}
        self.work_dir = self.useFixture(fixtures.TempDir()).path
        self.instances_path = os.path.join(self.work_dir, 'instances')
        os.mkdir(self.instances_path)
        self.flags(instances_path=self.instances_path)
        # NOTE(nova): a wheel-installed nova keeps api-paste.ini under the
        # environment's etc/, not beside the package where nova's test base
        # looks for it.
        self.flags(api_paste_config=os.path.join(
            sys.prefix, 'etc', 'nova', 'api-paste.ini'), group='wsgi')
        # Skip libvirt_base.ServersTestBase.setUp (image backend and
        # _create_image mocked) and repeat the rest of it.
        integrated_helpers._IntegratedTestBase.setUp(self)
        self.useFixture(nova_fixtures.CGroupsFixture())
        self.libvirt = self.useFixture(nova_fixtures.LibvirtFixture())
        self.useFixture(nova_fixtures.OSBrickFixture())
        # placement sees a large local disk whatever instances_path
        # holds, as with disk_allocation_ratio > 1 or a host whose free
        # space changed after it reported: the plugin's own free-space check
        # is what the small-filesystem scenario exercises.
        self.useFixture(fixtures.MockPatch(
            'nova.virt.libvirt.LibvirtDriver._get_local_gb_info',
            return_value={'total': 128, 'used': 44, 'free': 84}))
        # Host facts nova's fake libvirt does not provide (as nova's own
        # functional base).
        self.useFixture(fixtures.MockPatch(
            'nova.virt.libvirt.driver.libvirt_utils.is_valid_hostname',
            return_value=True))
        self.useFixture(fixtures.MockPatch(
            'nova.privsep.utils.supports_direct_io', return_value=True))
        self.useFixture(fixtures.MockPatch(
            'nova.virt.libvirt.host.Host.get_online_cpus',
            return_value=set(range(16))))
        connection = fixtures.MockPatch(
            'nova.virt.libvirt.host.Host.get_connection')
        self.mock_conn = self.useFixture(connection).mock

        # The plugin's and nova's privsep entrypoints run in this process
        # unless a test starts the real daemon (test_boot_with_privsep_daemon).
        self.useFixture(pb_fixtures.PrivsepInProcess())
        fsprobe.forget()
        self.addCleanup(fsprobe.forget)
        # Real mkfs for ephemeral disks (nova's default, vfat, needs
        # dosfstools, which bindep.txt does not list).
        self.flags(default_ephemeral_format='ext4')
        self.flags(rpc_response_timeout=RPC_TIMEOUT,
                   long_rpc_timeout=RPC_TIMEOUT)
        self.useFixture(GlanceImageData(self.glance))
        self.xml_spy = self.useFixture(GuestXMLSpy())
        wait_for_notifications = self.notifier.wait_for_versioned_notifications

        def wait_longer(event_type, n_events=1, timeout=WAIT_SECONDS):
            return wait_for_notifications(event_type, n_events,
                                          max(timeout, WAIT_SECONDS))

        self.notifier.wait_for_versioned_notifications = wait_longer
        self.images_dir = os.path.join(self.work_dir, 'images')
        os.mkdir(self.images_dir)

    def _wait_for_server_parameter(self, server, expected_params,
                                   max_retries=None, **kwargs):
        # nova's helper polls every 0.5 s.
        return super()._wait_for_server_parameter(
            server, expected_params,
            max_retries=max_retries or WAIT_SECONDS * 2, **kwargs)

    def _wait_for_state_change(self, server, expected_status,
                               max_retries=None, **kwargs):
        return super()._wait_for_state_change(
            server, expected_status,
            max_retries=max_retries or WAIT_SECONDS * 2, **kwargs)

    def _setup_compute_service(self):
        # Started by each test (start_host) once the image options are set:
        # the driver builds its image backend at start-up.
        self.flags(compute_driver=driver.COMPUTE_DRIVER)

    # -- set-up helpers ----------------------------------------------------

    def start_host(self, fmt, preallocate_images='space', hostname='compute1',
                   **prealloc_opts):
        """Start a compute service whose disks are ``fmt`` (qcow2 overlays
        or raw files), with nova's preallocate_images and
        ``[prealloc_backend]`` options.
        """
        if fmt == 'qcow2':
            self.flags(use_cow_images=True)
            self.flags(images_type='default', group='libvirt')
        else:
            self.flags(use_cow_images=False)
            self.flags(images_type='raw', group='libvirt')
        self.flags(preallocate_images=preallocate_images)
        self.flags(group='prealloc_backend', **prealloc_opts)
        name = self.start_compute(hostname=hostname)
        compute_driver = self.computes[name].driver
        self.assertIsInstance(compute_driver, driver.LibvirtDriver)
        return name

    def use_loop_instances_path(self, kind, size_mb):
        """Put instances_path on a real loop-mounted filesystem (``kind``
        as tests.fixtures.MKFS); call before start_host.
        """
        pb_fixtures.skip_unless_root(self)
        fs = self.useFixture(pb_fixtures.LoopFilesystem(
            kind, size_mb, parent=self.work_dir))
        self.instances_path = fs.path
        self.flags(instances_path=fs.path)
        return fs

    def upload_image(self, fmt, size=IMAGE_SIZE, seed=1):
        """Upload a real image of ``fmt`` (random data spread over the
        whole image); return (image id, path of the uploaded file).
        """
        path = os.path.join(self.images_dir, 'image-%d.%s' % (seed, fmt))
        pb_fixtures.make_base(path, fmt, size, seed)
        metadata = {
            'name': 'prealloc-%s-%d' % (fmt, seed),
            'disk_format': fmt,
            'container_format': 'bare',
            'size': os.path.getsize(path),
            'min_disk': 0,
            'min_ram': 0,
            'visibility': 'public',
            'properties': {},
        }
        with open(path, 'rb') as data:
            image = self.glance.create(None, metadata, data=data)
        return image['id'], path

    def create_flavor(self, disk=1, ephemeral=0, swap=0, extra_specs=None):
        return self._create_flavor(memory_mb=512, vcpu=1, disk=disk,
                                   ephemeral=ephemeral, swap=swap,
                                   extra_spec=extra_specs)

    def boot(self, image_id, flavor_id, expected_state='ACTIVE'):
        return self._create_server(image_uuid=image_id, flavor_id=flavor_id,
                                   networks='none',
                                   expected_state=expected_state)

    # -- what the tests inspect --------------------------------------------

    def instance_dir(self, server):
        return os.path.join(self.instances_path, server['id'])

    def disk(self, server, name='disk'):
        return os.path.join(self.instance_dir(server), name)

    def base_dir(self):
        return os.path.join(self.instances_path, '_base')

    def guest_xml(self, server):
        xmls = self.xml_spy.for_server(server['id'])
        self.assertTrue(xmls, 'no domain XML written for %s' % server['id'])
        return xmls[-1]

    def guest_disks(self, xml):
        """{source file: <disk> element} of the guest's file disks."""
        root = etree.fromstring(xml)
        disks = {}
        for disk in root.findall('./devices/disk'):
            source = disk.find('source')
            if source is not None and source.get('file'):
                disks[source.get('file')] = disk
        return disks

    def validate_xml(self, xml):
        """A real libvirt's schema accepts the XML (virt-xml-validate)."""
        path = os.path.join(self.work_dir, 'domain-%d.xml' % len(xml))
        with open(path, 'w') as f:
            f.write(xml)
        proc = subprocess.run(['virt-xml-validate', path, 'domain'],
                              capture_output=True, text=True)
        self.assertEqual(0, proc.returncode,
                         'virt-xml-validate refused the domain XML:\n%s%s\n'
                         '%s' % (proc.stdout, proc.stderr, xml))

    def fault_message(self, server):
        server = self.api.get_server(server['id'])
        return server.get('fault', {}).get('message', '')

    def guest_write(self, path, fmt, offset, length, byte):
        """Write as the guest would: ``length`` bytes of ``byte`` at
        ``offset`` of the disk's virtual content.
        """
        subprocess.run(['qemu-io', '-f', fmt, '-c',
                        'write -P %d %d %d' % (byte, offset, length), path],
                       check=True, capture_output=True)

    def reference(self, image_path, size, writes=()):
        """A raw file with what the guest must see: the image, zeros up to
        ``size``, then each (offset, length, byte) of ``writes``.
        """
        path = os.path.join(self.work_dir, 'reference-%d.raw' % size)
        subprocess.run(['qemu-img', 'convert', '-O', 'raw', image_path,
                        path], check=True, capture_output=True)
        os.truncate(path, size)
        with open(path, 'r+b') as f:
            for offset, length, byte in writes:
                f.seek(offset)
                f.write(bytes([byte]) * length)
        return path

    # -- assertions on real files ------------------------------------------

    def assertContentEqual(self, disk, image_path):
        """The guest sees exactly the image's bytes, then zeros."""
        code, out = pb_fixtures.qemu_img_compare(disk, image_path)
        self.assertEqual(0, code, 'qemu-img compare %s %s: %s'
                         % (disk, image_path, out))

    def assertQcow2Overlay(self, path, mode, virtual_size, backing=None):
        """The overlay's layout and allocation are what the modes table
        (doc/source/admin/modes.rst) promises for ``mode``. Returns the
        figures measured.
        """
        info = pb_fixtures.qemu_img_info(path)
        self.assertEqual('qcow2', info['format'])
        self.assertEqual(virtual_size, info['virtual-size'])
        data = info['format-specific']['data']
        # Mode none: stock nova's overlay, without extended_l2.
        self.assertEqual(mode != 'none', bool(data.get('extended-l2')), info)
        if backing:
            self.assertEqual(backing, info.get('backing-filename'))
        st = os.stat(path)
        allocated = st.st_blocks * 512
        holes = pb_fixtures.hole_bytes(path)
        mapping = qemu_img_map(path)
        # Ranges of the overlay itself (depth 0), and whether qcow2 has
        # host clusters behind them (an 'offset': preallocated metadata).
        top = [r for r in mapping if r['depth'] == 0]
        with_clusters = sum(r['length'] for r in top if 'offset' in r)
        without = sum(r['length'] for r in top if 'offset' not in r)
        figures = {'file_size': st.st_size, 'allocated': allocated,
                   'seek_holes': holes, 'top_mapped': with_clusters,
                   'top_unmapped': without,
                   'cluster_size': info['cluster-size']}
        record_figures(self, path, mode, figures)
        if mode == 'none':
            self.assertLess(st.st_size, SLACK, figures)
            self.assertLess(allocated, SLACK, figures)
            self.assertEqual(0, with_clusters, figures)
        else:
            # Every cluster of the overlay is mapped (metadata written).
            self.assertEqual(0, without, figures)
            self.assertGreaterEqual(st.st_size, virtual_size, figures)
        if mode == 'metadata':
            self.assertLess(allocated, SLACK, figures)
        if mode in ('space', 'full'):
            self.assertGreaterEqual(allocated, virtual_size, figures)
        if mode == 'full':
            # Zeros written: nothing left unwritten. (space's unwritten
            # extents may read as holes or as data, depending on the page
            # cache: not asserted.)
            self.assertLess(holes, SLACK, figures)
        return figures

    def assertRaw(self, path, mode, size):
        """A raw disk's allocation is what the modes table
        (doc/source/admin/modes.rst) promises.
        """
        info = pb_fixtures.qemu_img_info(path)
        self.assertEqual('raw', info['format'])
        st = os.stat(path)
        self.assertEqual(size, st.st_size)
        allocated = st.st_blocks * 512
        holes = pb_fixtures.hole_bytes(path)
        figures = {'file_size': st.st_size, 'allocated': allocated,
                   'seek_holes': holes}
        record_figures(self, path, mode, figures)
        if mode in ('none', 'metadata'):
            self.assertLess(allocated, size // 2, figures)
        else:
            self.assertGreaterEqual(allocated, size, figures)
        if mode == 'full':
            self.assertEqual(0, holes, figures)
        return figures

    def image_base(self, image_id):
        """nova's image cache file for an image."""
        return os.path.join(self.base_dir(),
                            imagecache.get_cache_fname(image_id))

    def blkid_type(self, path):
        """What a guest would find on a raw disk (ext4, swap...)."""
        return subprocess.run(['blkid', '-p', '-o', 'value', '-s', 'TYPE',
                               path], capture_output=True,
                              text=True).stdout.strip()

    def assertServerDisks(self, server, fmt, mode, image_id, image_path,
                          root_gb=1, ephemeral_gb=0, swap_mb=0,
                          cluster_size=128 * units.Ki, check_xml=True,
                          io=FROM_MODE):
        """Every disk of the server is what the modes table promises for
        ``fmt`` and ``mode``, shows the guest its content (the root disk:
        ``image_path``), and is in the guest XML (which a real libvirt would
        accept). Returns the figures.
        """
        xml = self.guest_xml(server) if check_xml else None
        if check_xml:
            self.validate_xml(xml)
        if io is FROM_MODE:
            # nova's own choice for preallocated disks, kept by the plugin.
            io = 'native' if mode != 'none' else None
        disks = [('disk', root_gb * units.Gi, self.image_base(image_id))]
        if ephemeral_gb:
            disks.append(('disk.eph0', ephemeral_gb * units.Gi, None))
        if swap_mb:
            disks.append(('disk.swap', swap_mb * units.Mi, None))
        figures = {}
        for name, size, backing in disks:
            path = self.disk(server, name)
            if fmt == 'qcow2':
                got = self.assertQcow2Overlay(path, mode, size, backing)
                self.assertEqual(NOVA_CLUSTER_SIZE if mode == 'none'
                                 else cluster_size, got['cluster_size'])
                backing = pb_fixtures.qemu_img_info(path)['backing-filename']
                self.assertEqual(self.base_dir(), os.path.dirname(backing))
                if name != 'disk':
                    # The guest sees its backing file's content.
                    self.assertContentEqual(path, backing)
                if check_xml:
                    cache = (None if mode == 'none' else
                             expected_metadata_cache(size,
                                                     got['cluster_size']))
                    self.assertGuestDisk(xml, path, 'qcow2', cache, io)
                content = backing
            else:
                got = self.assertRaw(path, mode, size)
                if check_xml:
                    self.assertGuestDisk(xml, path, 'raw', None, io)
                content = path
            if name == 'disk':
                self.assertContentEqual(path, image_path)
            elif name == 'disk.eph0':
                self.assertEqual('ext4', self.blkid_type(content))
            else:
                self.assertEqual('swap', self.blkid_type(content))
            figures[name] = got
        self.assertEqual([], journal_files(self.instance_dir(server)))
        return figures

    def assertGuestDisk(self, xml, path, fmt, cache_bytes=None,
                        io=UNCHECKED):
        """The guest's <disk> for ``path``: its format, io mode (None: no
        io attribute) and <metadata_cache> (None: none).
        """
        disk = self.guest_disks(xml).get(path)
        self.assertIsNotNone(disk, 'no <disk> for %s in\n%s' % (path, xml))
        drv = disk.find('driver')
        self.assertEqual(fmt, drv.get('type'))
        if io is not UNCHECKED:
            self.assertEqual(io, drv.get('io'), etree.tostring(disk))
        max_size = drv.find('metadata_cache/max_size')
        if cache_bytes is None:
            self.assertIsNone(max_size, etree.tostring(disk))
        else:
            self.assertIsNotNone(max_size, etree.tostring(disk))
            self.assertEqual('bytes', max_size.get('unit'))
            self.assertEqual(cache_bytes, int(max_size.text))
        return disk


def journal_files(directory):
    return [name for name in os.listdir(directory)
            if re.search(r'\.prealloc-(journal|tmp)$', name)]
