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

"""bench/prealloc_bench/cmd.py: the command's arguments and its checks
before a run, on real directories and this machine's tools (the run itself
is in tests/integration/test_bench_command.py; more of the command in
prealloc_bench/tests/test_bench.py).
"""

import argparse
import os

import fixtures
from oslo_utils import units

from prealloc_bench import cmd as cmd_bench
from tests import base


class SizeTestCase(base.TestCase):

    def test_sizes(self):
        for text, value in (('1M', units.Mi), ('512m', 512 * units.Mi),
                            ('4G', 4 * units.Gi), ('4GiB', 4 * units.Gi),
                            ('1536M', 1536 * units.Mi), ('1T', units.Ti),
                            (str(units.Mi), units.Mi), (' 2M ', 2 * units.Mi)):
            self.assertEqual(value, cmd_bench._size(text), text)

    def test_refused(self):
        for text, why in (('100K', 'whole number of MiB'),
                          (str(units.Mi + 1), 'whole number of MiB'),
                          ('0', 'at least 1M'),
                          ('1.5G', "'1.5G' is not a size"),
                          ('big', "'big' is not a size"),
                          ('', 'not a size')):
            exc = self.assertRaises(argparse.ArgumentTypeError,
                                    cmd_bench._size, text)
            self.assertIn(why, str(exc), text)


class DirectoryTestCase(base.TestCase):

    def parse(self, argv):
        parser = argparse.ArgumentParser()
        cmd_bench.add_arguments(parser)
        return parser.parse_args(argv)

    def test_directory_chosen(self):
        self.assertEqual('/x', cmd_bench._directory(self.parse(['--dir',
                                                               '/x'])))
        missing = os.path.join(self.instances_path, 'missing')
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_bench.cmd.DEFAULT_DIRS',
            (missing, self.instances_path)))
        self.assertEqual(self.instances_path,
                         cmd_bench._directory(self.parse([])))
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_bench.cmd.DEFAULT_DIRS', (missing,)))
        self.assertEqual(os.getcwd(), cmd_bench._directory(self.parse([])))

    def test_preflight_accepts_and_makes_the_directory(self):
        directory = os.path.join(self.instances_path, 'new', 'dir')
        self.assertIsNone(cmd_bench._preflight(directory))
        self.assertTrue(os.path.isdir(directory))
        # The direct-IO probe leaves nothing behind.
        self.assertEqual([], os.listdir(directory))

    def test_preflight_names_missing_tools(self):
        empty = self.useFixture(fixtures.TempDir()).path
        self.useFixture(fixtures.EnvironmentVariable('PATH', empty))
        reason = cmd_bench._preflight(self.instances_path)
        self.assertIn('qemu-img, qemu-io, filefrag not found', reason)

    def test_preflight_unusable_directory(self):
        afile = os.path.join(self.instances_path, 'file')
        open(afile, 'w').close()
        reason = cmd_bench._preflight(os.path.join(afile, 'sub'))
        self.assertIn('cannot use %s' % os.path.join(afile, 'sub'), reason)
