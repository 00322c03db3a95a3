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

* A crash while the journal itself is being written.
* Eight threads spawning disks from one base image at once.

qemu-img, cp or the zero-fill killed part-way (nova-compute killed in a
child process) are in tests/integration/test_killed_compute.py; ENOSPC and
``allocation_timeout`` need loop-mounted filesystems: they are in
tests/privileged/test_enospc_and_timeout.py.
"""

import os
import subprocess
import threading
import time

from oslo_utils import units

from prealloc_backend.adapter import backend
from tests import base
from tests import fixtures as pb_fixtures


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


class TornJournalTestCase(base.FaultBase):
    """A crash while the journal itself was being written (before the
    fsync): an empty or cut journal beside a disk that existed before.
    """

    def _existing_disk(self, images_type):
        self.flags(group='prealloc_backend', mode='space')
        source = pb_fixtures.write_source(
            os.path.join(self.scratch, 'image'), 2 * units.Mi, seed=3)
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
        before = pb_fixtures.guest_sha(disk)
        with open(disk + backend.JOURNAL_SUFFIX, 'w') as f:
            f.write(content)
        # Hard reboot (or resize) after the crash: the same disk again.
        self.spawn(instance, images_type, source, 'img', 8 * units.Mi)
        self.assertTrue(os.path.exists(disk))
        self.assertEqual(before, pb_fixtures.guest_sha(disk),
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
        source = pb_fixtures.write_source(
            os.path.join(self.scratch, 'image'), 3 * units.Mi + 4096, seed=5)
        slow_fetch = self.fetcher(source)

        def fetch(target, *args, **kwargs):
            # A download that takes a while, so that every thread
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
            thread.join(pb_fixtures.WAIT)
        self.assertFalse(any(t.is_alive() for t in threads))
        self.assertEqual([], errors)
        self.assertEqual(1, len(self.fetched), self.fetched)
        wanted = pb_fixtures.expected_sha(source, size)
        for instance in instances:
            disk = self.disk_path(instance)
            self.assert_no_leftovers(disk, allow_disk=True)
            self.assertEqual((wanted, size), pb_fixtures.guest_sha(disk))
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
        probe.join(pb_fixtures.WAIT)
        self.assertEqual([True], taken)

    def _take_lock(self, name, taken):
        from nova import utils as nova_utils

        @nova_utils.synchronized(name, external=True, lock_path=os.path.join(
            self.instances_path, 'locks'))
        def take():
            taken.append(True)

        take()

    def test_qcow2_space(self):
        self._run('qcow2', 'space', 16 * units.Mi)

    def test_qcow2_full(self):
        self._run('qcow2', 'full', 16 * units.Mi)

    def test_raw_full(self):
        self._run('raw', 'full', 16 * units.Mi)

    def test_raw_space(self):
        self._run('raw', 'space', 16 * units.Mi)
