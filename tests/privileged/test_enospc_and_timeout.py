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

"""Faults on real loop-mounted filesystems (root only).

* ENOSPC in the middle of a raw ``full`` zero-fill, a raw ``space``
  fallocate, a qcow2 ``falloc``/``full`` creation and a preallocated grow,
  on a small loop-mounted ext4: the space is taken by another writer after
  the plugin's free-space check passed (the only way to run out once the
  check exists), and the kernel's real ENOSPC does the rest.
* ``full`` on a large disk cancelled by ``allocation_timeout``.
"""

import hashlib
import os
import signal
import subprocess
import threading
import time

import fixtures
from oslo_log import log as logging
from oslo_utils import units

from prealloc_backend.adapter import backend
from prealloc_backend.disk import allocate
from prealloc_backend.disk import fsprobe
from prealloc_backend import exception
import prealloc_backend.privsep.fs
from tests import base
from tests import fixtures as pb_fixtures

LOG = logging.getLogger(__name__)


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
            # NOTE(nova): nova touches a base image's mtime at every spawn
            # (image cache bookkeeping): only its content counts.
            mtime = None if relative.startswith('_base/') else st.st_mtime_ns
            state[relative] = (st.st_size, st.st_blocks, mtime,
                               pb_fixtures.sha256_of(path)
                               if os.path.isfile(path) else None)
    return state


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


class EnospcTestCase(base.FaultBase):
    """ENOSPC on a small loop-mounted ext4 after the free-space check."""

    def setUp(self):
        super().setUp()
        self.fs = self.use_loop_fs('ext4', 96)
        # A neighbour: an instance made before, which must not change.
        self.source = pb_fixtures.write_source(
            os.path.join(self.scratch, 'image'), 2 * units.Mi + 4096, seed=7)
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
            allocate, 'ZERO_FILL_CALL_BYTES', 4 * units.Mi))
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
        # The space the plan counted is taken after nova's copy, just
        # before fallocate(2): the daemon's own check refuses it.
        real = allocate._fallocate

        def hog_first(*args):
            fill_filesystem(self.fs.path)
            return real(*args)

        self.useFixture(fixtures.MockPatchObject(allocate, '_fallocate',
                                                 hog_first))
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
        guest_before = pb_fixtures.guest_sha(disk)
        self._hog_after(fsprobe, 'facts')
        exc = self.assertRaises(exception.QemuImgError, self.spawn,
                                self._instance_of(disk), 'qcow2',
                                self.source, 'img', 64 * units.Mi)
        self.assertIn('resize', exc.cmd)
        os.unlink(self.hog)
        self.assert_no_leftovers(disk, allow_disk=True)
        self.assertEqual(guest_before, pb_fixtures.guest_sha(disk))
        check = subprocess.run(['qemu-img', 'check', '-U', disk],
                               capture_output=True, text=True)
        self.assertEqual(0, check.returncode, check.stdout + check.stderr)

    def test_raw_grow(self):
        self.flags(group='prealloc_backend', mode='full')
        disk = self.raw_neighbour.path
        with open(disk, 'r+b') as f:
            f.seek(3 * units.Mi)
            f.write(b'guest data' * 100)
        digest = pb_fixtures.sha256_of(disk)
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


class TimeoutTestCase(base.FaultBase):
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
        self.source = pb_fixtures.write_source(
            os.path.join(self.scratch, 'image'), units.Mi, seed=9)

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
            allocate, 'ZERO_FILL_CALL_BYTES', 16 * units.Mi))
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
        digest = pb_fixtures.sha256_of(image.path)
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
        # The watcher stops qemu-img when it finds it before the
        # timeout; on a loaded machine the timeout may kill qemu-img (or
        # its prlimit wrapper) first. Either way the outcome asserted is
        # the same (AllocationTimeout, no qemu-img left, no leftovers), so
        # the test does not depend on who wins: it never judges how fast
        # this machine starts a process.
        self.flags(group='prealloc_backend', allocation_timeout=3)
        instance = self.make_instance()
        tmp = self.disk_path(instance) + backend.TMP_SUFFIX
        stopped = []
        done = threading.Event()

        def stall():
            while not done.is_set():
                pids = pb_fixtures.find_processes('qemu-img', tmp,
                                                  os.getsid(0))
                if pids:
                    os.kill(pids[0], signal.SIGSTOP)
                    stopped.append(pids[0])
                    return
                done.wait(0.001)

        watcher = threading.Thread(target=stall, daemon=True)
        watcher.start()
        try:
            exc = self.assertRaises(exception.AllocationTimeout, self.spawn,
                                    instance, 'qcow2', self.source, 'img',
                                    self.SIZE)
        finally:
            done.set()
            watcher.join(pb_fixtures.WAIT)
        self.assertFalse(watcher.is_alive())
        LOG.info('qemu-img stopped before the timeout: %s', bool(stopped))
        for pid in stopped:
            self.assertFalse(os.path.exists('/proc/%d' % pid))
        self.assertIn(tmp, str(exc))
        self.assertEqual([], pb_fixtures.find_processes('qemu-img', tmp))
        self.assert_no_leftovers(self.disk_path(instance))
