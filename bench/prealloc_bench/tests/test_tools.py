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

"""bench/prealloc_bench/tools.py: the tools run for real (qemu-img,
qemu-io, filefrag) on small files; a run too short to time is judged
against a threshold the test sets, never against this machine's speed.
"""

import os

from oslo_utils import units

from prealloc_bench import tools
from tests import base
from tests import fixtures as pb_fixtures


class ToolsTestCase(base.TestCase):

    def test_threshold_is_the_callers(self):
        self.assertEqual(0.5, tools._long_enough(['x'], 0.5, 0.5))
        exc = self.assertRaises(tools.TooShort, tools._long_enough,
                                ['cmd', 'arg'], 0.49, 0.5)
        self.assertIn('cmd arg: the timed run took 0.4900 s, under 0.50 s',
                      str(exc))
        self.assertIsInstance(exc, tools.ToolError)

    def test_run_errors_name_the_command(self):
        exc = self.assertRaises(tools.ToolError, tools.run,
                                ['no-such-tool-here', '--x'])
        self.assertIn('no-such-tool-here --x: command not found', str(exc))
        exc = self.assertRaises(tools.ToolError, tools.run,
                                ['qemu-img', 'info', '/nonexistent/d'])
        self.assertIn('exit code 1', str(exc))
        self.assertIn('/nonexistent/d', exc.reason)
        self.assertEqual('a\n', tools.run(['cat'], stdin='a\n'))

    def test_version(self):
        self.assertRegex(tools.version(), r'^\d+\.\d+')
        self.assertEqual('unknown', tools.version('no-such-tool-here'))

    def test_info_and_filefrag(self):
        path = os.path.join(self.instances_path, 'd.qcow2')
        pb_fixtures.make_base(path, 'qcow2', 4 * units.Mi)
        info = tools.info(path, 'qcow2')
        self.assertEqual(('qcow2', 4 * units.Mi),
                         (info['format'], info['virtual-size']))
        sparse = os.path.join(self.instances_path, 'sparse')
        with open(sparse, 'wb') as f:
            f.truncate(units.Mi)
        self.assertEqual(0, tools.filefrag(sparse))
        with open(sparse, 'r+b') as f:
            f.write(b'x' * 4096)
        self.assertEqual(1, tools.filefrag(sparse))

    def test_io_script(self):
        self.assertEqual('read -q 0 4096\nquit\n',
                         tools.io_script([(0, 4096)]))
        self.assertEqual('write -C -P 7 512 4096\nquit\n',
                         tools.io_script([(512, 4096)], op='write',
                                         pattern=7, report=True))

    def test_bench_timed_against_the_given_floor(self):
        path = os.path.join(self.instances_path, 'disk.raw')
        with open(path, 'wb') as f:
            f.truncate(8 * units.Mi)
        opts = tools.image_opts(path, 'raw')
        self.assertRaises(tools.TooShort, tools.bench_timed, opts, 16, 4096,
                          min_seconds=3600.0)
        self.assertGreaterEqual(tools.bench_timed(
            opts, 16, 4096, timed=False, min_seconds=3600.0).seconds, 0)
        self.assertGreaterEqual(tools.bench_timed(
            opts, 16, 4096, min_seconds=0.0).seconds, 0)
