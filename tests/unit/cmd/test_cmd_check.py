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
import json
import signal
from unittest import mock

import fixtures
from oslo_upgradecheck import upgradecheck
from oslo_utils import units
from oslotest import base

from prealloc_backend.checks import owner
from prealloc_backend.cmd import check
from prealloc_backend.system import stopping


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
    """A check never raises: HostChecks.run_one turns what a check raised
    into a Failure that says what happened and whom it concerns.
    """

    def run_one(self, func):
        class OneCheck(check.HostChecks):
            _upgrade_checks = (('Probe', check._guarded('Probe', func)),)

        (name, res), = OneCheck(host=None).results()
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


def _ok(host):
    return check.result.success('All good.', free=3)


def _thin(host):
    return check.result.warning(
        'Disks stay thin on this filesystem.',
        'Set [prealloc_backend] fallocate_unsupported = zero-fill, or move '
        'instances_path to ext4 or xfs so that disks are preallocated.')


def _bad(host):
    return check.result.failure('No room.', 'Free space.')


class ThreeChecks(check.HostChecks):
    _upgrade_checks = tuple((name, check._guarded(name, func)) for name, func
                            in (('Fine', _ok), ('Thin', _thin),
                                ('Full', _bad)))


class TestReport(base.BaseTestCase):
    """upgradecheck prints the table and returns the highest Code, the
    exit status; each warning and failure has its Fix line.
    """

    def setUp(self):
        super().setUp()
        self.stdout = self.useFixture(fixtures.StringStream('stdout'))
        self.useFixture(fixtures.MonkeyPatch('sys.stdout',
                                             self.stdout.stream))

    def printed(self):
        self.stdout.stream.flush()
        return self.stdout.getDetails()['stdout'].as_text()

    def test_table(self):
        checked = ThreeChecks(host=None)
        self.assertEqual(2, check.report(checked, as_json=False))
        self.assertEqual(
            '+------------------------------------------------------------+\n'
            '| prealloc_backend host check                                |\n'
            '+------------------------------------------------------------+\n'
            '| Check: Fine                                                |\n'
            '| Result: Success                                            |\n'
            '| Details: All good.                                         |\n'
            '+------------------------------------------------------------+\n'
            '| Check: Thin                                                |\n'
            '| Result: Warning                                            |\n'
            '| Details: Disks stay thin on this filesystem.               |\n'
            '| Fix: Set [prealloc_backend] fallocate_unsupported =        |\n'
            '|   zero-fill, or move instances_path to ext4 or xfs so that |\n'
            '|   disks are preallocated.                                  |\n'
            '+------------------------------------------------------------+\n'
            '| Check: Full                                                |\n'
            '| Result: Failure                                            |\n'
            '| Details: No room.                                          |\n'
            '| Fix: Free space.                                           |\n'
            '+------------------------------------------------------------+\n',
            self.printed())

    def test_exit_status_is_the_highest_code(self):
        by_name = dict(ThreeChecks._upgrade_checks)
        for names, code in ((('Fine',), 0), (('Thin', 'Fine'), 1),
                            (('Full', 'Thin', 'Fine'), 2)):
            class Some(ThreeChecks):
                _upgrade_checks = tuple((name, by_name[name])
                                        for name in names)

            for as_json in (False, True):
                self.assertEqual(code, check.report(Some(host=None),
                                                    as_json=as_json))

    def test_json(self):
        self.assertEqual(2, check.report(ThreeChecks(host=None),
                                         as_json=True))
        out = json.loads(self.printed())
        self.assertEqual({
            'name': 'prealloc_backend host check',
            'checks': [
                {'check': 'Fine', 'result': 0, 'status': 'Success',
                 'details': 'All good.', 'fix': None, 'facts': {'free': 3}},
                {'check': 'Thin', 'result': 1, 'status': 'Warning',
                 'details': 'Disks stay thin on this filesystem.',
                 'fix': _thin(None).fix, 'facts': {}},
                {'check': 'Full', 'result': 2, 'status': 'Failure',
                 'details': 'No room.', 'fix': 'Free space.', 'facts': {}},
            ]}, out)


class Stop(stopping.Stop):
    """A stopping.Stop requested by SIGTERM once ``after`` checks ran."""

    def __init__(self, after):
        super().__init__()
        self.signum = signal.SIGTERM
        self.after = after
        self.ran = 0

    @property
    def requested(self):
        return self.ran >= self.after


class TestStop(base.BaseTestCase):
    """After a stop, the running check is not finished and the later ones
    are not run: Failures, never a Success.
    """

    def test_stopped_while_the_second_check_runs(self):
        stop = Stop(after=2)

        def counted(func):
            def step(host):
                stop.ran += 1
                return func(host)
            return step

        class Counted(check.HostChecks):
            _upgrade_checks = tuple(
                (name, check._guarded(name, counted(func)))
                for name, func in (('Fine', _ok), ('Thin', _thin),
                                   ('Also fine', _ok)))

        results = Counted(host=None, stop=stop).results()
        self.assertEqual(
            [('Fine', 0, 'All good.'),
             ('Thin', 2, 'Not finished: SIGTERM stopped the check.'),
             ('Also fine', 2, 'Not run: SIGTERM stopped the check.')],
            [(name, r.code, r.details) for name, r in results])
        self.assertEqual(2, stop.ran)
        self.assertEqual('Run prealloc-backend check again.',
                         results[2][1].fix)


class TestCommandError(base.BaseTestCase):
    """An error of the command itself (not a check's verdict) exits 255
    with the traceback, as nova-status: not 1, a warning.
    """

    def test_unexpected_error(self):
        parser = argparse.ArgumentParser()
        check.add_arguments(parser)
        self.useFixture(fixtures.MockPatch(
            'prealloc_backend.cmd.check.load_config',
            side_effect=RuntimeError('boom')))
        stdout = self.useFixture(fixtures.StringStream('stdout'))
        self.useFixture(fixtures.MonkeyPatch('sys.stdout', stdout.stream))
        self.assertEqual(255, check.run(parser.parse_args([])))
        stdout.stream.flush()
        text = stdout.getDetails()['stdout'].as_text()
        self.assertTrue(text.startswith('Error:\nTraceback'), text)
        self.assertIn('RuntimeError: boom', text)


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
            check.HostChecks, 'results',
            return_value=[('x', check.result.success('ok'))]))
        self.useFixture(fixtures.MockPatchObject(
            check.pb_conf, 'CONF', mock.Mock(config_file=[], config_dir=[])))
        self.useFixture(fixtures.MockPatch('builtins.print'))
        self.assertEqual(0, check.run(args))
        self.assertEqual('nova', hosts[0]['nova_user'])
