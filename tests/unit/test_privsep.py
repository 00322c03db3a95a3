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

"""Privilege boundary: what the privileged entrypoints refuse to touch.

Every entrypoint of prealloc_backend.privsep.fs is called directly, both
through its privsep wrapper (in-process) and as its ``unprivileged_*``
function, with paths and sizes a compromised nova-compute could send. Each
must be refused with a typed error that names the value, and the file the
value designates (and the legitimate disk beside it) must be left exactly as
it was: content, size, allocation, mtime and ctime.

One test starts the real oslo.privsep daemon (privsep-helper run as root
without sudo through ``[prealloc_backend_privsep] helper_command``) to prove
that the checks run in the daemon with the daemon's own configuration, that
the daemon holds exactly CAP_DAC_OVERRIDE, that the wrapper passes every
argument through, and what happens when the daemon dies between two calls.
"""

import hashlib
import os
import pathlib
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import fixtures
from oslo_log import log as logging
from oslo_privsep import capabilities
from oslo_utils import units

from prealloc_backend import backend
from prealloc_backend import exception
import prealloc_backend.privsep
import prealloc_backend.privsep.fs
from tests import base
from tests import fixtures as pb_fixtures

LOG = logging.getLogger(__name__)

DISK_SIZE = 4 * units.Mi
ENTRYPOINTS = ('fallocate_range', 'zero_fill_range')
# Bounded waits for the real daemon (not timing assertions: a wait that
# runs out fails with the state it saw).
DAEMON_WAIT = 30


def file_state(path):
    """Everything a privileged call could change about ``path``."""
    st = os.lstat(path)
    state = {'mode': st.st_mode, 'size': st.st_size, 'blocks': st.st_blocks,
             'mtime': st.st_mtime_ns, 'ctime': st.st_ctime_ns,
             'ino': st.st_ino, 'nlink': st.st_nlink}
    if stat.S_ISREG(st.st_mode):
        digest = hashlib.sha256()
        with open(path, 'rb') as f:
            for block in iter(lambda: f.read(units.Mi), b''):
                digest.update(block)
        state['sha256'] = digest.hexdigest()
        state['extents'] = extents(path)
    elif stat.S_ISLNK(st.st_mode):
        state['target'] = os.readlink(path)
    return state


def extents(path):
    """[(first block, blocks, flags)] of a file, as filefrag reports them
    (including unwritten extents, which SEEK_DATA does not show).
    """
    out = subprocess.run(['filefrag', '-v', '-b4096', path], check=True,
                         capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.replace(':', ' ').replace('..', ' ').split()
        if len(fields) >= 6 and fields[0].isdigit():
            start, length = int(fields[1]), int(fields[5])
            flags = fields[-1] if not fields[-1].isdigit() else ''
            found.append((start, length, 'unwritten' in flags))
    return found


def make_disk(path, size=DISK_SIZE):
    """A sparse disk with data at its start and at 2 MiB."""
    with open(path, 'wb') as f:
        f.truncate(size)
        f.write(b'\xa5' * 65536)
        f.seek(2 * units.Mi)
        f.write(b'\x5a' * 4096)
        # NOTE: flushed, so that its extents (part of the state compared
        # before and after each call) are final, not delayed allocations.
        f.flush()
        os.fsync(f.fileno())
    return path


def call(name, path, offset=0, length=4096, unprivileged=False):
    """Call entrypoint ``name`` with the arguments it takes."""
    module = prealloc_backend.privsep.fs
    func = getattr(module, ('unprivileged_' if unprivileged else '') + name)
    return func(path, offset, length)


class BoundaryTestCase(base.TestCase):

    def setUp(self):
        super().setUp()
        self.scratch = self.useFixture(fixtures.TempDir()).path
        self.inst = os.path.join(self.instances_path, 'inst')
        os.mkdir(self.inst)
        self.disk = make_disk(os.path.join(self.inst, 'disk'))
        self.outside_dir = os.path.join(self.scratch, 'outside')
        os.mkdir(self.outside_dir)
        self.victim = make_disk(os.path.join(self.outside_dir, 'victim'))

    def assert_refused(self, path, error, reason_words, touched, value=None,
                       names=(), entrypoints=ENTRYPOINTS, **call_args):
        """Every entrypoint, wrapped and unprivileged, refuses: ``error``
        raised, its message naming ``value`` (default: the path) and
        containing ``reason_words``; the files in ``touched`` unchanged.
        """
        before = {p: file_state(p) for p in touched}
        shown = repr(path if value is None else value)
        for name in entrypoints:
            for unprivileged in (False, True):
                label = '%s%s(%r, %r)' % ('unprivileged_' if unprivileged
                                          else '', name, path, call_args)
                exc = self.assertRaises(error, call, name, path,
                                        unprivileged=unprivileged,
                                        **call_args)
                message = str(exc)
                self.assertIn(shown, message, label)
                for word in reason_words:
                    self.assertIn(word, message, label)
                for word in names:
                    self.assertIn(word, message, label)
        for p, state in before.items():
            self.assertEqual(state, file_state(p), 'touched: %s' % p)


class PathRefusalTestCase(BoundaryTestCase):
    """Paths a privileged call must never act on."""

    def test_outside_instances_path(self):
        self.assert_refused(self.victim, exception.InvalidPath,
                            ['outside instances_path'],
                            [self.victim, self.disk])

    def test_dotdot_escape(self):
        sneaky = os.path.join(self.inst, '..', '..', os.path.relpath(
            self.victim, os.path.dirname(self.instances_path)))
        self.assertTrue(os.path.exists(sneaky))
        self.assertTrue(sneaky.startswith(self.instances_path))
        self.assert_refused(sneaky, exception.InvalidPath,
                            ['outside instances_path'],
                            [self.victim, self.disk])

    def test_planted_symlink_to_outside_file(self):
        link = os.path.join(self.inst, 'disk.local')
        os.symlink(self.victim, link)
        self.assert_refused(link, exception.InvalidPath,
                            ['outside instances_path'],
                            [self.victim, self.disk, link])

    def test_planted_symlink_directory(self):
        link = os.path.join(self.instances_path, 'other-inst')
        os.symlink(self.outside_dir, link)
        path = os.path.join(link, 'victim')
        self.assert_refused(path, exception.InvalidPath,
                            ['outside instances_path'],
                            [self.victim, self.disk, link])

    def test_symlink_inside(self):
        link = os.path.join(self.inst, 'disk.alias')
        os.symlink(self.disk, link)
        self.assert_refused(link, exception.InvalidPath, ['symlink'],
                            [self.disk, link])

    def test_relative_symlink_inside(self):
        link = os.path.join(self.inst, 'disk.rel')
        os.symlink('disk', link)
        self.assert_refused(link, exception.InvalidPath, ['symlink'],
                            [self.disk, link])

    def test_dangling_symlink(self):
        link = os.path.join(self.inst, 'disk.gone')
        os.symlink(os.path.join(self.inst, 'nothing'), link)
        self.assert_refused(link, exception.InvalidPath, [],
                            [self.disk, link])
        self.assertFalse(os.path.exists(os.path.join(self.inst, 'nothing')))

    def test_hard_link_to_outside_file(self):
        # NOTE: a hard link inside instances_path to a file outside it has
        # an inside real path; only its link count betrays it. nova never
        # hard-links instance disks.
        link = os.path.join(self.inst, 'disk.hard')
        os.link(self.victim, link)
        self.assert_refused(link, exception.InvalidPath, ['link'],
                            [self.victim, self.disk])

    def test_directory(self):
        self.assert_refused(self.inst, exception.InvalidPath,
                            ['not a regular file'], [self.disk])

    def test_instances_path_itself(self):
        self.assert_refused(self.instances_path, exception.InvalidPath, [],
                            [self.disk])

    def test_fifo(self):
        fifo = os.path.join(self.inst, 'disk.fifo')
        os.mkfifo(fifo)
        self.assert_refused(fifo, exception.InvalidPath,
                            ['not a regular file'], [fifo, self.disk])

    def test_unix_socket(self):
        path = os.path.join(self.inst, 'disk.sock')
        sock = socket.socket(socket.AF_UNIX)
        self.addCleanup(sock.close)
        sock.bind(path)
        self.assert_refused(path, exception.InvalidPath,
                            ['not a regular file'], [path, self.disk])

    def test_device_nodes(self):
        pb_fixtures.skip_unless_root(self)
        null = os.path.join(self.inst, 'disk.null')
        os.mknod(null, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        # NOTE: a block node for a loop minor that is not set up: if the
        # type check failed, opening it would fail too, so the reason is
        # asserted to be the type check.
        block = os.path.join(self.inst, 'disk.blk')
        os.mknod(block, 0o600 | stat.S_IFBLK, os.makedev(7, 250))
        for node in (null, block):
            self.assert_refused(node, exception.InvalidPath,
                                ['not a regular file'], [node, self.disk])

    def test_relative_path(self):
        cwd = os.getcwd()
        os.chdir(self.instances_path)
        self.addCleanup(os.chdir, cwd)
        for path in ('inst/disk', './inst/disk', 'inst/../inst/disk'):
            self.assertTrue(os.path.exists(path))
            self.assert_refused(path, exception.InvalidPath, ['absolute'],
                                [self.disk])

    def test_missing_file(self):
        self.assert_refused(os.path.join(self.inst, 'disk.none'),
                            exception.InvalidPath, ['does not exist'],
                            [self.disk])
        self.assertEqual(['disk'], os.listdir(self.inst))

    def test_not_a_string(self):
        for value in (None, 42, 4.2, True, b'', self.disk.encode(),
                      pathlib.Path(self.disk), [self.disk], {'p': 1}, ''):
            self.assert_refused(value, exception.InvalidPath, ['string'],
                                [self.disk])

    def test_nul_byte(self):
        self.assert_refused(self.disk + '\x00.x', exception.InvalidPath,
                            [], [self.disk])

    def test_trailing_slash(self):
        self.assert_refused(self.disk + '/', exception.InvalidPath, [],
                            [self.disk])

    def test_symlinked_instances_path_is_accepted(self):
        """Control: instances_path itself a symlink (a common deployment)
        must not be refused; the refusals above are not blanket ones.
        """
        alias = os.path.join(self.scratch, 'instances-alias')
        os.symlink(self.instances_path, alias)
        self.flags(instances_path=alias)
        path = os.path.join(alias, 'inst', 'disk')
        self.assertEqual(4096, prealloc_backend.privsep.fs.zero_fill_range(
            path, 65536, 4096))
        prealloc_backend.privsep.fs.fallocate_range(path, 0, DISK_SIZE)
        self.assertGreaterEqual(pb_fixtures.allocated(self.disk), DISK_SIZE)


class SizeRefusalTestCase(BoundaryTestCase):
    """Offsets and lengths a privileged call must refuse."""

    RANGE_CALLS = ('fallocate_range', 'zero_fill_range')

    def _refuse(self, offset, length, value, words):
        self.assert_refused(self.disk, exception.InvalidSize, words,
                            [self.disk], value=value,
                            entrypoints=self.RANGE_CALLS, offset=offset,
                            length=length)

    def test_bad_lengths(self):
        fs_size = self._fs_size()
        for length, words in (
                (0, ['length', 'at least 1']),
                (-1, ['length', 'at least 1']),
                (-DISK_SIZE, ['length', 'at least 1']),
                (4096.0, ['length', 'integer', 'float']),
                (0.5, ['length', 'integer']),
                ('4096', ['length', 'integer', 'str']),
                (b'4096', ['length', 'integer']),
                (None, ['length', 'integer']),
                (True, ['length', 'integer', 'bool']),
                (False, ['length', 'integer', 'bool']),
                ([4096], ['length', 'integer']),
                (DISK_SIZE + 1, ['end of the file']),
                (fs_size + 4096, ['larger than the filesystem']),
                (2 ** 64, ['larger than the filesystem']),
                (2 ** 200, ['larger than the filesystem'])):
            self._refuse(0, length, length, words)

    def test_bad_offsets(self):
        for offset, words in (
                (-1, ['offset', 'at least 0']),
                (-2 ** 63, ['offset', 'at least 0']),
                (0.0, ['offset', 'integer']),
                ('0', ['offset', 'integer']),
                (None, ['offset', 'integer']),
                (True, ['offset', 'integer', 'bool']),
                (False, ['offset', 'integer', 'bool'])):
            self._refuse(offset, 4096, offset, words)

    def test_ranges_past_end_of_file(self):
        for offset, length in ((DISK_SIZE, 1), (DISK_SIZE - 1, 2),
                               (DISK_SIZE + units.Gi, 4096),
                               (2 ** 63 - 1, 1), (2 ** 63, 1),
                               (2 ** 70, 1), (1, DISK_SIZE)):
            self._refuse(offset, length, length, ['end of the file'])

    def test_larger_than_filesystem(self):
        """A sparse file larger than its own (loop-mounted) filesystem: a
        range covering it is refused before any block is allocated.
        """
        fs = self.use_loop_fs('ext4', 16)
        inst = os.path.join(fs.path, 'inst')
        os.mkdir(inst)
        self.disk = make_disk(os.path.join(inst, 'disk'), 64 * units.Mi)
        free_before = os.statvfs(fs.path).f_bfree
        for length in (64 * units.Mi, 32 * units.Mi):
            self._refuse(0, length, length, ['larger than the filesystem'])
        self.assertEqual(free_before, os.statvfs(fs.path).f_bfree)

    def _fs_size(self):
        vfs = os.statvfs(self.disk)
        return vfs.f_blocks * vfs.f_frsize

    def test_valid_range_control(self):
        """Control: the smallest valid calls work, so the refusals above
        are about the values, not about the disk.
        """
        fs = prealloc_backend.privsep.fs
        self.assertEqual(1, fs.zero_fill_range(self.disk, DISK_SIZE - 1, 1))
        fs.fallocate_range(self.disk, 0, DISK_SIZE)
        self.assertEqual(DISK_SIZE, os.path.getsize(self.disk))
        self.assertGreaterEqual(pb_fixtures.allocated(self.disk), DISK_SIZE)


class CapabilitiesTestCase(base.TestCase):

    def test_exactly_dac_override(self):
        # NOTE: the daemon opens disks that libvirt may have chown'ed to the
        # qemu user (mode 0600): CAP_DAC_OVERRIDE and nothing else. The
        # context stores it as the default of its section's option, which
        # is what a fresh process (the daemon) reads; this test process's
        # configuration fixtures reset option defaults, so ask a fresh one.
        out = subprocess.run(
            [sys.executable, '-c',
             'from oslo_config import cfg\n'
             'import prealloc_backend.privsep as p\n'
             'print(p.ctx.cfg_section, '
             'cfg.CONF[p.ctx.cfg_section].capabilities)'],
            env=dict(os.environ, OS_NOVA_DISABLE_EVENTLET_PATCHING='true'),
            capture_output=True, text=True, check=True).stdout.split()
        self.assertEqual(['prealloc_backend_privsep',
                          '[%d]' % capabilities.CAP_DAC_OVERRIDE], out)

    def test_entrypoints_are_this_context_only(self):
        ctx = prealloc_backend.privsep.ctx
        for name in ENTRYPOINTS:
            self.assertTrue(ctx.is_entrypoint(
                getattr(prealloc_backend.privsep.fs, name)), name)
        public = sorted(
            name for name, value in vars(prealloc_backend.privsep.fs).items()
            if ctx.is_entrypoint(value))
        self.assertEqual(sorted(ENTRYPOINTS), public)


def proc_status(pid):
    try:
        with open('/proc/%d/status' % pid) as f:
            return dict(line.rstrip('\n').split(':\t', 1) for line in f
                        if ':\t' in line)
    except (FileNotFoundError, ProcessLookupError):
        return {}


def find_daemons(marker):
    """pids of live privsep-helper processes whose command line holds
    ``marker`` (a path unique to the test that started them).
    """
    pids = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open('/proc/%s/cmdline' % entry, 'rb') as f:
                cmdline = f.read().split(b'\0')
        except OSError:
            continue
        if (any(b'privsep-helper' in arg for arg in cmdline) and
                marker.encode() in cmdline and
                proc_status(int(entry)).get('State', 'Z')[0] != 'Z'):
            pids.append(int(entry))
    return pids


HUNG = ('the privileged call made after the daemon died never returned: '
        'oslo.privsep\'s reader thread ended on ECONNRESET without failing '
        'the outstanding call or marking the channel stopped, so the call '
        'waits forever (see the reliability report)')


def bounded(func, *args, **kwargs):
    """Run func in a thread for at most DAEMON_WAIT seconds: ('ok', value),
    ('error', exception) or ('hung', None).
    """
    result = []

    def run():
        try:
            result.append(('ok', func(*args, **kwargs)))
        except Exception as exc:
            result.append(('error', exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DAEMON_WAIT)
    return result[0] if result else ('hung', None)


def wait_for(predicate, what):
    deadline = time.monotonic() + DAEMON_WAIT
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError('gave up waiting for %s' % what)


class RealDaemonTestCase(BoundaryTestCase):
    """The real oslo.privsep daemon, started as root without sudo."""

    def setUp(self):
        super().setUp()
        pb_fixtures.skip_unless_root(self)
        # The daemon's instances_path (from its own --config-file) is a
        # subdirectory; nova-compute's (this process) is its parent. Only a
        # check made in the daemon can refuse a path between the two.
        self.client_root = self.instances_path
        self.daemon_root = os.path.join(self.client_root, 'daemon-view')
        os.mkdir(self.daemon_root)
        self.config = os.path.join(self.scratch, 'privsep-daemon.conf')
        with open(self.config, 'w') as f:
            f.write('[DEFAULT]\ninstances_path = %s\n' % self.daemon_root)
        helper = os.path.join(os.path.dirname(sys.executable),
                              'privsep-helper')
        self.flags(group='prealloc_backend_privsep',
                   helper_command='%s --config-file %s' % (helper,
                                                           self.config))
        ctx = prealloc_backend.privsep.ctx
        self.assertIsNone(ctx.channel, 'a daemon is already running')
        ctx.set_client_mode(True)
        self.addCleanup(self._stop_daemons)

    def _stop_daemons(self):
        ctx = prealloc_backend.privsep.ctx
        ctx.set_client_mode(False)
        ctx.stop()
        # NOTE: the daemon exits when its socket closes; kill only the
        # daemons this test started (found by its unique config path).
        for pid in find_daemons(self.config):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _daemon_pid(self):
        pids = wait_for(lambda: find_daemons(self.config), 'the daemon')
        self.assertEqual(1, len(pids), pids)
        return pids[0]

    def _assert_caps(self, pid):
        status = proc_status(pid)
        wanted = '%016x' % (1 << capabilities.CAP_DAC_OVERRIDE)
        self.assertEqual(wanted, status['CapEff'], status)
        self.assertEqual(wanted, status['CapPrm'], status)
        self.assertEqual('%016x' % 0, status['CapInh'], status)
        self.assertEqual('%016x' % 0, status.get('CapAmb', '0' * 16), status)

    def test_daemon(self):
        fs = prealloc_backend.privsep.fs
        inst = os.path.join(self.daemon_root, 'inst')
        os.mkdir(inst)
        disk = make_disk(os.path.join(inst, 'disk'))

        # 1. Every argument reaches the daemon. First call (over data, so
        # nothing changes): the daemon starts with its one capability.
        fs.fallocate_range(disk, 0, 4096)
        self.assertEqual(DISK_SIZE - 65536 - 4096,
                         pb_fixtures.hole_bytes(disk))
        pid = self._daemon_pid()
        self.assertNotEqual(os.getpid(), pid)
        self._assert_caps(pid)
        # zero_fill_range: the written count proves the length, the data
        # map proves the offset (positional, then keyword arguments).
        self.assertEqual(8192, fs.zero_fill_range(disk, units.Mi + 4096,
                                                  8192))
        self.assertEqual(12288, fs.zero_fill_range(
            path=disk, offset=3 * units.Mi, length=12288))
        data = [(start * 4096, length * 4096)
                for start, length, unwritten in extents(disk)
                if not unwritten]
        self.assertIn((units.Mi + 4096, 8192), data)
        self.assertIn((3 * units.Mi, 12288), data)
        # fallocate_range: an unwritten extent exactly where asked.
        fs.fallocate_range(disk, 3 * units.Mi + 65536, 131072)
        self.assertIn((3 * units.Mi + 65536, 131072, True),
                      [(s * 4096, n * 4096, u) for s, n, u in extents(disk)])
        self.assertEqual(DISK_SIZE, os.path.getsize(disk))

        # 2. The daemon checks paths against its own instances_path.
        between = os.path.join(self.client_root, 'inst')  # client's view
        victim = make_disk(os.path.join(between, 'victim'))
        self.assertTrue(pb_fixtures.hole_bytes(victim))  # client: ok
        os.symlink(victim, os.path.join(inst, 'disk.link'))
        before = file_state(victim)
        for path in (victim, os.path.join(inst, 'disk.link'),
                     os.path.join(inst, '..', '..', 'inst', 'victim')):
            for name in ENTRYPOINTS:
                exc = self.assertRaises(exception.InvalidPath, call, name,
                                        path, 0, 4096)
                self.assertIn('outside instances_path %s' % self.daemon_root,
                              str(exc))
        exc = self.assertRaises(exception.InvalidSize, fs.fallocate_range,
                                disk, 0, True)
        self.assertIn('bool', str(exc))
        self.assertEqual(before, file_state(victim))
        self.assertEqual(pid, self._daemon_pid(), 'the daemon restarted')

        # 3. The daemon dies between two calls: the next call restarts it
        # (or fails loudly); it never returns without doing its work and
        # never blocks for good.
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not find_daemons(self.config), 'the daemon to die')
        target = make_disk(os.path.join(inst, 'disk2'))
        outcome, value = bounded(fs.zero_fill_range, target, 0, DISK_SIZE)
        self.assertNotEqual('hung', outcome, HUNG)
        if outcome == 'error':
            # A loud failure is acceptable; it must say what happened, and
            # the call after it must work.
            LOG.info('first call after the daemon died: %r', value)
            self.assertTrue(str(value), repr(value))
            outcome, value = bounded(fs.zero_fill_range, target, 0,
                                     DISK_SIZE)
            self.assertEqual('ok', outcome, value)
        self.assertEqual(DISK_SIZE - 65536 - 4096, value)
        self.assertEqual(0, pb_fixtures.hole_bytes(target))
        new_pid = self._daemon_pid()
        self.assertNotEqual(pid, new_pid)
        self._assert_caps(new_pid)

        # 4. The same through the backend: a raw 'full' disk made right
        # after the daemon was killed is fully written, not silently thin.
        os.kill(new_pid, signal.SIGKILL)
        wait_for(lambda: not find_daemons(self.config), 'the daemon to die')
        self.flags(instances_path=self.daemon_root)
        self.flags(group='prealloc_backend', mode='full')
        source = make_disk(os.path.join(self.scratch, 'image'))
        instance = self.make_instance()

        def fetch(target, *args, **kwargs):
            subprocess.run(['cp', '--sparse=always', source, target],
                           check=True)

        def spawn():
            image = backend.Backend(False).by_name(instance, 'disk', 'raw')
            image.cache(fetch_func=fetch, filename='img', size=DISK_SIZE,
                        image_id='img')
            return image.path

        outcome, value = bounded(spawn)
        self.assertNotEqual('hung', outcome, HUNG)
        if outcome == 'error':
            LOG.info('spawn right after the daemon died: %r', value)
            self.assertIsInstance(value, exception.PreallocError)
            self.assertEqual([], os.listdir(os.path.join(
                self.daemon_root, instance.uuid)))
            outcome, value = bounded(spawn)
            self.assertEqual('ok', outcome, value)
        self.assertEqual(0, pb_fixtures.hole_bytes(value))
        self.assertGreaterEqual(pb_fixtures.allocated(value), DISK_SIZE)
        self._assert_caps(self._daemon_pid())
