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

"""``prealloc-backend check``'s command line, in this process.

The command run as operators run it (a child process that parses nova's
global configuration) is in tests/integration/test_check_command.py.
"""

import argparse
from unittest import mock

import fixtures
from oslo_upgradecheck import upgradecheck
from oslo_utils import units
from oslotest import base

from prealloc_backend.checks import owner
from prealloc_backend.cmd import check


class TestParseSize(base.BaseTestCase):

    def test_sizes(self):
        self.assertEqual(4 * units.Mi, check.parse_size('4M'))
        self.assertEqual(20 * units.Gi, check.parse_size('20G'))
        self.assertEqual(20 * units.Gi, check.parse_size('20GiB'))
        self.assertEqual(units.Ti, check.parse_size('1t'))
        self.assertEqual(512, check.parse_size('512'))
        # Not string_to_bytes' bits: 'b' is bytes here, as it always was.
        self.assertEqual(4 * units.Mi, check.parse_size('4Mb'))
        # Exact, where floating point would lose the last byte.
        self.assertEqual(2 ** 53 + 1, check.parse_size(str(2 ** 53 + 1)))
        self.assertEqual((2 ** 53 + 1) * units.Ti,
                         check.parse_size('%dT' % (2 ** 53 + 1)))

    def test_bad_sizes_name_the_value_and_what_is_allowed(self):
        for text in ('1.5G', 'big', '-1G', '4P', '', '4 G B'):
            exc = self.assertRaises(check.SizeError, check.parse_size, text)
            self.assertEqual(
                '%r is not a size: give a whole number of bytes, optionally '
                'followed by K, M, G or T (powers of 1024), e.g. 512M, 10G '
                'or 1T' % text, str(exc))

    def test_command_line_error(self):
        """argparse prints the message and exits 2, no traceback."""
        parser = argparse.ArgumentParser(prog='prealloc-backend check')
        check.add_arguments(parser)
        stderr = self.useFixture(fixtures.StringStream('stderr'))
        self.useFixture(fixtures.MonkeyPatch('sys.stderr', stderr.stream))
        exc = self.assertRaises(SystemExit, parser.parse_args,
                                ['--disk-size', '1.5G'])
        self.assertEqual(2, exc.code)
        stderr.stream.flush()
        self.assertIn("argument --disk-size: '1.5G' is not a size: give a "
                      "whole number of bytes", stderr.getDetails()[
                          'stderr'].as_text())
        self.assertEqual(
            20 * units.Gi,
            parser.parse_args(['--disk-size', '20G']).disk_size)


def _step_failed(host):
    raise owner.StepFailed('OSError', '[Errno 28] No space left on device',
                           'nova')


def _timed_out(host):
    raise owner.StepTimedOut(
        'Timeout', 'the fallocate(2) probe in /srv/instances, run as nova, '
        'did not end within its deadline of 60 s: it was killed', 'nova')


def _unsafe(host):
    raise owner.UnsafeDirectory('/srv/instances: writable by group staff')


class TestRunChecks(base.BaseTestCase):
    """A check never raises: run_checks turns what a check raised into a
    Failure that says what happened and whom it concerns.
    """

    def run_one(self, func):
        class OneCheck(check.HostChecks):
            _upgrade_checks = (('Probe', check._method(func)),)

        (name, res), = OneCheck(host=None).run_checks()
        self.assertEqual('Probe', name)
        self.assertEqual(upgradecheck.Code.FAILURE, res.code)
        return res

    def test_step_failure_names_who_ran_it(self):
        res = self.run_one(_step_failed)
        self.assertEqual('Not checked: the probe in instances_path, run as '
                         'nova, failed: [Errno 28] No space left on device',
                         res.details)
        self.assertIn('as nova meets the same error', res.fix)

    def test_timed_out_step_is_named(self):
        res = self.run_one(_timed_out)
        self.assertEqual('Not checked: the fallocate(2) probe in '
                         '/srv/instances, run as nova, did not end within '
                         'its deadline of 60 s: it was killed.', res.details)
        self.assertIn('processes of nova', res.fix)

    def test_unsafe_directory(self):
        res = self.run_one(_unsafe)
        self.assertIn('Not checked: /srv/instances: writable by group',
                      res.details)


class TestNovaUserOption(base.BaseTestCase):

    def test_passed_to_the_host(self):
        parser = argparse.ArgumentParser()
        check.add_arguments(parser)
        self.assertIsNone(parser.parse_args([]).nova_user)
        args = parser.parse_args(['--nova-user', 'nova', '--json'])
        hosts = []

        class Host:
            def __init__(self, *args, **kwargs):
                hosts.append(kwargs)

        self.useFixture(fixtures.MockPatch(
            'prealloc_backend.cmd.check.load_config'))
        self.useFixture(fixtures.MockPatchObject(check.check_host, 'Host',
                                                 Host))
        self.useFixture(fixtures.MockPatchObject(
            check.HostChecks, 'run_checks',
            return_value=[('x', check.result.success('ok'))]))
        self.useFixture(fixtures.MockPatchObject(
            check.pb_conf, 'CONF', mock.Mock(config_file=[], config_dir=[])))
        self.useFixture(fixtures.MockPatch('builtins.print'))
        self.assertEqual(0, check.run(args))
        self.assertEqual('nova', hosts[0]['nova_user'])
