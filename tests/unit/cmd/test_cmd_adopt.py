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

"""prealloc-backend adopt, the command line: its arguments, its progress
lines and its report's exit status. Its work (adoption.instances):
tests/unit/adoption/test_instances.py; against nova and a real libvirtd:
tests/functional/real/test_adopt.py.
"""

import argparse
import io
from unittest import mock

import fixtures

from prealloc_backend.adoption import live
from prealloc_backend.adoption import recovery
from prealloc_backend.cmd import adopt
from tests import base


class TestArguments(base.TestCase):

    def parse(self, *argv):
        parser = argparse.ArgumentParser()
        adopt.add_arguments(parser)
        return parser.parse_args(argv)

    def test_rate_in_mib_per_second(self):
        self.assertEqual(16 * 1024 * 1024,
                         self.parse('--all', '--max-rate', '16').max_rate)
        self.assertEqual(512 * 1024,
                         self.parse('--all', '--max-rate', '0.5').max_rate)

    def test_bad_rate_is_refused_naming_it(self):
        for bad in ('0', '-3', 'fast', 'inf', 'nan', '1e-9', '1e300'):
            err = self.assertRaises(SystemExit, self.parse, '--all',
                                    '--max-rate', bad)
            self.assertEqual(2, err.code)

    def test_instance_or_all_required(self):
        self.assertRaises(SystemExit, self.parse)
        self.assertRaises(SystemExit, self.parse, '--all', '--instance',
                          'x')


class TestExitStatus(base.TestCase):

    def test_highest_of_left_and_failed(self):
        report = adopt.Report(io.StringIO())
        self.assertEqual(0, report.status)
        report.left('busy')
        self.assertEqual(1, report.status)
        report.failed('copy failed')
        report.left('busy')
        self.assertEqual(2, report.status)
        self.assertEqual('busy\ncopy failed\nbusy\n', report.out.getvalue())

    def test_another_adopt_running_is_an_error_of_the_command(self):
        args = argparse.Namespace(verbose=False)
        with mock.patch.object(adopt, '_run', side_effect=(
                recovery.AlreadyRunning('locked'))), \
                mock.patch('sys.stdout', new_callable=io.StringIO) as out:
            self.assertEqual(255, adopt.run(args))
        self.assertEqual('Error: locked\n', out.getvalue())


class TestProgress(base.TestCase):

    def test_a_line_a_second_at_most_and_the_last(self):
        clock = iter([100.0, 100.4, 101.2, 101.3, 101.35])
        self.useFixture(fixtures.MockPatch(
            'prealloc_backend.cmd.adopt.time.monotonic',
            side_effect=lambda: next(clock)))
        report = adopt.Report(io.StringIO())
        show = adopt.progress_printer(report, 'uuid')
        for copied, ready in ((0, False), (1, False), (2, False),
                              (3, False), (4, True)):
            show(live.Progress('vda', copied * 2 ** 20, 4 * 2 ** 20, ready))
        lines = report.out.getvalue().splitlines()
        # The first look, the one 1.2 s later, and the copy in step.
        self.assertEqual(3, len(lines), lines)
        self.assertIn('instance uuid vda:   0.0% (0.0 of 4.0 MiB)', lines[0])
        self.assertIn('50.0% (2.0 of 4.0 MiB) 1.7 MiB/s', lines[1])
        self.assertIn('100.0% (4.0 of 4.0 MiB)', lines[2])
        self.assertTrue(lines[2].endswith(', in step'))
        self.assertEqual(0, report.status)
