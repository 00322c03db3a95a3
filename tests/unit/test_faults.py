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

* qemu-img, cp or the zero-fill killed part-way (SIGKILL sent by the test,
  to the tool alone or to the whole nova-compute process running the
  spawn): the next cache() of the same disk does not reuse a half-made disk.
* A crash while the journal itself is being written.
* Eight threads spawning disks from one base image at once.

ENOSPC and ``allocation_timeout`` need loop-mounted filesystems: they are in
tests/privileged/test_faults.py.
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from oslo_utils import units

from prealloc_backend import backend
from prealloc_backend import exception
from tests import base
from tests import fixtures as pb_fixtures

# Helpers shared with the other tier's test_faults (tests/fixtures.py).
WAIT = pb_fixtures.WAIT
find_processes = pb_fixtures.find_processes
guest_sha = pb_fixtures.guest_sha
sha256_of = pb_fixtures.sha256_of
wait_until = pb_fixtures.wait_until
write_source = pb_fixtures.write_source


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


class KilledTestCase(base.FaultBase):
    """A tool or nova-compute itself killed part-way through a disk."""

    def _source(self, size):
        self.source = write_source(
            os.path.join(self.scratch, 'image'), size, seed=11)

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
        wait_until(
            lambda: not (find_processes('qemu-img',
                                                    self.instances_path) or
                         find_processes('cp',
                                                    self.instances_path)),
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
        pid = wait_until(
            lambda: find_processes('qemu-img', tmp, session),
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


class TornJournalTestCase(base.FaultBase):
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


class ConcurrentSpawnTestCase(base.FaultBase):
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
