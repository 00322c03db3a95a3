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

"""nova-compute killed part-way through making a disk.

The test runs nova-compute's part (the plugin's backend making one disk) in
a child process that imports nova, and kills it with SIGKILL while qemu-img,
cp or the zero-fill is at work, as systemd would stop nova-compute: the
next cache() of the same disk does not reuse a half-made disk. qemu-img
alone killed under a live nova-compute is here too (the same sizes, large
enough to catch each tool part-way). The other faults are in
tests/unit/test_faults.py and, on loop mounts, tests/privileged.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

from oslo_utils import units

from prealloc_backend.adapter import backend
from prealloc_backend import exception
from tests import base
from tests import fixtures as pb_fixtures

# nova-compute making one disk, as a separate process the test can kill.
CHILD = textwrap.dedent('''
    import json
    import shutil
    import sys

    from nova import objects
    import nova.privsep

    from prealloc_backend.adapter import backend
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
        self.source = pb_fixtures.write_source(
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

    @staticmethod
    def _freeze_at(predicate, what, proc=None, pid=None):
        """Wait until ``predicate()``, then stop (SIGSTOP) the child's
        process group, or ``pid``, in the same step: the tool is caught
        where the predicate saw it, however long this process is then kept
        off the CPU before it kills it (a copy at 3 GB/s outruns a
        preempted poll). SIGKILL ends a stopped process as any other.
        """
        def seen():
            value = predicate()
            if value:
                if pid is None:
                    os.killpg(proc.pid, signal.SIGSTOP)
                else:
                    os.kill(pid, signal.SIGSTOP)
            return value
        return pb_fixtures.wait_until(seen, what, proc)

    def _kill_child(self, proc):
        # The whole process group, as systemd would stop
        # nova-compute: the tool it runs dies with it.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        self.assertEqual(-signal.SIGKILL, proc.returncode)
        pb_fixtures.wait_until(
            lambda: not (pb_fixtures.find_processes('qemu-img',
                                                    self.instances_path) or
                         pb_fixtures.find_processes('cp',
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
        seen = (pb_fixtures.guest_sha(disk) if images_type == 'qcow2'
                else (pb_fixtures.sha256_of(disk), os.path.getsize(disk)))
        self.assertEqual((pb_fixtures.expected_sha(self.source, size),
                          size), seen)
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
        # Large enough to catch cp part-way: it copies about 3 GB/s here,
        # so 512 MiB leave the poll about 170 ms between its first
        # sighting and the copy's end (128 MiB, 40 ms, was too short for a
        # poll kept off the CPU of a loaded 2-vCPU machine).
        self._source(512 * units.Mi)
        self._prefetch()
        instance = self.make_instance()
        disk = self.disk_path(instance)
        proc = self._child(instance, 'raw', 'full', 544 * units.Mi)
        self._freeze_at(lambda: os.path.exists(disk) and
                        os.path.getsize(disk) > 4 * units.Mi,
                        'the copy', proc)
        self._kill_child(proc)
        partial = os.path.getsize(disk)
        self.assertLess(partial, 512 * units.Mi, 'not killed part-way')
        self.assertTrue(os.path.exists(disk + backend.JOURNAL_SUFFIX))
        self._assert_recovered(instance, 'raw', 'full', 544 * units.Mi)

    def test_zero_fill_killed(self):
        self._source(8 * units.Mi)
        self._prefetch()
        instance = self.make_instance()
        disk = self.disk_path(instance)
        size = 384 * units.Mi
        proc = self._child(instance, 'raw', 'full', size)
        self._freeze_at(lambda: os.path.exists(disk) and
                        os.path.getsize(disk) == size and
                        pb_fixtures.allocated(disk) > 24 * units.Mi,
                        'the zero-fill', proc)
        self._kill_child(proc)
        self.assertLess(pb_fixtures.allocated(disk), size,
                        'not killed part-way')
        self.assertTrue(os.path.exists(disk + backend.JOURNAL_SUFFIX))
        self._assert_recovered(instance, 'raw', 'full', size)

    def _qemu_img_part_way(self, tmp, session=None):
        """The pid of qemu-img writing ``tmp``, stopped part-way."""
        pid = pb_fixtures.wait_until(
            lambda: pb_fixtures.find_processes('qemu-img', tmp, session),
            'qemu-img')[0]
        self._freeze_at(lambda: os.path.exists(tmp) and
                        pb_fixtures.allocated(tmp) > 8 * units.Mi,
                        'qemu-img to write', pid=pid)
        return pid

    def test_nova_compute_killed_during_qemu_img(self):
        self._source(8 * units.Mi)
        self._prefetch()
        instance = self.make_instance()
        disk = self.disk_path(instance)
        tmp = disk + backend.TMP_SUFFIX
        # 512 MiB, as test_qemu_img_killed: time enough to catch qemu-img
        # part-way after the scan of /proc that finds it.
        size = 512 * units.Mi
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
            thread.join(pb_fixtures.WAIT)
        self.assertFalse(thread.is_alive())
        self.assertEqual(1, len(errors), errors)
        self.assertIsInstance(errors[0], exception.QemuImgError)
        self.assertEqual(-signal.SIGKILL, errors[0].exit_code)
        self.assert_no_leftovers(disk)
        self.spawn(instance, 'qcow2', self.source, 'img', size)
        self.assertEqual((pb_fixtures.expected_sha(self.source, size), size),
                         pb_fixtures.guest_sha(disk))
        self.assertGreaterEqual(pb_fixtures.allocated(disk), size)
