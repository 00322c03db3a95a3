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

"""Base of the real-hypervisor tier.

nova's in-process API, conductor and scheduler (its functional framework,
``_IntegratedTestBase``) with one compute service whose driver is the
plugin's, loaded by ``nova.virt.driver.load_compute_driver`` with
``compute_driver = prealloc_backend.LibvirtDriver``, on the REAL libvirt
connection ``qemu:///system``: real libvirtd, real QEMU (``virt_type=qemu``,
TCG), real guests booted from disks the plugin made. Only Glance, Neutron,
Cinder and Placement are nova's in-process fixtures; servers have no
network.

The guest is prealloc_bench.guest's tiny kernel + busybox initramfs,
uploaded to the Glance fixture as kernel and ramdisk images that the root
disk image names (kernel_id, ramdisk_id, os_command_line).

Needs root, a libvirtd answering on qemu:///system with a test-box
qemu.conf (QEMU as root, no security driver), the libvirt python module and
a guest kernel: ``.ci/libvirt-up`` provides all of them. Without them the
tests skip with the reason; with CI=true they fail instead.
"""

import builtins
import fcntl
import functools
import glob
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import fixtures
from lxml import etree
from nova.tests.functional import integrated_helpers
from oslo_log import log as logging
from oslo_utils import units
import psutil

from prealloc_backend.adapter import driver as pb_driver
from prealloc_backend import conf as pb_conf
from prealloc_bench import guest as pb_guest
from tests import fixtures as pb_fixtures

try:
    # NOTE(nova): imported here, before any test runs: nova's test base
    # installs an import hook that refuses 'libvirt'
    # (ImportModulePoisonFixture), and a hook only sees modules not imported
    # yet. nova's own libvirt modules then pick this one up from sys.modules.
    import libvirt
except ImportError:
    libvirt = None

LOG = logging.getLogger(__name__)
CONF = pb_conf.CONF

URI = 'qemu:///system'
# Domain names of this tier (instance_name_template), so that nothing else
# on the host is ever touched by the clean-ups.
DOMAIN_PREFIX = 'prealloc-real-'
INSTANCE_NAME_TEMPLATE = DOMAIN_PREFIX + '%(uuid)s'
QEMU_PID_DIR = '/run/libvirt/qemu'
BASE_IMAGE_SIZE = 4 * units.Mi
GUEST_MEMORY_MB = 256
# Seconds a TCG guest gets to reach its report on the console.
CONSOLE_TIMEOUT = 90
# .ci/libvirt-up's state directory: the PID file of the libvirtd it
# started (or its mark that systemd runs it), and the tier's lock.
LIBVIRT_STATE_DIR = os.environ.get('PREALLOC_LIBVIRT_STATE_DIR',
                                   '/var/lib/prealloc-backend/libvirt-state')
TIER_LOCK = 'real-tier.lock'
TIER_GATE = 'real-tier.gate'
# Seconds a test waits for it at most (the longest test of the tier takes
# about 170 s).
TIER_LOCK_WAIT = 600

# NOTE(nova): nova's test base poisons these for every test
# (GenericPoisonFixture, SysFsPoisonFixture) so that unit tests cannot read the
# host. This tier is about the host: the real libvirt driver reads /sys,
# os.uname() and the host's addresses at start-up. The real functions are kept
# here, at import time, before any poison is installed, and put back in each
# test.
REAL_FUNCTIONS = {
    'builtins.open': builtins.open,
    'os.path.isdir': os.path.isdir,
    'os.listdir': os.listdir,
    'os.uname': os.uname,
    'glob.glob': glob.glob,
    'glob.iglob': glob.iglob,
    'psutil.net_if_addrs': psutil.net_if_addrs,
}


@functools.lru_cache(maxsize=None)
def environment_problem():
    """None when this host can run the tier, else why it cannot."""
    if os.geteuid() != 0:
        return ('the real-hypervisor tier needs root (QEMU runs as root '
                'with the test-box qemu.conf of .ci/libvirt-up)')
    if libvirt is None:
        return ('the libvirt python module is not installed '
                '(pip install libvirt-python; tox -e functional-real does)')
    for tool in ('qemu-system-x86_64', 'virsh', 'qemu-img'):
        if not _which(tool):
            return '%s is not installed: run .ci/libvirt-up' % tool
    libvirt.registerErrorHandler(_silence_libvirt_errors, None)
    try:
        conn = libvirt.open(URI)
    except libvirt.libvirtError as exc:
        return ('no libvirtd answers on %s (%s): run .ci/libvirt-up '
                '(CI=true or PREALLOC_REAL_LIBVIRT=1)' % (URI, exc))
    try:
        conn.getVersion()
    finally:
        conn.close()
    try:
        pb_guest.build_guest()
    except pb_guest.GuestError as exc:
        return 'no tiny guest can be built: %s' % exc
    return None


def _flock(fd, how, deadline):
    """flock(2) ``how`` on ``fd``, polled until ``deadline``."""
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise AssertionError(
                    'the real tier\'s lock (%s) was held by other tests for '
                    '%d s' % (TIER_LOCK, TIER_LOCK_WAIT))
            time.sleep(0.2)


def _open_lock(name):
    return os.open(os.path.join(LIBVIRT_STATE_DIR, name),
                   os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                   0o600)


def _tier_lock(exclusive):
    """The tier's lock on the libvirtd all its tests share (flock, in
    libvirt-up's state directory): shared by every test, exclusive for a
    test that restarts libvirtd (every other test's connection, and any
    call it has in flight, would die with it). The descriptors to close,
    or [] without that directory (a libvirtd libvirt-up did not start: no
    test restarts it).

    A gate before it makes the exclusive request win: the test that wants
    it holds the gate while it waits (the other worker's test in progress
    ends, and its next one waits at the gate), where the shared takers
    only pass through it. Bounded: a test of the other worker stuck in a
    libvirt call must not hang this one until tox's timeout, unexplained.
    """
    if not os.path.isdir(LIBVIRT_STATE_DIR):
        return []
    deadline = time.monotonic() + TIER_LOCK_WAIT
    gate = _open_lock(TIER_GATE)
    held = [gate]
    try:
        _flock(gate, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH,
               deadline)
        lock = _open_lock(TIER_LOCK)
        held.append(lock)
        _flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH,
               deadline)
    except BaseException:
        for fd in held:
            os.close(fd)
        raise
    if not exclusive:
        os.close(gate)
        held.remove(gate)
    return held


def hold_tier_lock(test, exclusive=False):
    """_tier_lock for ``test``, released when it ends (a test of the tier
    that uses libvirtd without RealHypervisorTestCase takes it too).
    """
    for fd in _tier_lock(exclusive):
        test.addCleanup(os.close, fd)


def _close_quietly(conn):
    try:
        conn.close()
    except Exception:
        pass   # closed already, or its libvirtd gone


def _libvirtd_pids():
    return {p.pid for p in psutil.process_iter(['name'])
            if p.info['name'] == 'libvirtd'}


def _our_libvirtd():
    """(how, pid): ('systemd', None) when libvirt-up had systemd restart
    it, ('pid', PID) when it started it by hand, (None, why not) else.
    """
    if os.path.exists(os.path.join(LIBVIRT_STATE_DIR, 'systemd')):
        return 'systemd', None
    try:
        with open(os.path.join(LIBVIRT_STATE_DIR, 'libvirtd.pid')) as f:
            pid = int(f.read().strip())
        with open('/proc/%d/comm' % pid) as f:
            if f.read().strip() == 'libvirtd':
                return 'pid', pid
    except (OSError, ValueError):
        pass
    return None, ('the libvirtd on %s was not started by .ci/libvirt-up '
                  '(no PID of it in %s): this test restarts only that one'
                  % (URI, LIBVIRT_STATE_DIR))


def _which(tool):
    for directory in os.environ.get('PATH', '').split(os.pathsep):
        if os.access(os.path.join(directory, tool), os.X_OK):
            return True
    return False


def require_environment(test):
    """Skip ``test`` with the reason, or fail it under CI=true."""
    problem = environment_problem()
    if problem is None:
        return
    if os.environ.get('CI') == 'true':
        test.fail('CI=true and the real-hypervisor tier cannot run: %s' %
                  problem)
    test.skipTest(problem)


def _silence_libvirt_errors(_ctx, _err):
    """libvirt prints every error on stderr by default; tests read the
    exceptions instead.
    """


def md5_of_file(path, length):
    return md5_of_file_range(path, 0, length)


def md5_of_file_range(path, offset, length):
    with open(path, 'rb') as f:
        f.seek(offset)
        return hashlib.md5(f.read(length)).hexdigest()


class RealHypervisorTestCase(integrated_helpers._IntegratedTestBase):
    """nova's integrated services plus one compute on the real libvirt.

    A test class chooses the host configuration (read once, when the
    compute starts): IMAGES_TYPE, PREALLOCATE_IMAGES (nova's own option),
    PREALLOC_MODE ([prealloc_backend] mode, None to follow nova's) and
    COMPUTE_DRIVER (stock nova's 'libvirt.LibvirtDriver' for controls).
    Flavors choose the mode per instance with the prealloc:mode extra spec.
    """

    IMAGES_TYPE = 'qcow2'
    PREALLOCATE_IMAGES = 'none'
    PREALLOC_MODE = None
    COMPUTE_DRIVER = pb_driver.COMPUTE_DRIVER
    # (kind, MiB) of a loop-mounted filesystem for instances_path
    # (fixtures.LoopFilesystem), or None: a directory of /tmp.
    INSTANCES_FS = None
    # True for a test that restarts libvirtd (restart_libvirtd): it runs
    # while no other test of the tier does.
    RESTARTS_LIBVIRTD = False
    microversion = 'latest'
    ADMIN_API = True

    def setUp(self):
        require_environment(self)
        # Before nova's test base starts the test's timeout: the wait for
        # the lock is not the test's time.
        hold_tier_lock(self, self.RESTARTS_LIBVIRTD)
        self._server_ids = set()
        if self.INSTANCES_FS:
            # A filesystem of its own (kind, MiB) for a test about room.
            self.instances_path = self.useFixture(
                pb_fixtures.LoopFilesystem(*self.INSTANCES_FS)).path
        else:
            self.instances_path = self.useFixture(fixtures.TempDir()).path
        super().setUp()
        # After the services (cleanups run last-in first-out): no domain of
        # this test outlives it, whatever happened.
        self.addCleanup(self._destroy_domains)
        self.guest = pb_guest.build_guest()
        self._images = {}

    # -- services ---------------------------------------------------------

    def _undo_host_poisons(self):
        for name, real in REAL_FUNCTIONS.items():
            self.useFixture(fixtures.MonkeyPatch(name, real))
        # NOTE(nova): nova's libvirt event loop (a native thread per Host
        # running virEventRunDefaultImpl) can be registered only once per
        # process and would outlive the test; nova's PoisonFunctions makes it
        # exit the process. The tier does without events: nova polls domain
        # states where it waits (spawn, reboot), and nothing here needs
        # lifecycle events.
        self.useFixture(fixtures.MonkeyPatch(
            'nova.virt.libvirt.host.Host._init_events', lambda host: None))
        # NOTE(nova): every test has its own in-memory cloud but they all share
        # the host's libvirtd; when tests run in parallel, a compute
        # starting with an empty database sees the other test's domains and
        # nova refuses to start ("My hypervisor has existing instances, but
        # I appear to be a new service"). The domains are not its own: the
        # tier names them prealloc-real-<uuid> and each test only ever
        # touches the uuids it booted.
        self.useFixture(fixtures.MockPatch(
            'nova.compute.manager.ComputeManager._sanity_check_new_host'))

    def _configure_compute(self):
        pb_driver.register()
        self.flags(compute_driver=self.COMPUTE_DRIVER,
                   instances_path=self.instances_path,
                   instance_name_template=INSTANCE_NAME_TEMPLATE,
                   preallocate_images=self.PREALLOCATE_IMAGES,
                   use_cow_images=self.IMAGES_TYPE == 'qcow2',
                   allow_resize_to_same_host=True,
                   # The tiny guest has no ACPI daemon and ignores the
                   # power button; without this, nova waits 60 s for a
                   # clean shutdown before it destroys the domain (resize).
                   shutdown_timeout=0,
                   # a raw full disk is copied on resize; keep RPC patient
                   rpc_response_timeout=300, long_rpc_timeout=600)
        self.flags(group='libvirt', connection_uri=URI, virt_type='qemu',
                   cpu_mode='none', images_type=self.IMAGES_TYPE)
        # A guest without display, tablet nor video boots about a
        # third faster under TCG; the tier reads the serial console only.
        self.flags(group='vnc', enabled=False)
        self.flags(pointer_model=None)
        self.flags(group='prealloc_backend', mode=self.PREALLOC_MODE)
        self.flags(group='wsgi', api_paste_config=os.path.join(
            sys.prefix, 'etc', 'nova', 'api-paste.ini'))

    def _setup_compute_service(self):
        # Runs inside _IntegratedTestBase.setUp, after nova's test base
        # installed its fixtures and before the API starts.
        self._undo_host_poisons()
        self.useFixture(pb_fixtures.PrivsepInProcess())
        self._configure_compute()
        libvirt.registerErrorHandler(_silence_libvirt_errors, None)
        self.conn = libvirt.open(URI)
        # The connection of the end (restart_libvirtd opens another),
        # after the domains are gone.
        self.addCleanup(lambda: _close_quietly(self.conn))
        return self._start_compute('compute1')

    def _destroy_domains(self):
        for dom in self.conn.listAllDomains():
            if (not dom.name().startswith(DOMAIN_PREFIX) or
                    dom.UUIDString() not in self._server_ids):
                continue
            LOG.warning('Destroying domain %s left by the test', dom.name())
            try:
                if dom.isActive():
                    dom.destroy()
                dom.undefine()
            except libvirt.libvirtError as exc:
                LOG.warning('Could not remove %s: %s', dom.name(), exc)

    # -- images and flavors -----------------------------------------------

    def _glance_image(self, name, disk_format, data, properties=None):
        image = self.glance.create(None, {
            'name': name,
            'disk_format': disk_format,
            'container_format': (disk_format if disk_format in ('aki', 'ari')
                                 else 'bare'),
            'size': len(data),
            'status': 'active',
            'visibility': 'public',
            'min_disk': 0,
            'min_ram': 0,
            'properties': dict(properties or {}),
        }, data=io.BytesIO(data))
        return image['id']

    def _guest_files(self):
        if 'kernel' not in self._images:
            with open(self.guest.kernel, 'rb') as f:
                self._images['kernel'] = self._glance_image(
                    'prealloc-guest-kernel', 'aki', f.read())
            with open(self.guest.initramfs, 'rb') as f:
                self._images['ramdisk'] = self._glance_image(
                    'prealloc-guest-initramfs', 'ari', f.read())
            base = os.path.join(self.useFixture(fixtures.TempDir()).path,
                                'base.raw')
            pb_fixtures.make_base(base, 'raw', BASE_IMAGE_SIZE, seed=7)
            self.base_raw = base
            self.base_md5 = md5_of_file(base, units.Mi)
        return self._images['kernel'], self._images['ramdisk']

    def image(self, disk_format, action=pb_guest.ACTION_IDLE, mib=64,
              **cmdline):
        """A Glance image of the tiny guest whose root disk is a small
        ``disk_format`` image with non-zero data; ``action``, ``mib`` and
        ``cmdline`` (pb_guest.kernel_cmdline's other arguments) go on the
        guest's command line.
        """
        key = (disk_format, action, mib) + tuple(sorted(cmdline.items()))
        if key in self._images:
            return self._images[key]
        kernel_id, ramdisk_id = self._guest_files()
        if disk_format == 'raw':
            path = self.base_raw
        else:
            path = self.base_raw + '.' + disk_format
            if not os.path.exists(path):
                subprocess.run(['qemu-img', 'convert', '-f', 'raw', '-O',
                                disk_format, self.base_raw, path],
                               check=True, capture_output=True)
        with open(path, 'rb') as f:
            data = f.read()
        self._images[key] = self._glance_image(
            'prealloc-guest-%s-%s' % (disk_format, action), disk_format, data,
            {'kernel_id': kernel_id, 'ramdisk_id': ramdisk_id,
             'os_command_line': pb_guest.kernel_cmdline(action, mib=mib,
                                                        **cmdline),
             'hw_disk_bus': 'virtio', 'hw_video_model': 'none'})
        return self._images[key]

    def flavor(self, disk_gb=1, mode=None, name=None):
        extra_specs = {}
        if mode is not None:
            extra_specs['prealloc:mode'] = mode
        return self._create_flavor(
            name=name, memory_mb=GUEST_MEMORY_MB, vcpu=1, disk=disk_gb,
            ephemeral=0, swap=0, extra_spec=extra_specs or None)

    # -- servers ----------------------------------------------------------

    def boot(self, flavor_id, image_id, expected_state='ACTIVE'):
        server = self.api.post_server({'server': {
            'name': 'real-%s' % len(self._server_ids),
            'imageRef': image_id,
            'flavorRef': flavor_id,
            'networks': 'none',
        }})
        self._server_ids.add(server['id'])
        return self.wait_for_status(server, expected_state)

    def wait_for_status(self, server, expected, timeout=120):
        """Wait for ``expected``; fail at once on an unexpected ERROR."""
        deadline = time.monotonic() + timeout
        while True:
            server = self.api.get_server(server['id'])
            if server['status'] == expected:
                return server
            if server['status'] == 'ERROR':
                self.fail('server %s went to ERROR: %s' %
                          (server['id'], server.get('fault')))
            if time.monotonic() > deadline:
                self.fail('server %s is %s after %d s, not %s' %
                          (server['id'], server['status'], timeout,
                           expected))
            time.sleep(0.3)

    def delete(self, server):
        self.api.delete_server(server['id'])
        self._wait_until_deleted(server)

    def console(self, server):
        return self.api.post_server_action(
            server['id'], {'os-getConsoleOutput': {}})['output']

    def console_log(self, server):
        """The guest's serial console as virtlogd wrote it on the host
        (nova's console API answers only while the domain runs).
        """
        with open(os.path.join(self.instance_dir(server), 'console.log'),
                  errors='replace') as f:
            return f.read()

    def wait_for_report(self, server, kind, timeout=CONSOLE_TIMEOUT,
                        not_boot_id=None):
        """The guest's last ``kind`` report line, read through nova's
        console output API (what a user would do); with ``not_boot_id``,
        one printed by another boot than that one.

        A TCG guest whose kernel stalls before /init printed anything of
        this boot (seen once in CI: the kernel's IO-APIC timer check timed
        out on a busy host and the boot hung) is reset once, through
        libvirt, and waited for again: the same QEMU, the same disk, the
        same assertions afterwards. A guest that reached /init and then
        did not report is a failure at once.
        """
        for attempt in (1, 2):
            report, console = self._poll_report(server, kind, timeout,
                                                not_boot_id)
            if report is not None:
                return report
            if attempt == 1 and not self._reached_init(console,
                                                       not_boot_id):
                LOG.warning('guest of %s stalled before /init; resetting '
                            'it once. console:\n%s', server['id'],
                            console[-3000:])
                try:
                    self.domain(server).reset(0)
                except libvirt.libvirtError as exc:
                    self.fail('no %r report: the guest stalled before '
                              '/init and could not be reset (%s); '
                              'console:\n%s' % (kind, exc, console[-3000:]))
                continue
            self.fail('no %r report from the guest within %d s; '
                      'console:\n%s' % (kind, timeout, console[-3000:]))

    def _poll_report(self, server, kind, timeout, not_boot_id):
        deadline = time.monotonic() + timeout
        while True:
            console = self.console(server)
            report = pb_guest.parse_console(console)
            if kind in report and (
                    not_boot_id is None or
                    report[kind].get('boot_id') != not_boot_id):
                return report[kind], console
            if 'error' in report:
                self.fail('guest error: %s' % report['error'])
            if time.monotonic() > deadline:
                return None, console
            time.sleep(0.5)

    @staticmethod
    def _reached_init(console, not_boot_id):
        """Whether /init of a boot other than ``not_boot_id`` started (its
        first line is ``start boot_id=...``).
        """
        start = pb_guest.parse_console_starts(console)
        return any(b != not_boot_id for b in start)

    def restart_libvirtd(self):
        """Stop the tier's libvirtd and start it again, as a package
        upgrade or an operator does (QEMU, the guests and their block jobs
        run on); self.conn is then a new connection. Only in a class with
        RESTARTS_LIBVIRTD (skips when libvirt-up did not start libvirtd).
        """
        assert self.RESTARTS_LIBVIRTD, 'restart_libvirtd needs the tier ' \
            'to itself (RESTARTS_LIBVIRTD = True)'
        how, pid = _our_libvirtd()
        if how is None:
            self.skipTest(pid)
        before = _libvirtd_pids()
        if how == 'systemd':
            subprocess.run(['systemctl', 'restart', 'libvirtd.service'],
                           check=True, timeout=120)
        else:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while os.path.exists('/proc/%d' % pid):
                if time.monotonic() > deadline:
                    self.fail('libvirtd %d did not stop within 60 s of '
                              'SIGTERM' % pid)
                time.sleep(0.2)
            subprocess.run(
                ['libvirtd', '-d', '-p',
                 os.path.join(LIBVIRT_STATE_DIR, 'libvirtd.pid')],
                check=True, timeout=60,
                env={'PATH': '/usr/sbin:/usr/bin:/sbin:/bin',
                     'LANG': 'C.UTF-8'})
        deadline = time.monotonic() + 90
        while True:
            try:
                conn = libvirt.open(URI)
                conn.getVersion()
                break
            except libvirt.libvirtError as exc:
                if time.monotonic() > deadline:
                    self.fail('libvirtd does not answer within 90 s of its '
                              'restart: %s' % exc)
                time.sleep(0.5)
        # Another libvirtd answers, and the connections opened before (the
        # command's among them: left for it to find dead) are dead.
        self.assertTrue(before and not before & _libvirtd_pids(),
                        (before, _libvirtd_pids()))
        self.assertRaises(libvirt.libvirtError, self.conn.getLibVersion)
        self.addCleanup(_close_quietly, self.conn)
        self.conn = conn

    def libvirtd_restart_problem(self):
        """None when restart_libvirtd can restart this libvirtd, else
        why not.
        """
        how, why = _our_libvirtd()
        return why if how is None else None

    def wait_for_domain_shutoff(self, server, timeout=CONSOLE_TIMEOUT):
        dom = self.domain(server)
        deadline = time.monotonic() + timeout
        while dom.isActive():
            if time.monotonic() > deadline:
                self.fail('domain %s still running after %d s' %
                          (dom.name(), timeout))
            time.sleep(0.2)

    # -- what the hypervisor sees -----------------------------------------

    def domain(self, server):
        return self.conn.lookupByUUIDString(server['id'])

    def virsh(self, *args):
        return subprocess.run(['virsh', '-c', URI] + list(args), check=True,
                              capture_output=True, text=True).stdout

    def qemu_pid(self, server):
        with open(os.path.join(QEMU_PID_DIR,
                               self.domain(server).name() + '.pid')) as f:
            return int(f.read().strip())

    def qemu_cmdline(self, server):
        with open('/proc/%d/cmdline' % self.qemu_pid(server), 'rb') as f:
            return [a.decode() for a in f.read().split(b'\0') if a]

    def qemu_open_files(self, server):
        """{path: os.stat} of the regular files QEMU holds open."""
        fd_dir = '/proc/%d/fd' % self.qemu_pid(server)
        opened = {}
        for fd in os.listdir(fd_dir):
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
                st = os.stat(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith('/'):
                opened[target] = st
        return opened

    def blockdev_nodes(self, server):
        """The -blockdev nodes of the QEMU command line, as dicts."""
        args = self.qemu_cmdline(server)
        return [json.loads(value) for opt, value in zip(args, args[1:])
                if opt == '-blockdev' and value.startswith('{')]

    def format_node(self, server, path):
        """The format node QEMU opened over the file node of ``path``.

        libvirt 11 (10.x on) opens a raw disk without a format node: the
        file node is the disk (raw data, no probing). That case answers a
        node ``{'driver': 'raw', 'file': <the file node's name>}``, so that
        callers read the storage node the same way on both platforms.
        """
        nodes = self.blockdev_nodes(server)
        files = {n['node-name'] for n in nodes
                 if n.get('driver') == 'file' and n.get('filename') == path}
        self.assertTrue(files, 'QEMU opened no file node for %s: %s' %
                        (path, nodes))
        for node in nodes:
            if node.get('file') in files:
                return node
        top = [n for n in nodes if n.get('node-name') in files and
               n.get('read-only') is not True]
        if len(top) == 1 and not any(n.get('backing') in files
                                     for n in nodes):
            return {'driver': 'raw', 'file': top[0]['node-name']}
        self.fail('no format node over %s: %s' % (path, nodes))

    def instance_dir(self, server):
        return os.path.join(self.instances_path, server['id'])

    def disk_path(self, server, name='disk'):
        return os.path.join(self.instance_dir(server), name)

    def expected_cache_size(self, path):
        info = pb_fixtures.qemu_img_info(path)
        data = info.get('format-specific', {}).get('data', {})
        opts = CONF.prealloc_backend
        # Worked out here from qcow2's layout, not by the plugin's code:
        # every L2 table of the disk (one cluster each, 16-byte entries
        # with extended_l2, else 8) plus QEMU's 4 clusters of refcount
        # cache; none where QEMU's 32 MiB default covers the disk or the
        # cover exceeds the per-disk cap.
        cluster = info['cluster-size']
        entry = 16 if data.get('extended-l2') else 8
        entries = -(-info['virtual-size'] // cluster)
        tables = -(-entries * entry // cluster) * cluster
        wanted = tables + 4 * cluster
        if (opts.qcow2_l2_cache != 'full-coverage' or
                tables <= 32 * units.Mi or
                wanted > opts.qcow2_metadata_cache_max_mb * units.Mi):
            return None
        return wanted

    def check_hypervisor_view(self, server, disk_format, mode, size,
                              after=None):
        """What libvirt and QEMU see of a running server whose root disk
        the plugin made in ``mode``; ``size`` is the flavor's root size.
        ``after``: what an earlier call returned, when the guest must have
        booted again since. Returns {'pid': QEMU's, 'boot_id': the
        guest's}.
        """
        path = self.disk_path(server)
        self.assertEqual('running', self.virsh('domstate',
                                               server['id']).strip())
        # The guest itself read the image's data through the disk.
        report = self.wait_for_report(
            server, 'idle', not_boot_id=after and after['boot_id'])
        self.assertEqual(self.base_md5, report['md5'])
        # The file QEMU holds open is the plugin's disk, not a copy.
        opened = self.qemu_open_files(server)
        self.assertIn(path, opened)
        st = os.stat(path)
        self.assertEqual((st.st_dev, st.st_ino),
                         (opened[path].st_dev, opened[path].st_ino))
        info = pb_fixtures.qemu_img_info(path)
        self.assertEqual(disk_format, info['format'])
        self.assertEqual(size, info['virtual-size'])
        self.assert_allocation(path, disk_format, mode, size)
        # libvirt kept the plugin's XML and QEMU got what it asks for.
        xml = etree.fromstring(self.virsh('dumpxml', server['id']))
        disk = [d for d in xml.findall('./devices/disk')
                if d.find('source').get('file') == path]
        self.assertEqual(1, len(disk), 'no disk %s in the domain' % path)
        drv = disk[0].find('driver')
        node = self.format_node(server, path)
        self.assertEqual(disk_format, node['driver'])
        storage = [n for n in self.blockdev_nodes(server)
                   if n.get('node-name') == node['file']][0]
        if mode == 'none':
            self.assertNotEqual('native', drv.get('io'))
        else:
            # As nova does for preallocate_images=space.
            self.assertEqual('native', drv.get('io'))
            self.assertEqual('native', storage.get('aio'))
        max_size = drv.find('./metadata_cache/max_size')
        if disk_format == 'qcow2':
            data = info['format-specific']['data']
            # Mode none: stock nova's overlay, without extended_l2.
            self.assertEqual(mode != 'none', bool(data.get('extended-l2')))
            expected = self.expected_cache_size(path)
            if expected is None or mode == 'none':
                # QEMU's default cache covers the disk: nothing is set.
                self.assertIsNone(max_size, 'a <metadata_cache> in dumpxml')
                self.assertNotIn('cache-size', node)
            else:
                self.assertIsNotNone(max_size,
                                     'no <metadata_cache> in dumpxml')
                self.assertEqual(str(expected), max_size.text)
                self.assertEqual(expected, node.get('cache-size'))
        else:
            self.assertIsNone(max_size)
            self.assertNotIn('cache-size', node)
        seen = {'pid': self.qemu_pid(server), 'boot_id': report['boot_id']}
        if after is not None:
            self.assertNotEqual(after['pid'], seen['pid'])
        return seen

    def assert_allocation(self, path, disk_format, mode, size):
        """The file's allocation is what ``mode`` promises."""
        allocated = pb_fixtures.allocated(path)
        apparent = os.path.getsize(path)
        detail = ('%s %s mode %s: %d bytes allocated, %d apparent, virtual '
                  '%d' % (path, disk_format, mode, allocated, apparent, size))
        if mode in ('space', 'full'):
            self.assertGreaterEqual(allocated, size, detail)
        elif mode == 'metadata' and disk_format == 'qcow2':
            # Every L2 table written, the file stretched over the whole
            # disk, no data cluster allocated.
            self.assertGreaterEqual(apparent, size, detail)
            self.assertLess(allocated, 64 * units.Mi, detail)
        else:
            self.assertLess(allocated, 64 * units.Mi, detail)
            if disk_format == 'qcow2':
                self.assertLess(apparent, 64 * units.Mi, detail)

    def assert_no_leftovers(self, server):
        """After delete: no domain, no instance directory, no journal or
        temporary file of the plugin anywhere under instances_path.
        """
        self.assertRaises(libvirt.libvirtError, self.domain, server)
        names = [d.name() for d in self.conn.listAllDomains()]
        self.assertNotIn(DOMAIN_PREFIX + server['id'], names)
        self.assertFalse(os.path.exists(self.instance_dir(server)),
                         os.listdir(self.instances_path))
        strays = [os.path.join(root, name)
                  for root, _dirs, files in os.walk(self.instances_path)
                  for name in files
                  if name.endswith(('.prealloc-journal', '.prealloc-tmp'))]
        self.assertEqual([], strays)
