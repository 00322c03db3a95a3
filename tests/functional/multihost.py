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

"""Harness: several compute hosts in nova's in-process services.

nova's in-process compute services share one oslo.config CONF, so two
"hosts" started with ``start_compute(hostname=...)`` (as nova's own
multi-host libvirt functional tests do) would share ``instances_path`` (the
shared-storage case, which nova detects as such), ``my_ip`` (nova would
then take every migration for a same-host one) and the image options
(images_type, use_cow_images, preallocate_images, [prealloc_backend]),
which nova and the plugin read at every disk operation, not only at start.

HostScope gives each host its own values of those options, and so its own
instance directory on its own (real) filesystem, while one of its compute
services runs code:

* ``oslo_config.cfg.ConfigOpts._get`` answers host-specific values for the
  options a host declared, when the calling thread runs for that host;
* a thread runs for a host while an RPC call or cast to that host's compute
  manager is dispatched (oslo.messaging's RPCDispatcher._do_dispatch), while
  the test starts that host's service or runs its periodic
  update_available_resource, and in every thread nova spawns from
  such a thread (nova.thread_pool_factory.spawn_on passes the host on, as it
  passes the request context);
* a live migration (``stub_live_migration``) defines the guest on the
  destination, as nova's own LibvirtMigrationMixin does (nova's fake
  libvirt fails every migrateToURI3), and, for a block migration, does
  what QEMU's block copy does to the disks: see ``block_copy``;
* nova's remote filesystem calls (``[libvirt] remote_filesystem_transport``
  ssh or rsync: ``ssh host touch/mkdir/rm`` and ``scp``/``rsync`` to
  ``<ip>:<path>``) run on this machine, with the path moved from the
  calling host's instance directory to the other host's. The copy is a
  REAL copy done as each transport does it: ``rsync -r --sparse``
  (nova's own command line, run locally by the real rsync), and for scp a
  full byte copy (scp writes every byte, zeros included: the file arrives
  fully allocated). Same-host and shared-storage copies are nova's own
  ``cp -r``, untouched.

Nothing below the libvirt API is faked beyond what tests/functional/base.py
already fakes (nova's fake libvirt).
"""

import contextlib
import json
import os
import subprocess
import threading
import time
import urllib.parse

import fixtures
from lxml import etree
from nova.compute import manager as compute_manager
from nova.tests.fixtures import libvirt as fakelibvirt
from nova import thread_pool_factory
from nova.virt.libvirt import driver as libvirt_driver
from oslo_concurrency import processutils
from oslo_config import cfg
from oslo_messaging.rpc import dispatcher as rpc_dispatcher
from oslo_serialization import jsonutils
from oslo_utils import units

from tests import fixtures as pb_fixtures
from tests.functional import base

CONF = cfg.CONF

# Full-copy chunk for the scp-like transport.
COPY_CHUNK = 4 * units.Mi


class Host:
    """One compute host: its name, address, instance directory and the
    option values it sees.
    """

    def __init__(self, name, ip, instances_path):
        self.name = name
        self.ip = ip
        self.instances_path = instances_path
        # NOTE(oslo.config): migration_inbound_addr defaults to '$my_ip', which
        # oslo.config substitutes without going through ConfigOpts._get.
        self.options = {(None, 'host'): name, (None, 'my_ip'): ip,
                        ('libvirt', 'migration_inbound_addr'): ip,
                        (None, 'instances_path'): instances_path}

    def set(self, group=None, **values):
        for key, value in values.items():
            self.options[(group, key)] = value


class HostScope(fixtures.Fixture):
    """Per-host option values for in-process compute services (see the
    module docstring).
    """

    def __init__(self):
        super().__init__()
        self.hosts = {}
        self._local = threading.local()

    # -- which host is running ---------------------------------------------

    def current(self):
        return getattr(self._local, 'host', None)

    @contextlib.contextmanager
    def on(self, name):
        """Run the block as host ``name``."""
        previous = self.current()
        self._local.host = self.hosts[name] if name else None
        try:
            yield
        finally:
            self._local.host = previous

    def add(self, name, ip, instances_path):
        host = Host(name, ip, instances_path)
        self.hosts[name] = host
        return host

    def by_ip(self, ip):
        for host in self.hosts.values():
            if host.ip == ip:
                return host
        raise AssertionError('no host has address %s' % ip)

    def moved(self, path, to_host):
        """``path`` (as the calling host names it) on ``to_host``: the same
        path relative to the instance directory.
        """
        source = self.current()
        roots = ([source.instances_path] if source else []) + [
            h.instances_path for h in self.hosts.values()]
        for root in roots:
            if path == root or path.startswith(root.rstrip('/') + '/'):
                relative = os.path.relpath(path, root)
                return os.path.normpath(
                    os.path.join(to_host.instances_path, relative))
        raise AssertionError('%s is in no host\'s instance directory' % path)

    def remote(self, address):
        """``<ip>:<path>`` -> the local path of that file on that host."""
        ip, path = address.rsplit(':', 1)
        return self.moved(path, self.by_ip(ip.strip('[]')))

    def owner(self, path):
        """The host whose instance directory holds ``path`` (the calling
        host first: with shared storage every host holds it).
        """
        candidates = ([self.current()] if self.current() else []) + list(
            self.hosts.values())
        for host in candidates:
            root = host.instances_path.rstrip('/') + '/'
            if path.startswith(root):
                return host
        raise AssertionError('%s is in no host\'s instance directory' % path)

    def fix_copied(self, path):
        """Rename the sending host's paths named inside a file just copied
        to ``path`` (see _RemoteProcessutils).
        """
        if os.path.isdir(path):
            for name in os.listdir(path):
                self.fix_copied(os.path.join(path, name))
            return
        host = self.owner(path)
        if os.path.basename(path) == 'disk.info':
            with open(path) as f:
                info = json.load(f)
            info = {self.moved(key, host): fmt for key, fmt in info.items()}
            with open(path, 'w') as f:
                json.dump(info, f)
            return
        info = pb_fixtures.qemu_img_info(path)
        backing = info.get('backing-filename')
        if info['format'] != 'qcow2' or not backing or not any(
                backing.startswith(h.instances_path.rstrip('/') + '/')
                for h in self.hosts.values()):
            # Only a path of a host's instance directory is renamed: a
            # header naming any other file (a raw disk's guest-written
            # qcow2 header, test_disk_format) keeps its bytes.
            return
        moved = self.moved(backing, host)
        if moved != backing:
            subprocess.run(['qemu-img', 'rebase', '-u', '-F',
                            info.get('backing-filename-format', 'raw'),
                            '-b', moved, path], check=True,
                           capture_output=True)

    # -- patches -----------------------------------------------------------

    def _setUp(self):
        scope = self
        original_get = cfg.ConfigOpts._get

        def _get(conf, name, group=None, namespace=None):
            host = scope.current()
            if host is not None and conf is CONF and namespace is None:
                key = (getattr(group, 'name', group), name)
                if key[0] == 'DEFAULT':
                    key = (None, name)
                if key in host.options:
                    return host.options[key]
            return original_get(conf, name, group, namespace)

        self.useFixture(fixtures.MonkeyPatch(
            'oslo_config.cfg.ConfigOpts._get', _get))

        original_dispatch = rpc_dispatcher.RPCDispatcher._do_dispatch

        def _do_dispatch(dispatcher, endpoint, method, ctxt, args):
            # nova.service wraps each endpoint (_TrackingEndpointWrapper);
            # the compute manager's V5 proxy holds the manager.
            manager = getattr(endpoint, '_endpoint', endpoint)
            manager = getattr(manager, 'manager', manager)
            name = None
            if isinstance(manager, compute_manager.ComputeManager):
                name = manager.host if manager.host in scope.hosts else None
            if name is None:
                return original_dispatch(dispatcher, endpoint, method, ctxt,
                                         args)
            with scope.on(name):
                return original_dispatch(dispatcher, endpoint, method, ctxt,
                                         args)

        self.useFixture(fixtures.MonkeyPatch(
            'oslo_messaging.rpc.dispatcher.RPCDispatcher._do_dispatch',
            _do_dispatch))

        # A periodic task the test runs itself (update_available_resource,
        # which updates placement through the driver's
        # update_provider_tree) runs as the manager's host, as its own
        # service's periodic would.
        original_update = compute_manager.ComputeManager.\
            update_available_resource

        def update_available_resource(manager, *args, **kwargs):
            name = manager.host if manager.host in scope.hosts else None
            with scope.on(name):
                return original_update(manager, *args, **kwargs)

        self.useFixture(fixtures.MonkeyPatch(
            'nova.compute.manager.ComputeManager.update_available_resource',
            update_available_resource))

        original_spawn_on = thread_pool_factory.spawn_on

        def spawn_on(executor_type, func, *args, **kwargs):
            host = scope.current()
            if host is None:
                return original_spawn_on(executor_type, func, *args, **kwargs)

            def on_host(*a, **kw):
                with scope.on(host.name):
                    return func(*a, **kw)

            return original_spawn_on(executor_type, on_host, *args, **kwargs)

        self.useFixture(fixtures.MonkeyPatch(
            'nova.thread_pool_factory.spawn_on', spawn_on))

        # ssh <host> touch|mkdir -p|rm [-rf] <path>: run here, on the path
        # of that host.
        def ssh_execute(dest, *cmd, **kwargs):
            host = scope.by_ip(dest.strip('[]'))
            cmd = [scope.moved(arg, host) if arg.startswith('/') else arg
                   for arg in cmd]
            return processutils.execute(*cmd)

        self.useFixture(fixtures.MonkeyPatch('nova.utils.ssh_execute',
                                             ssh_execute))

        # nova's shared-storage check for an instance: one host makes a file
        # in its instance directory and sends the file's PATH over RPC to
        # the other, which looks for it: the same path string on the other
        # host is that host's file.
        original_remote = (libvirt_driver.LibvirtDriver.
                           check_instance_shared_storage_remote)

        def check_remote(driver, context, data):
            host = scope.current()
            if host is not None and data and data.get('filename'):
                data = dict(data, filename=scope.moved(data['filename'],
                                                       host))
            return original_remote(driver, context, data)

        self.useFixture(fixtures.MonkeyPatch(
            'nova.virt.libvirt.driver.LibvirtDriver.'
            'check_instance_shared_storage_remote', check_remote))
        self.useFixture(fixtures.MonkeyPatch(
            'nova.virt.libvirt.volume.remotefs.processutils',
            _RemoteProcessutils(scope)))

        # finish_migration gets the source's disk_info over RPC: each
        # disk's 'path' as the SOURCE names it. On real hosts the same path
        # string names the destination's copy; here it is renamed so.
        original_finish = libvirt_driver.LibvirtDriver.finish_migration

        def finish_migration(driver, context, migration, instance,
                             disk_info, *args, **kwargs):
            host = scope.current()
            if host is not None and disk_info:
                disks = jsonutils.loads(disk_info)
                for disk in disks:
                    if disk.get('path'):
                        disk['path'] = scope.moved(disk['path'], host)
                disk_info = jsonutils.dumps(disks)
            return original_finish(driver, context, migration, instance,
                                   disk_info, *args, **kwargs)

        self.useFixture(fixtures.MonkeyPatch(
            'nova.virt.libvirt.driver.LibvirtDriver.finish_migration',
            finish_migration))


class _RemoteProcessutils:
    """nova's remotefs module's ``processutils``: each ``<ip>:<path>``
    argument becomes that host's local path; ``scp`` becomes a full byte
    copy; ``rsync`` runs as nova wrote it (locally).

    A copied file keeps its bytes; only what names a path of the sending
    host is renamed for the receiving one, as the same path string on a
    real host would name its own file: a qcow2 header's backing file
    (``qemu-img rebase -u``, a header-only change) and disk.info's keys.
    """

    ProcessExecutionError = processutils.ProcessExecutionError

    def __init__(self, scope):
        self.scope = scope

    @staticmethod
    def _is_remote(arg):
        return ':' in arg and not arg.startswith(('/', '-'))

    def execute(self, *cmd, on_execute=None, on_completion=None, **kwargs):
        cmd = list(cmd)
        if cmd[0] == 'rsync' and '--relative' in cmd:
            return self._create_object(cmd)
        local = [self.scope.remote(a) if self._is_remote(a) else a
                 for a in cmd]
        if cmd[0] == 'scp':
            src, dst = [a for a in local[1:] if not a.startswith('-')]
            full_copy(src, dst)
            self.scope.fix_copied(dst)
            return '', ''
        out = processutils.execute(*local, on_execute=on_execute,
                                   on_completion=on_completion, **kwargs)
        if cmd[0] == 'rsync' and '--sparse' in cmd:
            self.scope.fix_copied(
                [a for a in local[1:] if not a.startswith('-')][-1])
        return out

    def _create_object(self, cmd):
        """nova's RsyncDriver makes a file or directory on the remote host
        with ``rsync --relative <tmp>/./<path> <ip>:/``: make it here.
        """
        source = [a for a in cmd if '/./' in a][0]
        host = self.scope.by_ip(cmd[-1].rsplit(':', 1)[0].strip('[]'))
        path = self.scope.moved('/' + source.split('/./', 1)[1], host)
        if os.path.isdir(source):
            os.makedirs(path, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, 'a').close()
        return '', ''


def block_copy(src, dst, fmt):
    """What QEMU's block copy of a block live migration writes into the
    destination's disk, simulated with a real copy (nova's fake libvirt
    copies nothing): the guest-visible data, written into the disk
    pre_live_migration made there, keeping that file (its layout and
    allocation are the destination's plan).

    * raw: ``qemu-img convert -n --target-is-zero``: every non-zero block
      of the source written in place; zero areas are not written (the new
      disk reads zeros there), so nothing is discarded;
    * qcow2 overlay: nova block-migrates with VIR_MIGRATE_NON_SHARED_INC,
      so only the overlay's own data is copied (sync=top), onto a
      destination overlay of the same backing image: each data extent of
      the source's top layer (``qemu-img map``), read at its host offset,
      written with ``qemu-io write`` at its guest offset. (``qemu-img
      convert -n -B`` was tried: QEMU 7.2 writes zero clusters past the
      backing file's end, which discards the destination's preallocation,
      something a mirror into a fresh overlay does not do.)
    """
    if fmt == 'raw':
        subprocess.run(['qemu-img', 'convert', '-n', '--target-is-zero',
                        '-f', 'raw', '-O', 'raw', src, dst],
                       check=True, capture_output=True)
        return
    chunk = dst + '.block-copy'
    try:
        with open(src, 'rb') as f:
            for extent in _top_data(src):
                f.seek(extent['offset'])
                with open(chunk, 'wb') as out:
                    out.write(f.read(extent['length']))
                subprocess.run(['qemu-io', '-f', 'qcow2', '-c',
                                'write -s %s %d %d' % (
                                    chunk, extent['start'],
                                    extent['length']), dst],
                               check=True, capture_output=True)
    finally:
        if os.path.exists(chunk):
            os.unlink(chunk)


def _top_data(path):
    """The extents of a qcow2 file's own (top layer) data."""
    out = subprocess.run(['qemu-img', 'map', '--output=json', '-f', 'qcow2',
                          path], check=True, capture_output=True).stdout
    return [e for e in json.loads(out)
            if e['depth'] == 0 and e['data'] and 'offset' in e]


def file_disks(xml):
    """[(path, format)] of a domain XML's file disks."""
    disks = []
    for disk in etree.fromstring(xml).findall('./devices/disk'):
        source, driver = disk.find('source'), disk.find('driver')
        if source is not None and source.get('file'):
            disks.append((source.get('file'), driver.get('type')))
    return disks


def full_copy(src, dst):
    """What scp does to a file: read every byte, write every byte (zeros
    included), so that the copy has no holes.
    """
    if os.path.isdir(dst):
        dst = os.path.join(dst, os.path.basename(src))
    with open(src, 'rb') as fin, open(dst, 'wb') as fout:
        while True:
            chunk = fin.read(COPY_CHUNK)
            if not chunk:
                break
            fout.write(chunk)
        fout.flush()
        os.fsync(fout.fileno())


class MultiHostTestBase(base.ServersTestBase):
    """Two or three compute hosts, each with its own options and (unless
    ``shared``) its own instance directory.
    """

    # [libvirt] remote_filesystem_transport: 'rsync' or 'ssh' (scp).
    transport = 'rsync'
    # Migrations, forced hosts and host names need the admin API; the
    # user's view is self.user_api.
    ADMIN_API = True

    def setUp(self):
        super().setUp()
        self.user_api = self.api_fixture.api
        self.user_api.microversion = self.microversion
        self.scope = self.useFixture(HostScope())
        self.flags(remote_filesystem_transport=self.transport,
                   group='libvirt')
        self.flags(allow_resize_to_same_host=False)
        self.shared_path = self.instances_path

    def start_compute(self, hostname='compute1', *args, **kwargs):
        with self.scope.on(hostname):
            return super().start_compute(hostname, *args, **kwargs)

    def force_down(self, host, down=True):
        service = self.api.get_services(binary='nova-compute', host=host)[0]
        self.api.put_service(service['id'], {'forced_down': down})

    def add_host(self, name, fmt='qcow2', mode='space', shared=False,
                 stock=False, instances_path=None, host_info=None,
                 **prealloc_opts):
        """Start compute host ``name``: disks ``fmt`` (qcow2 overlays or raw
        files) in ``mode``; its own instance directory unless ``shared``;
        nova's own LibvirtDriver if ``stock``.
        """
        index = len(self.scope.hosts) + 1
        if instances_path is None:
            if shared:
                instances_path = self.shared_path
            else:
                instances_path = os.path.join(self.work_dir, 'hosts', name)
                os.makedirs(instances_path)
        host = self.scope.add(name, '192.0.2.%d' % index, instances_path)
        if fmt == 'qcow2':
            host.set(use_cow_images=True)
            host.set('libvirt', images_type='default')
        else:
            host.set(use_cow_images=False)
            host.set('libvirt', images_type='raw')
        # nova's preallocate_images knows none and space; the plugin's other
        # modes are [prealloc_backend] mode (as tests/functional/test_boot).
        if mode in ('none', 'space'):
            host.set(preallocate_images=mode)
        else:
            host.set(preallocate_images='none')
            prealloc_opts['mode'] = mode
        host.set('prealloc_backend', **prealloc_opts)
        host.set(compute_driver=('libvirt.LibvirtDriver' if stock
                                 else base.driver.COMPUTE_DRIVER))
        self.start_compute(hostname=name, host_info=host_info)
        compute_driver = self.computes[name].driver
        if stock:
            self.assertNotIsInstance(compute_driver,
                                     base.driver.LibvirtDriver)
        else:
            self.assertIsInstance(compute_driver, base.driver.LibvirtDriver)
        return host

    def add_loop_host(self, name, size_mb, kind='ext4', **kwargs):
        """A host whose instance directory is a real small filesystem."""
        pb_fixtures.skip_unless_root(self)
        fs = self.useFixture(pb_fixtures.LoopFilesystem(
            kind, size_mb, parent=self.work_dir))
        return self.add_host(name, instances_path=fs.path, **kwargs)

    # -- live migration ------------------------------------------------------

    def stub_live_migration(self, copy=True, fail=False):
        """Live migrations succeed (nova's fake libvirt fails them all, in a
        way nova cannot roll back); a block migration copies the disks'
        data with ``block_copy`` when ``copy``. With ``fail`` libvirt's
        migration job fails instead, after pre_live_migration made the
        destination's disks, as nova's own rollback tests do it
        (regressions/test_bug_1888395): nova rolls back.
        """
        self.copy_on_live_migration = copy
        self.fail_live_migration = fail
        self.useFixture(fixtures.MonkeyPatch(
            'nova.tests.fixtures.libvirt.Domain.migrateToURI3',
            self._migrate_stub))

    def _migrate_stub(self, domain, destination, params, flags):
        # destination: qemu+tcp://<host name or address>/system
        name = urllib.parse.urlparse(destination).hostname
        dest = (self.scope.hosts[name] if name in self.scope.hosts
                else self.scope.by_ip(name))
        if self.fail_live_migration:
            domain.fail_job()
            return
        xml = params['destination_xml']
        if (self.copy_on_live_migration and
                flags & fakelibvirt.VIR_MIGRATE_NON_SHARED_INC):
            for path, fmt in file_disks(xml):
                target = self.scope.moved(path, dest)
                if target != path:
                    block_copy(path, target, fmt)
        self.computes[dest.name].driver._host.get_connection().createXML(
            xml, 'fake-createXML-doesnt-care-about-flags')
        # The last step: nova's monitor then sees the job completed.
        domain.complete_job()

    def live_migrate(self, server, host, migration_state='completed',
                     server_state='ACTIVE'):
        """Live-migrate to ``host`` (block migration unless shared, as
        nova decides with 'auto'); wait for the migration to reach
        ``migration_state`` (one, or a tuple of acceptable ones) and the
        server to be ``server_state`` with no task.
        """
        self.api.post_server_action(
            server['id'],
            {'os-migrateLive': {'host': host, 'block_migration': 'auto'}})
        if isinstance(migration_state, str):
            migration_state = (migration_state,)
        self._wait_for_migration_status(server, list(migration_state))
        return self._wait_for_server_parameter(
            server, {'status': server_state, 'OS-EXT-STS:task_state': None})

    def _wait_for_migration_status(self, server, expected_statuses):
        # nova's helper waits 5 s; a migration that preallocates a disk
        # (zero-fill) takes longer on a busy machine.
        statuses = [status.lower() for status in expected_statuses]
        deadline = time.monotonic() + base.WAIT_SECONDS
        actual = None
        while time.monotonic() < deadline:
            migrations = [m for m in self.api.api_get(
                '/os-migrations').body['migrations']
                if m['instance_uuid'] == server['id']]
            if migrations:
                last = max(migrations, key=lambda m: m['id'])
                actual = last['status']
                if actual.lower() in statuses:
                    return last
            time.sleep(0.5)
        self.fail('Timed out waiting for a migration of %s with status %s '
                  '(last seen: %s)' % (server['id'], expected_statuses,
                                       actual))

    def action_events(self, server, action, api=None):
        """{event name: event} of the server's last ``action`` (admin
        view: host, details, traceback).
        """
        api = api or self.api
        actions = [a for a in api.get_instance_actions(server['id'])
                   if a['action'] == action]
        self.assertTrue(actions, 'no %s action' % action)
        details = api.get_instance_action_details(
            server['id'], actions[0]['request_id'])
        return {event['event']: event for event in details['events']}

    # -- where things are ----------------------------------------------------

    def host_dir(self, host, server):
        return os.path.join(self.scope.hosts[host].instances_path,
                            server['id'])

    def host_disk(self, host, server, name='disk'):
        return os.path.join(self.host_dir(host, server), name)

    def host_base(self, host, image_id):
        return os.path.join(self.scope.hosts[host].instances_path, '_base',
                            base.imagecache.get_cache_fname(image_id))

    def server_host(self, server):
        return self.api.get_server(server['id'])[
            'OS-EXT-SRV-ATTR:host']

    def left_on(self, server, host):
        """The directories, disks, journals and temporary files of
        ``server`` on ``host``; with shared storage, not the instance
        directory (the server's), only ``_resize`` and the like.
        """
        root = self.scope.hosts[host].instances_path
        left = [name for name in os.listdir(root)
                if name.startswith(server['id'])]
        if root == self.shared_path:
            left = [name for name in left if name != server['id']]
        return left

    def assertNothingLeft(self, server, host):
        """Nothing of ``server`` left on ``host`` (after it left it):
        left_on.
        """
        left = self.left_on(server, host)
        self.assertEqual([], left, 'left on %s: %s' % (host, left))
