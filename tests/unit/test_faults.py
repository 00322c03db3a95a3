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

"""Faults injected while disks are made: the state afterwards is asserted.

* ENOSPC in the middle of a raw ``full`` zero-fill, a raw ``space``
  fallocate, a qcow2 ``falloc``/``full`` creation and a preallocated grow,
  on a small loop-mounted ext4: the space is taken by another writer after
  the plugin's free-space check passed (the only way to run out once the
  check exists), and the kernel's real ENOSPC does the rest.
* qemu-img, cp or the zero-fill killed part-way (SIGKILL sent by the test,
  to the tool alone or to the whole nova-compute process running the
  spawn): the next cache() of the same disk does not reuse a half-made disk.
* A crash while the journal itself is being written.
* Eight threads spawning disks from one base image at once.
* ``full`` on a large disk cancelled by ``allocation_timeout``.
"""

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import fixtures
from oslo_log import log as logging
from oslo_utils import units

from prealloc_backend import backend
from prealloc_backend import exception
from prealloc_backend import fsprobe
import prealloc_backend.privsep.fs
from tests import base
from tests import fixtures as pb_fixtures

LOG = logging.getLogger(__name__)

# Bounded waits: a wait that runs out fails with the state it saw.
WAIT = 60
# Files nova itself writes beside a disk (not the plugin's to remove).
NOVA_FILES = ('disk.info',)


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(units.Mi), b''):
            digest.update(block)
    return digest.hexdigest()


def tree_state(root, skip=()):
    """{relative path: (size, allocated, mtime, sha256)} of every file."""
    state = {}
    for directory, dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            if path in skip:
                continue
            st = os.lstat(path)
            relative = os.path.relpath(path, root)
            # NOTE: nova touches a base image's mtime at every spawn
            # (image cache bookkeeping): only its content counts.
            mtime = None if relative.startswith('_base/') else st.st_mtime_ns
            state[relative] = (st.st_size, st.st_blocks, mtime,
                               sha256_of(path) if os.path.isfile(path)
                               else None)
    return state


def guest_sha(path):
    """sha256 of what a guest reads from the disk (through qemu-img)."""
    out = path + '.view'
    subprocess.run(['qemu-img', 'convert', '-U', '-O', 'raw', path, out],
                   check=True, capture_output=True)
    try:
        return sha256_of(out), os.path.getsize(out)
    finally:
        os.unlink(out)


def expected_sha(source_raw, size):
    """sha256 of source_raw's content zero-extended to size."""
    digest = hashlib.sha256()
    done = 0
    with open(source_raw, 'rb') as f:
        for block in iter(lambda: f.read(units.Mi), b''):
            block = block[:size - done]
            digest.update(block)
            done += len(block)
    while done < size:
        block = bytes(min(units.Mi, size - done))
        digest.update(block)
        done += len(block)
    return digest.hexdigest()


def fill_filesystem(directory, leave=units.Mi, name='hog'):
    """Another writer takes the space: write a file until only ``leave``
    bytes are free (really written, so the blocks are really gone).
    """
    path = os.path.join(directory, name)
    chunk = bytes(units.Mi)
    with open(path, 'ab') as f:
        while True:
            vfs = os.statvfs(directory)
            free = vfs.f_bfree * vfs.f_frsize
            if free <= leave:
                break
            try:
                f.write(chunk[:min(units.Mi, free - leave)] or chunk[:4096])
                f.flush()
                os.fsync(f.fileno())
            except OSError:
                break
    return path


def write_source(path, size, seed):
    """A raw image of random, incompressible content (no holes)."""
    rng = random.Random(seed)
    block = rng.randbytes(units.Mi)
    with open(path, 'wb') as f:
        for index in range(0, size, units.Mi):
            f.write(index.to_bytes(8, 'little') +
                    block[8:min(units.Mi, size - index)])
    return path


def held_locks(lock_path):
    """Lock files under lock_path that some process holds a lock on, read
    from /proc/locks (which sees locks of this process too, unlike a
    second lockf() from this process).
    """
    inodes = {}
    for name in os.listdir(lock_path):
        st = os.stat(os.path.join(lock_path, name))
        inodes[(os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)] = name
    held = []
    with open('/proc/locks') as f:
        for line in f:
            fields = line.split()
            if '->' in fields:
                fields.remove('->')
            try:
                major, minor, ino = fields[5].split(':')
                key = (int(major, 16), int(minor, 16), int(ino))
            except (IndexError, ValueError):
                continue
            if key in inodes:
                held.append((inodes[key], line.strip()))
    return held


class FaultBase(base.TestCase):

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
                         if name not in NOVA_FILES]
            self.assertEqual([], leftovers)


class EnospcTestCase(FaultBase):
    """ENOSPC on a small loop-mounted ext4 after the free-space check."""

    def setUp(self):
        super().setUp()
        self.fs = self.use_loop_fs('ext4', 96)
        # A neighbour: an instance made before, which must not change.
        self.source = write_source(os.path.join(self.scratch, 'image'),
                                   2 * units.Mi + 4096, seed=7)
        self.flags(group='prealloc_backend', mode='space')
        self.neighbour = self.spawn(self.make_instance(), 'qcow2',
                                    self.source, 'img', 8 * units.Mi)
        self.raw_neighbour = self.spawn(self.make_instance(), 'raw',
                                        self.source, 'img', 4 * units.Mi)
        self.assertEqual(1, len(self.fetched))
        self.hog = os.path.join(self.fs.path, 'hog')

    def _state(self):
        return tree_state(self.fs.path, skip=(self.hog,))

    def _free(self):
        vfs = os.statvfs(self.fs.path)
        return vfs.f_bfree * vfs.f_frsize

    def _hog_after(self, module, name, calls=1):
        """Wrap module.name: after ``calls`` calls of the real function,
        another writer fills the filesystem.
        """
        real = getattr(module, name)
        count = []

        def wrapper(*args, **kwargs):
            result = real(*args, **kwargs)
            count.append(1)
            if len(count) == calls:
                fill_filesystem(self.fs.path)
            return result

        self.useFixture(fixtures.MockPatchObject(module, name, wrapper))
        return count

    def _assert_clean_failure(self, exc, instance, before, free_before):
        disk = self.disk_path(instance)
        self.assert_no_leftovers(disk)
        after = self._state()
        # Only the failed instance's directory (nova's disk.info and the
        # image cache's lock files) may be new.
        new = {p for p in set(after) - set(before)
               if not (p.startswith(instance.uuid + '/') or
                       p.startswith('locks/'))}
        self.assertEqual(set(), new)
        for path, state in before.items():
            self.assertEqual(state, after.get(path), path)
        os.unlink(self.hog)
        # The space comes back: the failed disk holds no blocks.
        self.assertLess(free_before - self._free(), 256 * units.Ki)
        LOG.info('ENOSPC fault: %s', exc)

    def test_raw_full_zero_fill(self):
        self.flags(group='prealloc_backend', mode='full')
        # Small calls, so that the fill is several calls long and the
        # filesystem runs out inside one of them.
        self.useFixture(fixtures.MockPatchObject(
            backend, 'ZERO_FILL_CALL_BYTES', 4 * units.Mi))
        calls = self._hog_after(prealloc_backend.privsep.fs,
                                'zero_fill_range', calls=2)
        before, free_before = self._state(), self._free()
        instance = self.make_instance()
        exc = self.assertRaises(exception.AllocationFailed, self.spawn,
                                instance, 'raw', self.source, 'img',
                                48 * units.Mi)
        self.assertGreater(len(calls), 1)
        self.assertIn('No space left on device', str(exc))
        self.assertIn(self.disk_path(instance), str(exc))
        self._assert_clean_failure(exc, instance, before, free_before)

    def test_raw_space_fallocate(self):
        # The free-space check made just before fallocate(2).
        self._hog_after(fsprobe, 'check_free_space')
        before, free_before = self._state(), self._free()
        instance = self.make_instance()
        exc = self.assertRaises(exception.AllocationFailed, self.spawn,
                                instance, 'raw', self.source, 'img',
                                48 * units.Mi)
        self.assertIn('No space left on device', str(exc))
        self._assert_clean_failure(exc, instance, before, free_before)

    def _qcow2_creation(self, mode):
        self.flags(group='prealloc_backend', mode=mode)
        self._hog_after(fsprobe, 'facts')
        before, free_before = self._state(), self._free()
        instance = self.make_instance()
        exc = self.assertRaises(exception.QemuImgError, self.spawn,
                                instance, 'qcow2', self.source, 'img',
                                48 * units.Mi)
        self.assertIn('No space left on device', exc.stderr)
        self.assertIn('create', exc.cmd)
        self.assertIn('preallocation=%s' % ('falloc' if mode == 'space'
                                            else mode), exc.cmd)
        self._assert_clean_failure(exc, instance, before, free_before)

    def test_qcow2_falloc_creation(self):
        self._qcow2_creation('space')

    def test_qcow2_full_creation(self):
        self._qcow2_creation('full')

    def test_qcow2_grow(self):
        """A preallocated grow that runs out of space keeps the disk, its
        guest data and its size, and leaves a consistent image.
        """
        disk = self.neighbour.path
        subprocess.run(['qemu-io', '-f', 'qcow2', '-c',
                        'write -P 0x6b 1M 64k', disk], check=True,
                       capture_output=True)
        guest_before = guest_sha(disk)
        self._hog_after(fsprobe, 'facts')
        exc = self.assertRaises(exception.QemuImgError, self.spawn,
                                self._instance_of(disk), 'qcow2',
                                self.source, 'img', 64 * units.Mi)
        self.assertIn('resize', exc.cmd)
        os.unlink(self.hog)
        self.assert_no_leftovers(disk, allow_disk=True)
        self.assertEqual(guest_before, guest_sha(disk))
        check = subprocess.run(['qemu-img', 'check', '-U', disk],
                               capture_output=True, text=True)
        self.assertEqual(0, check.returncode, check.stdout + check.stderr)

    def test_raw_grow(self):
        self.flags(group='prealloc_backend', mode='full')
        disk = self.raw_neighbour.path
        with open(disk, 'r+b') as f:
            f.seek(3 * units.Mi)
            f.write(b'guest data' * 100)
        digest = sha256_of(disk)
        # The space goes once the plan found it (an existing disk is
        # planned thin when it is missing from the start).
        self._hog_after(fsprobe, 'facts')
        exc = self.assertRaises(exception.AllocationFailed, self.spawn,
                                self._instance_of(disk), 'raw', self.source,
                                'img', 40 * units.Mi)
        self.assertIn('No space left on device', str(exc))
        os.unlink(self.hog)
        self.assert_no_leftovers(disk, allow_disk=True)
        # Grown (nova's qemu-img resize ran), data intact, tail zeros.
        self.assertEqual(40 * units.Mi, os.path.getsize(disk))
        with open(disk, 'rb') as f:
            head = f.read(4 * units.Mi)
        self.assertEqual(digest, hashlib.sha256(head).hexdigest())
        self.assertEqual(hashlib.sha256(bytes(36 * units.Mi)).hexdigest(),
                         expected_tail_sha(disk, 4 * units.Mi))

    def _instance_of(self, disk):
        uuid = os.path.basename(os.path.dirname(disk))
        instance = self.make_instance()
        instance.uuid = uuid
        return instance


def expected_tail_sha(path, offset):
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        f.seek(offset)
        for block in iter(lambda: f.read(units.Mi), b''):
            digest.update(block)
    return digest.hexdigest()


# nova-compute making one disk, as a separate process the test can kill.
CHILD = textwrap.dedent('''
    import json
    import shutil
    import sys

    from nova import objects
    import nova.privsep

    from prealloc_backend import backend
    from prealloc_backend import conf
    import prealloc_backend.privsep

    args = json.loads(sys.argv[1])
    objects.register_all()
    conf.CONF.set_override('instances_path', args['instances_path'])
    conf.CONF.set_override('mode', args['mode'], group='prealloc_backend')
    for ctx in (prealloc_backend.privsep.ctx, nova.privsep.sys_admin_pctxt):
        ctx.set_client_mode(False)
    instance = objects.Instance(uuid=args['uuid'],
                                flavor=objects.Flavor(extra_specs={}))
    image = backend.Backend(args['images_type'] == 'qcow2').by_name(
        instance, 'disk', args['images_type'])


    def fetch(target, *a, **k):
        shutil.copyfile(args['source'], target)


    print('START', flush=True)
    image.cache(fetch_func=fetch, filename=args['filename'],
                size=args['size'], image_id=args['filename'])
    print('DONE', flush=True)
''')


def find_processes(program, marker, session=None):
    """pids of live processes running ``program`` with ``marker`` among
    their arguments (and in ``session``, when given).
    """
    found = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open('/proc/%s/cmdline' % entry, 'rb') as f:
                argv = f.read().split(b'\0')
            with open('/proc/%s/stat' % entry) as f:
                stat = f.read().rsplit(')', 1)[1].split()
        except OSError:
            continue
        if stat[0] == 'Z' or not argv or not argv[0]:
            continue
        if session is not None and int(stat[3]) != session:
            continue
        if (os.path.basename(argv[0].decode()) == program and
                any(marker.encode() in arg for arg in argv)):
            found.append(int(entry))
    return found


def wait_until(predicate, what, proc=None):
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError('process ended (%s) before %s'
                                 % (proc.returncode, what))
        time.sleep(0.001)
    raise AssertionError('gave up waiting for %s' % what)


class KilledTestCase(FaultBase):
    """A tool or nova-compute itself killed part-way through a disk."""

    def _source(self, size):
        self.source = write_source(os.path.join(self.scratch, 'image'),
                                   size, seed=11)

    def _child(self, instance, images_type, mode, size):
        script = os.path.join(self.scratch, 'compute.py')
        with open(script, 'w') as f:
            f.write(CHILD)
        args = {'instances_path': self.instances_path, 'mode': mode,
                'uuid': instance.uuid, 'images_type': images_type,
                'source': self.source, 'filename': 'img', 'size': size}
        env = dict(os.environ, OS_NOVA_DISABLE_EVENTLET_PATCHING='true',
                   PYTHONPATH=os.getcwd())
        proc = subprocess.Popen([sys.executable, script, json.dumps(args)],
                                stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL,
                                start_new_session=True, env=env, text=True)
        self.addCleanup(self._reap, proc)
        self.assertEqual('START', proc.stdout.readline().strip())
        return proc

    def _reap(self, proc):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()

    def _kill_child(self, proc):
        # NOTE: the whole process group, as systemd would stop
        # nova-compute: the tool it runs dies with it.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        self.assertEqual(-signal.SIGKILL, proc.returncode)
        wait_until(lambda: not find_processes('qemu-img', self.instances_path)
                   and not find_processes('cp', self.instances_path),
                   'the tools to die')

    def _prefetch(self):
        """The base image already in the cache (a previous spawn), so
        that the fault hits the disk, not the download.
        """
        base_path = self.base_path('img')
        subprocess.run(['cp', self.source, base_path], check=True)

    def _assert_recovered(self, instance, images_type, mode, size):
        """The next spawn of the same disk: the half-made disk is gone and
        a complete one made.
        """
        self.flags(group='prealloc_backend', mode=mode)
        self.spawn(instance, images_type, self.source, 'img', size)
        disk = self.disk_path(instance)
        self.assert_no_leftovers(disk, allow_disk=True)
        seen = (guest_sha(disk) if images_type == 'qcow2'
                else (sha256_of(disk), os.path.getsize(disk)))
        self.assertEqual((expected_sha(self.source, size), size), seen)
        if mode in ('space', 'full'):
            self.assertGreaterEqual(pb_fixtures.allocated(disk), size)
        if images_type == 'qcow2':
            check = subprocess.run(['qemu-img', 'check', '-U', disk],
                                   capture_output=True, text=True)
            self.assertEqual(0, check.returncode, check.stdout)
        else:
            # The half-made raw disk was at the disk's own path: removed.
            self.assertIn('its creation was interrupted', self.logs.output)

    def test_cp_killed(self):
        """nova's own copy of the base, killed part-way: without the
        journal the next spawn would find a disk and keep it, truncated.
        """
        # Large enough to catch cp part-way (it copies about 3 GB/s here).
        self._source(128 * units.Mi)
        self._prefetch()
        instance = self.make_instance()
        disk = self.disk_path(instance)
        proc = self._child(instance, 'raw', 'full', 160 * units.Mi)
        wait_until(lambda: os.path.exists(disk) and
                   os.path.getsize(disk) > 4 * units.Mi, 'the copy', proc)
        self._kill_child(proc)
        partial = os.path.getsize(disk)
        self.assertLess(partial, 128 * units.Mi, 'not killed part-way')
        self.assertTrue(os.path.exists(disk + backend.JOURNAL_SUFFIX))
        self._assert_recovered(instance, 'raw', 'full', 160 * units.Mi)

    def test_zero_fill_killed(self):
        self._source(8 * units.Mi)
        self._prefetch()
        instance = self.make_instance()
        disk = self.disk_path(instance)
        size = 384 * units.Mi
        proc = self._child(instance, 'raw', 'full', size)
        wait_until(lambda: os.path.exists(disk) and
                   os.path.getsize(disk) == size and
                   pb_fixtures.allocated(disk) > 24 * units.Mi,
                   'the zero-fill', proc)
        self._kill_child(proc)
        self.assertLess(pb_fixtures.allocated(disk), size,
                        'not killed part-way')
        self.assertTrue(os.path.exists(disk + backend.JOURNAL_SUFFIX))
        self._assert_recovered(instance, 'raw', 'full', size)

    def _qemu_img_part_way(self, tmp, session=None):
        pid = wait_until(lambda: find_processes('qemu-img', tmp, session),
                         'qemu-img')[0]
        wait_until(lambda: os.path.exists(tmp) and
                   pb_fixtures.allocated(tmp) > 8 * units.Mi,
                   'qemu-img to write')
        return pid

    def test_nova_compute_killed_during_qemu_img(self):
        self._source(8 * units.Mi)
        self._prefetch()
        instance = self.make_instance()
        disk = self.disk_path(instance)
        tmp = disk + backend.TMP_SUFFIX
        size = 256 * units.Mi
        proc = self._child(instance, 'qcow2', 'full', size)
        self._qemu_img_part_way(tmp, session=proc.pid)
        self._kill_child(proc)
        self.assertTrue(os.path.exists(tmp))
        self.assertLess(pb_fixtures.allocated(tmp), size)
        self.assertFalse(os.path.exists(disk))
        self.assertTrue(os.path.exists(disk + backend.JOURNAL_SUFFIX))
        self._assert_recovered(instance, 'qcow2', 'full', size)

    def test_qemu_img_killed(self):
        """qemu-img alone killed: nova-compute survives, gets a typed error
        and removes what qemu-img left.
        """
        self.flags(group='prealloc_backend', mode='full')
        self._source(8 * units.Mi)
        self._prefetch()
        instance = self.make_instance()
        disk = self.disk_path(instance)
        tmp = disk + backend.TMP_SUFFIX
        size = 512 * units.Mi
        errors = []

        def spawn():
            try:
                self.spawn(instance, 'qcow2', self.source, 'img', size)
            except Exception as exc:
                errors.append(exc)

        thread = threading.Thread(target=spawn)
        thread.start()
        try:
            pid = self._qemu_img_part_way(tmp, session=os.getsid(0))
            os.kill(pid, signal.SIGKILL)
        finally:
            thread.join(WAIT)
        self.assertFalse(thread.is_alive())
        self.assertEqual(1, len(errors), errors)
        self.assertIsInstance(errors[0], exception.QemuImgError)
        self.assertEqual(-signal.SIGKILL, errors[0].exit_code)
        self.assert_no_leftovers(disk)
        self.spawn(instance, 'qcow2', self.source, 'img', size)
        self.assertEqual((expected_sha(self.source, size), size),
                         guest_sha(disk))
        self.assertGreaterEqual(pb_fixtures.allocated(disk), size)


class TornJournalTestCase(FaultBase):
    """A crash while the journal itself was being written (before the
    fsync): an empty or cut journal beside a disk that existed before.
    """

    def _existing_disk(self, images_type):
        self.flags(group='prealloc_backend', mode='space')
        source = write_source(os.path.join(self.scratch, 'image'),
                              2 * units.Mi, seed=3)
        instance = self.make_instance()
        image = self.spawn(instance, images_type, source, 'img',
                           8 * units.Mi)
        # The guest has written since.
        if images_type == 'qcow2':
            subprocess.run(['qemu-io', '-f', 'qcow2', '-c',
                            'write -P 0x42 512k 128k', image.path],
                           check=True, capture_output=True)
        else:
            with open(image.path, 'r+b') as f:
                f.seek(512 * units.Ki)
                f.write(b'\x42' * 128 * units.Ki)
        return instance, source, image.path

    def _torn(self, images_type, content):
        instance, source, disk = self._existing_disk(images_type)
        before = guest_sha(disk)
        with open(disk + backend.JOURNAL_SUFFIX, 'w') as f:
            f.write(content)
        # Hard reboot (or resize) after the crash: the same disk again.
        self.spawn(instance, images_type, source, 'img', 8 * units.Mi)
        self.assertTrue(os.path.exists(disk))
        self.assertEqual(before, guest_sha(disk),
                         'the guest\'s data was lost: the disk was removed '
                         'and made again from the base image')
        self.assert_no_leftovers(disk, allow_disk=True)

    def test_empty_journal_qcow2(self):
        self._torn('qcow2', '')

    def test_cut_journal_qcow2(self):
        self._torn('qcow2', '{"created": fal')

    def test_empty_journal_raw(self):
        self._torn('raw', '')


class ConcurrentSpawnTestCase(FaultBase):
    """Eight spawns at once from one base image, not yet cached."""

    THREADS = 8

    def _run(self, images_type, mode, size):
        self.flags(group='prealloc_backend', mode=mode)
        source = write_source(os.path.join(self.scratch, 'image'),
                              3 * units.Mi + 4096, seed=5)
        slow_fetch = self.fetcher(source)

        def fetch(target, *args, **kwargs):
            # NOTE: a download that takes a while, so that every thread
            # arrives while the base is being fetched.
            time.sleep(0.3)
            slow_fetch(target, *args, **kwargs)

        instances = [self.make_instance() for _ in range(self.THREADS)]
        barrier = threading.Barrier(self.THREADS)
        errors = []

        def spawn(instance):
            try:
                barrier.wait()
                image = backend.Backend(images_type == 'qcow2').by_name(
                    instance, 'disk', images_type)
                image.cache(fetch_func=fetch, filename='img', size=size,
                            image_id='img')
            except Exception as exc:
                errors.append(exc)

        threads = [threading.Thread(target=spawn, args=(i,))
                   for i in instances]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        self.assertFalse(any(t.is_alive() for t in threads))
        self.assertEqual([], errors)
        self.assertEqual(1, len(self.fetched), self.fetched)
        wanted = expected_sha(source, size)
        for instance in instances:
            disk = self.disk_path(instance)
            self.assert_no_leftovers(disk, allow_disk=True)
            self.assertEqual((wanted, size), guest_sha(disk))
            if mode in ('space', 'full'):
                self.assertGreaterEqual(pb_fixtures.allocated(disk), size)
            if images_type == 'qcow2':
                info = pb_fixtures.qemu_img_info(disk)
                self.assertEqual(self.base_path('img'),
                                 info['backing-filename'])
        lock_path = os.path.join(self.instances_path, 'locks')
        self.assertNotEqual([], os.listdir(lock_path))
        self.assertEqual([], held_locks(lock_path))
        # The in-process side of nova's lock is free too.
        taken = []
        probe = threading.Thread(target=self._take_lock,
                                 args=('img', taken))
        probe.start()
        probe.join(WAIT)
        self.assertEqual([True], taken)

    def _take_lock(self, name, taken):
        from nova import utils as nova_utils

        @nova_utils.synchronized(name, external=True, lock_path=os.path.join(
            self.instances_path, 'locks'))
        def take():
            taken.append(True)

        take()

    def test_qcow2_space(self):
        self._run('qcow2', 'space', 64 * units.Mi)

    def test_qcow2_full(self):
        self._run('qcow2', 'full', 16 * units.Mi)

    def test_raw_full(self):
        self._run('raw', 'full', 16 * units.Mi)

    def test_raw_space(self):
        self._run('raw', 'space', 64 * units.Mi)


class TimeoutTestCase(FaultBase):
    """``full`` on a large disk, cancelled by allocation_timeout."""

    SIZE = 16 * units.Gi

    def setUp(self):
        super().setUp()
        # A filesystem of its own (sparse, so it costs what is written):
        # large enough for the free-space check, and nobody else's writes
        # blur its free-space figures.
        self.use_loop_fs('ext4', 19 * 1024)
        self.flags(group='prealloc_backend', mode='full',
                   allocation_timeout=1)
        self.source = write_source(os.path.join(self.scratch, 'image'),
                                   units.Mi, seed=9)

    def _slow_storage(self):
        """Storage that takes 0.6 s per 16 MiB privileged call: the
        timeout fires after a couple of real calls, on any machine.
        """
        real = prealloc_backend.privsep.fs.zero_fill_range
        calls = []

        def slow(path, offset, length):
            written = real(path, offset, length)
            calls.append(written)
            time.sleep(0.6)
            return written

        self.useFixture(fixtures.MockPatchObject(
            prealloc_backend.privsep.fs, 'zero_fill_range', slow))
        self.useFixture(fixtures.MockPatchObject(
            backend, 'ZERO_FILL_CALL_BYTES', 16 * units.Mi))
        return calls

    def test_raw_new_disk(self):
        calls = self._slow_storage()
        free_before = fsprobe.free_bytes(self.instances_path)
        instance = self.make_instance()
        exc = self.assertRaises(exception.AllocationTimeout, self.spawn,
                                instance, 'raw', self.source, 'img',
                                self.SIZE)
        self.assertIn('allocation_timeout', str(exc))
        self.assertLess(sum(calls), self.SIZE)
        self.assertGreater(len(calls), 0)
        self.assert_no_leftovers(self.disk_path(instance))
        # Only the image cache's base (1 MiB) and nova's small files stay.
        self.assertLess(free_before - fsprobe.free_bytes(self.instances_path),
                        2 * units.Mi)

    def test_raw_existing_disk_kept(self):
        """A grow cancelled by the timeout keeps the disk and its data."""
        self.flags(group='prealloc_backend', mode='none')
        instance = self.make_instance()
        image = self.spawn(instance, 'raw', self.source, 'img', 8 * units.Mi)
        digest = sha256_of(image.path)
        self.flags(group='prealloc_backend', mode='full')
        self._slow_storage()
        self.assertRaises(exception.AllocationTimeout, self.spawn, instance,
                          'raw', self.source, 'img', self.SIZE)
        self.assert_no_leftovers(image.path, allow_disk=True)
        with open(image.path, 'rb') as f:
            self.assertEqual(digest,
                             hashlib.sha256(f.read(8 * units.Mi)).hexdigest())

    def test_qcow2_new_disk(self):
        """qemu-img stopped (storage that makes no progress): the timeout
        kills it and nothing is left.
        """
        instance = self.make_instance()
        tmp = self.disk_path(instance) + backend.TMP_SUFFIX
        stopped = []

        def stall():
            pid = wait_until(lambda: find_processes('qemu-img', tmp,
                                                    os.getsid(0)),
                             'qemu-img')[0]
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)

        watcher = threading.Thread(target=stall, daemon=True)
        watcher.start()
        exc = self.assertRaises(exception.AllocationTimeout, self.spawn,
                                instance, 'qcow2', self.source, 'img',
                                self.SIZE)
        watcher.join(WAIT)
        self.assertEqual(1, len(stopped))
        self.assertIn(tmp, str(exc))
        self.assertEqual([], find_processes('qemu-img', tmp))
        self.assert_no_leftovers(self.disk_path(instance))


class JournalUnitTestCase(base.TestCase):
    """The journal's own contract, on real files."""

    def test_created_disk_removed_existing_kept(self):
        directory = os.path.join(self.instances_path, 'j')
        os.mkdir(directory)
        made = os.path.join(directory, 'made')
        kept = os.path.join(directory, 'kept')
        for path, created in ((made, True), (kept, False)):
            with open(path, 'wb') as f:
                f.write(b'x' * 4096)
            backend._Journal(path).begin(created)
            with open(path + backend.TMP_SUFFIX, 'wb') as f:
                f.write(b'half')
        for path in (made, kept):
            backend._Journal(path).recover()
            for suffix in (backend.JOURNAL_SUFFIX, backend.TMP_SUFFIX):
                self.assertFalse(os.path.exists(path + suffix))
        self.assertFalse(os.path.exists(made))
        with open(kept, 'rb') as f:
            self.assertEqual(b'x' * 4096, f.read())
        with open(os.path.join(directory, 'unused'), 'wb'):
            pass
        self.assertEqual(['kept', 'unused'], sorted(os.listdir(directory)))
