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

"""``prealloc-backend check`` as operators run it: the command line.

Each test writes a real nova.conf into a temporary directory and runs the
real command in a child process (it parses nova's global configuration, as
nova-compute does), then reads its JSON or its table and its exit status.
What each check decides is tested in the test_check_<concern> modules.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

from oslo_utils import units

from prealloc_backend import checks
from prealloc_backend.cmd import check as check_cmd
from prealloc_backend.system import stopping
from tests import base
from tests import fixtures as pb_fixtures

BIN = os.path.dirname(sys.executable)


class CliCase(base.CheckTestCase):

    def setUp(self):
        super().setUp()
        self.sections = self.nova_conf()
        self.qemu_conf = pb_fixtures.write_conf(
            os.path.join(self.tmp, 'qemu.conf'), {})
        # The nova user of a healthy host owns instances_path (the check
        # takes the nova user from it; the daemon refuses a root-owned
        # one). uid 54321 has no account.
        if os.geteuid() == 0:
            os.chown(self.instances, 54321, 54321)

    def run_check(self, *args, as_json=True):
        """(exit status, parsed JSON or stdout text)."""
        env = dict(os.environ)
        env['PATH'] = BIN + os.pathsep + env.get('PATH', '/usr/bin:/bin')
        cmd = [sys.executable, '-m', 'prealloc_backend.cmd.main', 'check']
        cmd += list(args) + (['--json'] if as_json else [])
        if '--timeout' not in args:
            # Judged on what it finds, not on how fast a loaded test
            # machine runs it (TestDeadline has the deadline).
            cmd += ['--timeout', '900']
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              cwd=self.tmp, timeout=280)
        self.assertNotIn('Traceback', proc.stderr)
        self.assertNotIn('Traceback', proc.stdout)
        if not as_json:
            return proc.returncode, proc.stdout
        try:
            out = json.loads(proc.stdout)
        except ValueError:
            self.fail('not JSON: %r (stderr %r)' % (proc.stdout,
                                                    proc.stderr[-2000:]))
        # oslo.upgradecheck: the exit status is the worst result.
        self.assertEqual(proc.returncode,
                         max(c['result'] for c in out['checks']))
        return proc.returncode, out

    @staticmethod
    def checks(out):
        return {c['check']: c for c in out['checks']}


class TestCli(CliCase):

    def test_healthy_host(self):
        # A qemu.conf with libvirt's defaults (the file is empty).
        pb_fixtures.write_conf(self.conf_path, self.sections)
        # 64 MiB: the verdict must not depend on how full the machine's
        # temporary filesystem is.
        rc, out = self.run_check('--config-file', self.conf_path,
                                 '--disk-size', '64M',
                                 '--qemu-conf', self.qemu_conf)
        self.assertEqual([name for name, _f in checks.CHECKS],
                         [c['check'] for c in out['checks']])
        by_name = self.checks(out)
        self.assertEqual([self.conf_path],
                         by_name['Configuration']['facts']['config_files'])
        for name, res in by_name.items():
            self.assertEqual(0, res['result'], res)
            self.assertIsNone(res['fix'])
        self.assertEqual(0, rc)
        self.assertEqual(64 * units.Mi,
                         by_name['Free space']['facts']['disk_bytes'])
        self.assertEqual(self.qemu_conf, by_name['libvirt disk ownership']
                         ['facts']['qemu_conf'])
        # Nothing left behind by the probes.
        self.assertEqual([], os.listdir(self.instances))

    def test_bad_option_values(self):
        # The bad mode in a --config-dir file, as a deployment's
        # nova.conf.d would hold it: the check reads the directory and
        # names the file.
        self.sections['DEFAULT']['preallocate_images'] = 'always'
        # Not what this test is about: spare it the helper's import run.
        self.sections['prealloc_backend_privsep']['helper_command'] = (
            'true --config-file %s' % self.conf_path)
        pb_fixtures.write_conf(self.conf_path, self.sections)
        conf_dir = os.path.join(self.tmp, 'nova.conf.d')
        os.mkdir(conf_dir)
        prealloc_conf = pb_fixtures.write_conf(
            os.path.join(conf_dir, '50-prealloc.conf'),
            {'prealloc_backend': {'mode': 'bogus'}})
        rc, out = self.run_check('--config-file', self.conf_path,
                                 '--config-dir', conf_dir,
                                 '--qemu-conf', self.qemu_conf)
        self.assertEqual(2, rc)
        by_name = self.checks(out)
        config = by_name['Configuration']
        self.assertEqual(2, config['result'])
        self.assertIn("[prealloc_backend] mode = 'bogus' (in %s) is not "
                      "valid" % prealloc_conf, config['details'])
        self.assertEqual(2, config['facts']['invalid'])
        # A check that needs the mode says so instead of guessing.
        mode = by_name['Effective mode']
        self.assertEqual(2, mode['result'])
        self.assertIn('it needs [prealloc_backend] mode, whose value is '
                      'invalid', mode['details'])
        self.assertEqual('See the Configuration check.', mode['fix'])

        # The table for people: the same sentence, no traceback.
        rc, text = self.run_check('--config-file', self.conf_path,
                                  '--config-dir', conf_dir,
                                  '--qemu-conf', self.qemu_conf,
                                  as_json=False)
        self.assertEqual(2, rc)
        flat = re.sub(r'[\s|]+', ' ', text)
        self.assertIn("[prealloc_backend] mode = 'bogus'", flat)
        self.assertIn('allowed values are none, metadata, space, full', flat)
        self.assertIn('Check: libvirt disk ownership', flat)
        # oslo.upgradecheck's row, with the fix on a line of its own.
        self.assertIn('| Check: Effective mode', text)
        self.assertRegex(text, r'\| Result: Failure +\|\n\| Details: Not '
                               r'checked: it needs \[prealloc_backend\] mode,')
        self.assertRegex(text, r'\n\| Fix: See the Configuration check\. +\|')

    def test_missing_config_file(self):
        missing = os.path.join(self.tmp, 'missing.conf')
        rc, out = self.run_check('--config-file', missing)
        self.assertEqual(2, rc)
        self.assertEqual(['Configuration'],
                         [c['check'] for c in out['checks']])
        self.assertIn(missing, out['checks'][0]['details'])
        self.assertIn('--config-file', out['checks'][0]['fix'])
        self.assertEqual([missing],
                         out['checks'][0]['facts']['config_files'])

    def test_warning(self):
        # A TRIM undoes mode space's reservation: spawns work, not as
        # nova.conf asks. A warning is exit status 1, table and JSON.
        self.sections['libvirt'] = {'hw_disk_discard': 'unmap'}
        self.sections['prealloc_backend']['guest_discard'] = 'reclaim'
        pb_fixtures.write_conf(self.conf_path, self.sections)
        args = ('--config-file', self.conf_path, '--disk-size', '64M',
                '--qemu-conf', self.qemu_conf)
        rc, out = self.run_check(*args)
        self.assertEqual(1, rc)
        self.assertEqual(['Guest discard'],
                         [c['check'] for c in out['checks'] if c['result']])
        discard = self.checks(out)['Guest discard']
        self.assertEqual('Warning', discard['status'])
        self.assertIn('guest_discard = keep', discard['fix'])
        rc, text = self.run_check(*args, as_json=False)
        self.assertEqual(1, rc)
        self.assertIn('| Check: Guest discard', text)
        self.assertRegex(text, r'\| Check: Guest discard +\|\n'
                               r'\| Result: Warning +\|\n')
        self.assertIn('| Fix: Set [prealloc_backend] guest_discard = keep',
                      text)


class TestStop(CliCase):
    """One SIGINT or SIGTERM stops check (issue 36): the check it was
    running and the ones after it are Failures, never a Success, within
    seconds, and no process it started is left.
    """

    def _stopped_at(self, point, signum):
        pb_fixtures.write_conf(self.conf_path, self.sections)
        env = dict(os.environ)
        env['PATH'] = BIN + os.pathsep + env.get('PATH', '/usr/bin:/bin')
        env[stopping.PAUSE_ENV] = point
        proc = subprocess.Popen(
            [sys.executable, '-m', 'prealloc_backend.cmd.main', 'check',
             '--config-file', self.conf_path, '--disk-size', '64M',
             '--qemu-conf', self.qemu_conf, '--json'],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env, cwd=self.tmp, start_new_session=True)
        self.addCleanup(self._kill_group, proc.pid)
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if 'stopping: paused at %s' % point in line:
                break
        else:
            self.fail('check never paused at %s: %s' % (point, seen))
        sent = time.monotonic()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
        self.assertLess(took, 20, 'check ran %.1f s after %s' % (
            took, signum))
        self.assertNotIn('Traceback', ''.join(seen) + err)
        self.assertEqual(2, proc.returncode, err[-2000:])
        return json.loads(out)

    @staticmethod
    def _kill_group(pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def test_between_checks(self):
        names = [name for name, _f in checks.CHECKS]
        stopped_at = names[3]
        for signum, word in ((signal.SIGTERM, 'SIGTERM'),
                             (signal.SIGINT, 'SIGINT')):
            out = self._stopped_at('check ' + stopped_at, signum)
            got = [c['check'] for c in out['checks']]
            self.assertEqual(names, got)
            for res in out['checks'][3:]:
                self.assertEqual(2, res['result'], res)
                self.assertIn(word, res['details'])
            self.assertIn('Not finished', out['checks'][3]['details'])
            self.assertIn('Not run', out['checks'][4]['details'])

    def test_while_a_probe_runs(self):
        # after-fork: check paused in the parent right after it forked a
        # probe's child (process.call_in_child): the signal's watcher
        # kills that child, the check is not finished, none after it run.
        out = self._stopped_at('after-fork', signal.SIGTERM)
        details = [c['details'] for c in out['checks']]
        self.assertTrue(any('Not finished' in d for d in details), details)
        first = next(i for i, d in enumerate(details) if 'Not finished' in d)
        for res in out['checks'][first:]:
            self.assertEqual(2, res['result'], res)
        self.assertEqual([], [c for c in out['checks'][first + 1:]
                              if 'Not run' not in c['details']])


# The check with its second check blocked in the main thread for an hour
# (a system call that does not end when the check's children are killed).
# Its deadline is counted from its main() (seconds_since_start 0), whose
# time it prints first: the imports before it take seconds, or more on a
# loaded test machine.
HANGING_CHECK = r'''
import sys, time
from prealloc_backend.cmd import check, main
from prealloc_backend.system import stopping
stopping.seconds_since_start = lambda: 0
def hang(host):
    time.sleep(3600)
rows = list(check.HostChecks._upgrade_checks)
rows[1] = (rows[1][0], check._guarded(rows[1][0], hang))
check.HostChecks._upgrade_checks = tuple(rows)
sys.stderr.write('main at %r\n' % time.monotonic())
sys.stderr.flush()
sys.exit(main.main(sys.argv[1:]))
'''


class TestDeadline(CliCase):
    """The whole command ends by its --timeout whatever its checks do:
    here one never comes back, and the backstop prints the report of what
    finished (issue 43, finding 5).
    """

    TIMEOUT = 8

    def test_a_check_that_never_returns(self):
        pb_fixtures.write_conf(self.conf_path, self.sections)
        env = dict(os.environ)
        env['PATH'] = BIN + os.pathsep + env.get('PATH', '/usr/bin:/bin')
        proc = subprocess.run(
            [sys.executable, '-c', HANGING_CHECK, 'check', '--config-file',
             self.conf_path, '--disk-size', '64M', '--qemu-conf',
             self.qemu_conf, '--json', '--timeout', str(self.TIMEOUT)],
            capture_output=True, text=True, env=env, cwd=self.tmp,
            timeout=120)
        ended = time.monotonic()
        self.assertEqual(2, proc.returncode, proc.stderr[-2000:])
        started = float(re.search(r'main at ([0-9.]+)',
                                  proc.stderr).group(1))
        # Ended by its deadline, not long before (the backstop prints a
        # second ahead of it).
        self.assertLess(ended - started, self.TIMEOUT + 0.5)
        self.assertGreater(ended - started,
                           self.TIMEOUT - check_cmd.BACKSTOP_AHEAD - 0.5)
        out = json.loads(proc.stdout)
        names = [name for name, _f in checks.CHECKS]
        self.assertEqual(names, [c['check'] for c in out['checks']])
        self.assertEqual(0, out['checks'][0]['result'], out['checks'][0])
        hung = out['checks'][1]
        self.assertEqual(2, hung['result'])
        self.assertEqual('Not finished: the command reached its deadline of '
                         '%d s (--timeout) with this check unfinished; the '
                         'processes it ran were killed.' % self.TIMEOUT,
                         hung['details'])
        for res in out['checks'][2:]:
            self.assertEqual('Not run: the command reached its deadline of '
                             '%d s (--timeout) before it.' % self.TIMEOUT,
                             res['details'])
