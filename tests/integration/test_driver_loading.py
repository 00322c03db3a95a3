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

"""The driver as nova-compute loads it, in a fresh Python each: the
``prealloc-nova-compute`` wrapper and the modules importing the driver
pulls in.
"""

import subprocess
import sys

from tests import base


class TestWrapper(base.TestCase):

    def test_wrapper_registers_driver_for_nova(self):
        code = ('import prealloc_backend.cmd.compute as c\n'
                'from prealloc_backend.adapter import driver\n'
                'driver.register()\n'
                'from oslo_utils import importutils\n'
                'cls = importutils.import_class('
                '"nova.virt." + driver.COMPUTE_DRIVER)\n'
                'assert cls is driver.LibvirtDriver\n'
                'assert callable(c.main)\n'
                'print("ok")\n')
        proc = subprocess.run([sys.executable, '-c', code],
                              capture_output=True, text=True)
        self.assertEqual('ok', proc.stdout.strip(), proc.stderr)

    def test_console_script_runs_nova_compute_main(self):
        proc = subprocess.run(
            [sys.executable, '-c',
             'import sys; sys.argv = ["prealloc-nova-compute", "--help"]\n'
             'from prealloc_backend.cmd import compute\n'
             'compute.main()'], capture_output=True, text=True)
        # nova-compute's own option parser answered.
        self.assertEqual(0, proc.returncode, proc.stderr)
        self.assertIn('--config-file', proc.stdout)


class TestRuntimeImports(base.TestCase):
    """What nova-compute loads with the driver: the runtime modules only.

    The benchmark (and its guest builder), the host checks and the command
    line are not part of what nova-compute runs; importing the driver must
    not pull them in (nor matplotlib, which only the benchmark's chart
    uses).
    """

    RUNTIME = {'prealloc_backend', 'prealloc_backend.conf',
               'prealloc_backend.exception',
               'prealloc_backend.adapter', 'prealloc_backend.adapter.backend',
               'prealloc_backend.adapter.driver',
               'prealloc_backend.adapter.events',
               'prealloc_backend.adapter.guestxml',
               'prealloc_backend.adapter.inventory',
               'prealloc_backend.adapter.migrationops',
               'prealloc_backend.adapter.operation',
               # init_host recovers interrupted adoptions
               'prealloc_backend.adoption',
               'prealloc_backend.adoption.live',
               'prealloc_backend.adoption.recovery',
               'prealloc_backend.system.stopping',
               'prealloc_backend.disk', 'prealloc_backend.disk.allocate',
               'prealloc_backend.disk.extend', 'prealloc_backend.disk.formats',
               'prealloc_backend.disk.fsprobe',
               'prealloc_backend.disk.hostcaps',
               'prealloc_backend.disk.journal', 'prealloc_backend.disk.qcow2',
               'prealloc_backend.disk.qemu', 'prealloc_backend.disk.refcount',
               'prealloc_backend.disk.usage',
               'prealloc_backend.planner', 'prealloc_backend.planner.capacity',
               'prealloc_backend.planner.diskplan',
               'prealloc_backend.planner.hostpolicy',
               'prealloc_backend.planner.modes',
               'prealloc_backend.planner.qcow2_layout',
               'prealloc_backend.privsep', 'prealloc_backend.privsep.beneath',
               'prealloc_backend.privsep.fs',
               'prealloc_backend.system', 'prealloc_backend.system.fileops',
               'prealloc_backend.system.process'}

    def test_driver_loads_only_runtime_modules(self):
        out = subprocess.run(
            [sys.executable, '-c',
             'import sys, prealloc_backend.adapter.driver; '
             'print("\\n".join(sorted(m for m in sys.modules '
             'if m.startswith(("prealloc_backend", "matplotlib")))))'],
            check=True, capture_output=True, text=True).stdout.split()
        loaded = set(out)
        self.assertEqual(set(), loaded - self.RUNTIME)
        self.assertIn('prealloc_backend.adapter.backend', loaded)
