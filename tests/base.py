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

"""Base test case: real temporary instances_path, real qemu-img."""

import os
import shutil
import subprocess
import sys
import threading

import fixtures
from nova import objects
from oslo_config import fixture as config_fixture
from oslo_log import log as logging
from oslo_utils import units
from oslo_utils import uuidutils
from oslotest import base

from prealloc_backend.adapter import backend
from prealloc_backend import conf
from prealloc_backend.disk import fsprobe
from prealloc_backend import exception
from tests import fixtures as pb_fixtures

objects.register_all()

CONF = conf.CONF


class TestCase(base.BaseTestCase):
    """oslotest's base (timeout, temp files, log capture) plus a temporary
    instances_path, the plugin's options reset after each test and its
    privsep entrypoints in-process.
    """

    def setUp(self):
        super().setUp()
        self.flags_fixture = self.useFixture(config_fixture.Config(CONF))
        self.instances_path = self.useFixture(fixtures.TempDir()).path
        self.flags(instances_path=self.instances_path)
        self.useFixture(pb_fixtures.PrivsepInProcess())
        fsprobe.forget()
        self.addCleanup(fsprobe.forget)

    def flags(self, group=None, **kw):
        for name, value in kw.items():
            self.flags_fixture.config(group=group, **{name: value})

    def make_instance(self, extra_specs=None, **flavor_fields):
        flavor = objects.Flavor(extra_specs=dict(extra_specs or {}),
                                **flavor_fields)
        return objects.Instance(uuid=uuidutils.generate_uuid(),
                                flavor=flavor)

    def use_loop_fs(self, kind, size_mb):
        pb_fixtures.skip_unless_root(self)
        fs = self.useFixture(pb_fixtures.LoopFilesystem(kind, size_mb))
        self.flags(instances_path=fs.path)
        self.instances_path = fs.path
        return fs

    def base_path(self, name):
        base_dir = os.path.join(self.instances_path, '_base')
        os.makedirs(base_dir, exist_ok=True)
        return os.path.join(base_dir, name)


# Disks of the backend's tests. 64 MiB: mode full writes every byte, and
# the qcow2 metadata of a 64 MiB disk takes the same clusters (one L2
# table) as that of a 1 GiB one; QEMU's default metadata cache covers both.
DISK = 64 * units.Mi
BASE = 3 * units.Mi + 12345  # not a multiple of any cluster size
MAPPING = {'bus': 'virtio', 'dev': 'vda', 'type': 'disk'}


class BackendTestCase(TestCase):
    """Disks made as nova's libvirt driver makes them: through
    ``Backend.by_name(...).cache(fetch_func, filename, size, ...)``, the
    fetch from Glance replaced by a real base image.
    """

    def setUp(self):
        super().setUp()
        self.fetches = []

    def image(self, images_type, mode=None, name='disk', extra_specs=None,
              instance=None, use_cow=True):
        if mode is not None:
            self.flags(mode=mode, group='prealloc_backend')
        self.instance = instance or self.make_instance(extra_specs)
        return backend.Backend(use_cow).by_name(
            self.instance, name, images_type, disk_info_mapping=MAPPING)

    def fetch(self, fmt, seed=1, size=BASE):
        def fetch_func(target, *args, **kwargs):
            self.fetches.append(target)
            pb_fixtures.make_base(target, fmt, size, seed)
        return fetch_func

    def cache(self, img, fmt='raw', size=DISK, filename='base-image',
              seed=1):
        img.cache(fetch_func=self.fetch(fmt, seed), filename=filename,
                  size=size, image_id='image-id')
        return os.path.join(self.instances_path, '_base', filename)

    def assert_same_content(self, disk, base_path):
        code, out = pb_fixtures.qemu_img_compare(disk, base_path)
        self.assertEqual(0, code, out)

    def assert_no_leftovers(self, disk):
        self.assertFalse(os.path.exists(disk + backend.TMP_SUFFIX))
        self.assertFalse(os.path.exists(disk + backend.JOURNAL_SUFFIX))


class FaultBase(TestCase):
    """Disks spawned from a raw source image copied as nova's fetch
    would, with the log captured; faults are injected by the subclasses.
    """

    def setUp(self):
        super().setUp()
        self.scratch = self.useFixture(fixtures.TempDir()).path
        self.logs = self.useFixture(fixtures.FakeLogger(
            level=logging.INFO, format='%(levelname)s %(message)s'))
        self.fetched = []
        self._fetch_lock = threading.Lock()

    def fetcher(self, source):
        def fetch(target, *args, **kwargs):
            with self._fetch_lock:
                self.fetched.append(target)
            subprocess.run(['cp', '--sparse=always', source, target],
                           check=True, capture_output=True)
        return fetch

    def spawn(self, instance, images_type, source, filename, size,
              disk_name='disk'):
        image = backend.Backend(images_type == 'qcow2').by_name(
            instance, disk_name, images_type)
        image.cache(fetch_func=self.fetcher(source), filename=filename,
                    size=size, image_id=filename)
        return image

    def disk_path(self, instance, disk_name='disk'):
        return os.path.join(self.instances_path, instance.uuid, disk_name)

    def assert_no_leftovers(self, disk, allow_disk=False):
        for suffix in (backend.JOURNAL_SUFFIX, backend.TMP_SUFFIX):
            self.assertFalse(os.path.exists(disk + suffix), disk + suffix)
        if not allow_disk:
            self.assertFalse(os.path.exists(disk), disk)
            leftovers = [name for name in os.listdir(os.path.dirname(disk))
                         if name not in pb_fixtures.NOVA_FILES]
            self.assertEqual([], leftovers)


class CheckTestCase(base.BaseTestCase):
    """``prealloc-backend check`` on a real nova.conf: a temporary
    directory ``self.tmp`` holding nova's instances_path
    (``self.instances``) and ``self.conf_path``, the nova.conf that
    ``check_host`` writes.
    """

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.instances = os.path.join(self.tmp, 'instances')
        os.mkdir(self.instances)
        self.conf_path = os.path.join(self.tmp, 'nova.conf')

    def nova_conf(self, images_type=None, **prealloc):
        """The sections of a healthy host's nova.conf
        (fixtures.check_sections) for ``self.instances``, with
        [prealloc_backend] options ``prealloc`` and [libvirt] images_type
        when given.
        """
        sections = pb_fixtures.check_sections(self.conf_path, self.instances,
                                              **prealloc)
        if images_type:
            sections['libvirt'] = {'images_type': images_type}
        return sections

    def check_host(self, sections, **kwargs):
        """The Host the checks read, ``sections`` written to conf_path;
        ``kwargs``: fixtures.CheckHost's (disk_size, qemu_conf).
        """
        return self.useFixture(pb_fixtures.CheckHost(
            self.conf_path, sections, **kwargs)).host


class BoundaryTestCase(TestCase):
    """A disk inside instances_path and a victim outside it, for the
    privileged entrypoints' refusals (tests/fixtures.py privsep_call).
    """

    def setUp(self):
        super().setUp()
        self.scratch = self.useFixture(fixtures.TempDir()).path
        self.inst = os.path.join(self.instances_path, 'inst')
        os.mkdir(self.inst)
        self.disk = pb_fixtures.make_disk(os.path.join(self.inst, 'disk'))
        self.outside_dir = os.path.join(self.scratch, 'outside')
        os.mkdir(self.outside_dir)
        self.victim = pb_fixtures.make_disk(
            os.path.join(self.outside_dir, 'victim'))

    def secrets(self, path):
        """What a refusal of ``path`` must not tell: the outside tree's
        name (unless the caller sent it) and the victim's size.
        """
        found = [str(pb_fixtures.PRIVSEP_DISK_SIZE)]
        if isinstance(path, str) and self.scratch not in path:
            found.append(self.scratch)
        return found

    def assert_refused(self, path, error, reason_words, touched, value=None,
                       names=(), entrypoints=pb_fixtures.ENTRYPOINTS,
                       **call_args):
        """Every entrypoint, wrapped and unprivileged, refuses: ``error``
        raised, its message naming ``value`` (default: the path) and
        containing ``reason_words`` but nothing about the outside tree
        (its directory, the victim's name or size); the files in
        ``touched`` unchanged.
        """
        before = {p: pb_fixtures.file_state(p) for p in touched}
        shown = repr(path if value is None else value)
        for name in entrypoints:
            for unprivileged in (False, True):
                label = '%s%s(%r, %r)' % ('unprivileged_' if unprivileged
                                          else '', name, path, call_args)
                exc = self.assertRaises(error, pb_fixtures.privsep_call,
                                        name, path,
                                        unprivileged=unprivileged,
                                        **call_args)
                message = str(exc)
                self.assertIn(shown, message, label)
                for word in reason_words:
                    self.assertIn(word, message, label)
                for word in names:
                    self.assertIn(word, message, label)
                if issubclass(error, exception.InvalidPath):
                    for secret in self.secrets(path):
                        self.assertNotIn(secret, message, label)
        for p, state in before.items():
            self.assertEqual(state, pb_fixtures.file_state(p),
                             'touched: %s' % p)


class AttackerTreeTestCase(TestCase):
    """The nova user's tree owned by an attacker: a user made for the test
    (useradd, ``USER_PREFIX`` + 8 hex, removed at cleanup), ``scratch`` (a
    temporary directory opened for traversal), ``nova_home`` and its
    ``instances`` directory, both the user's, set as instances_path (root
    only).
    """

    USER_PREFIX = 'pbatk'

    def setUp(self):
        super().setUp()
        pb_fixtures.skip_unless_root(self)
        self.scratch = self.useFixture(fixtures.TempDir()).path
        # The attacker must reach its tree: open the test's temporary
        # directories (root's, 0700) for traversal.
        path = self.scratch
        while path not in ('/', '/tmp', '/var/tmp'):
            os.chmod(path, 0o755)
            path = os.path.dirname(path)
        user = self.useFixture(pb_fixtures.SystemUser(self.USER_PREFIX))
        self.user, self.uid, self.gid = user.name, user.uid, user.gid
        self.nova_home = self.attacker_dir(os.path.join(self.scratch,
                                                        'nova'))
        self.instances = self.attacker_dir(os.path.join(self.nova_home,
                                                        'instances'))
        # base.TestCase overrides instances_path: nova.conf's must win.
        self.flags(instances_path=self.instances)

    def attacker_dir(self, path):
        os.mkdir(path)
        os.chown(path, self.uid, self.gid)
        os.chmod(path, 0o755)
        return path

    def attacker_file(self, path):
        os.chown(path, self.uid, self.gid)
        return path


# The privsep check's test cases, shared by
# tests/unit/checks/test_check_privsep.py and
# tests/integration/test_check_privsep_import.py.
BIN = os.path.dirname(sys.executable)
PRIVSEP_HELPER = os.path.join(BIN, 'privsep-helper')
FILTERS = os.path.join(os.path.dirname(__file__), '..', 'etc', 'rootwrap.d',
                       'prealloc_backend.filters')


class PrivsepCheckCase(CheckTestCase):
    """prealloc-backend check's privsep check on a real nova.conf."""

    def setUp(self):
        super().setUp()
        self.sections = self.nova_conf()

    def check(self, helper_command=None, mode='space'):
        self.sections['prealloc_backend']['mode'] = mode
        if helper_command is None:
            del self.sections['prealloc_backend_privsep']
        else:
            self.sections['prealloc_backend_privsep']['helper_command'] = (
                helper_command)
        from prealloc_backend.checks import privsep

        return privsep.check_privsep(self.check_host(self.sections))


class RootHelperCheckCase(PrivsepCheckCase):
    """nova-compute's root helper (sudo nova-rootwrap) and its filters."""

    def setUp(self):
        super().setUp()
        # oslo.privsep keeps the root helper in a global: put its
        # default back.
        from oslo_privsep import priv_context

        self.addCleanup(priv_context.init, root_helper=['sudo'])
        self.filters_dir = os.path.join(self.tmp, 'rootwrap.d')
        os.mkdir(self.filters_dir)
        shutil.copy(FILTERS, self.filters_dir)
        self.rootwrap_conf = os.path.join(self.tmp, 'rootwrap.conf')
        self.sections['DEFAULT']['rootwrap_config'] = self.rootwrap_conf

    def write_rootwrap(self, exec_dirs):
        pb_fixtures.write_conf(self.rootwrap_conf, {'DEFAULT': {
            'filters_path': self.filters_dir, 'exec_dirs': exec_dirs}})


# The uid instances_path is given to when the tests run as root (no
# passwd entry): the privileged daemon's pin rules refuse root's.
CAPACITY_NOVA_UID = 54322


class FakeDomain:
    """What checks.capacity.read_guests asks of a libvirt domain: its
    UUID, state and reason, and nova's metadata element (the XML nova's
    own config classes write into a domain), or an error for a domain
    without it. ``namespaced=False`` answers as libvirt 9.0 was seen to
    (the cloud tier): the element stripped of nova's namespace.
    """

    def __init__(self, uuid, state=1, reason=1, flavor=None,
                 namespaced=False):
        self.uuid = uuid
        self._state = (state, reason)
        self.flavor = flavor
        self.namespaced = namespaced

    def UUIDString(self):
        return self.uuid

    def state(self):
        return self._state

    def metadata(self, kind, uri, flags):
        if self.flavor is None:
            raise RuntimeError('metadata not found: no nova metadata')
        from nova.virt.libvirt import config as vconfig

        disk, ephemeral, swap, specs = self.flavor
        meta = vconfig.LibvirtConfigGuestMetaNovaInstance()
        meta.package, meta.name, meta.creationTime = '34.0.0', 'vm', 0
        owner = vconfig.LibvirtConfigGuestMetaNovaOwner()
        owner.userid = owner.username = 'u'
        owner.projectid = owner.projectname = 'p'
        meta.owner = owner
        flavor = vconfig.LibvirtConfigGuestMetaNovaFlavor()
        flavor.name, flavor.id, flavor.memory, flavor.vcpus = 'f', '1', 128, 1
        flavor.disk, flavor.ephemeral, flavor.swap = disk, ephemeral, swap
        flavor.extra_specs = specs
        meta.flavor = flavor
        if self.namespaced:
            return meta.to_xml()
        from lxml import etree

        root = etree.fromstring(meta.to_xml())
        for node in root.iter():
            node.tag = etree.QName(node).localname
        etree.cleanup_namespaces(root)
        return etree.tostring(root).decode()


class FakeReadOnlyConnection:
    """A read-only libvirt connection's listAllDomains and close."""

    def __init__(self, domains):
        self.domains = domains
        self.uris = []
        self.closed = False

    def __call__(self, uri):
        self.uris.append(uri)
        return self

    def listAllDomains(self, flags):
        return list(self.domains)

    def close(self):
        self.closed = True


class CapacityHostCase(CheckTestCase):
    """A host's instances_path holding real disks made with qemu-img and
    fallocate(2) as the plugin makes them, for ``prealloc-backend report``
    and the check's Capacity row; given to CAPACITY_NOVA_UID when the
    tests run as root (the scan then runs as that uid).
    """

    OVERLAY = ('preallocation=%s,extended_l2=on,cluster_size=128k,'
               'backing_file=%s,backing_fmt=raw')

    def setUp(self):
        super().setUp()
        if os.geteuid() == 0:
            os.chown(self.instances, CAPACITY_NOVA_UID, CAPACITY_NOVA_UID)
        self.base_dir = os.path.join(self.instances, '_base')
        os.mkdir(self.base_dir)
        self.base = os.path.join(self.base_dir, 'base-image')
        pb_fixtures.make_base(self.base, 'raw', 3 * units.Mi)

    def disk(self, name='disk', mode='space', size=64 * units.Mi,
             fmt='qcow2', uuid=None):
        """A disk ``name`` of a new (or ``uuid``'s) instance directory, as
        the plugin makes it in ``mode``; recorded in disk.info. Returns
        (uuid, path).
        """
        import json

        uuid = uuid or uuidutils.generate_uuid()
        directory = os.path.join(self.instances, uuid)
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, name)
        if fmt == 'qcow2':
            prealloc = {'space': 'falloc', 'full': 'full',
                        'metadata': 'metadata', 'none': 'off'}[mode]
            subprocess.run(['qemu-img', 'create', '-f', 'qcow2', '-o',
                            self.OVERLAY % (prealloc, self.base), path,
                            str(size)], check=True, capture_output=True)
        else:
            with open(path, 'wb') as f:
                f.truncate(size)
            if mode == 'space':
                subprocess.run(['fallocate', '-l', str(size), path],
                               check=True)
            elif mode == 'full':
                subprocess.run(['dd', 'if=/dev/zero', 'of=%s' % path,
                                'bs=1M', 'count=%d' % (size // units.Mi),
                                'conv=notrunc,fsync'], check=True,
                               capture_output=True)
        info = os.path.join(directory, 'disk.info')
        record = {}
        if os.path.exists(info):
            with open(info) as f:
                record = json.load(f)
        record[path] = fmt
        with open(info, 'w') as f:
            json.dump(record, f)
        return uuid, path
