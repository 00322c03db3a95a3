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

"""``prealloc-backend check`` run against real configurations.

Each test writes a real nova.conf into a temporary directory and runs the
real command in a child process (it parses nova's global configuration, as
nova-compute does, so it cannot share a test process), then reads its JSON
and exit status. The filesystems are real: the test process's temporary
directory, or loop-mounted ext4 (without extents; filled up) as root.
"""

import errno
import json
import os
import re
import shutil
import subprocess
import sys

import fixtures
from oslo_utils import units
from oslotest import base

from prealloc_backend.cmd import check
from tests import fixtures as pb_fixtures

BIN = os.path.dirname(sys.executable)
PRIVSEP_HELPER = os.path.join(BIN, 'privsep-helper')


def write_conf(path, sections):
    """Write an ini file from {section: {option: value}}."""
    with open(path, 'w') as f:
        for section, options in sections.items():
            f.write('[%s]\n' % section)
            for name, value in options.items():
                f.write('%s = %s\n' % (name, value))
            f.write('\n')
    return path


def findmnt_fstype(path):
    return subprocess.run(['findmnt', '-n', '-o', 'FSTYPE', '-T', path],
                          check=True, capture_output=True,
                          text=True).stdout.strip()


def fill_up(directory):
    """Write a file until the filesystem refuses more (ENOSPC)."""
    chunk = b'\xa5' * units.Mi
    # Unbuffered: a buffered file would fail again when closed.
    with open(os.path.join(directory, 'filler'), 'wb', buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise


class CheckTestCase(base.BaseTestCase):

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path

    def healthy_sections(self, conf_path, instances_path, **prealloc):
        sections = {
            'DEFAULT': {
                'compute_driver': 'prealloc_backend.LibvirtDriver',
                'preallocate_images': 'space',
                'instances_path': instances_path,
            },
            'prealloc_backend': prealloc,
            'prealloc_backend_privsep': {
                'helper_command': '%s --config-file %s' % (PRIVSEP_HELPER,
                                                           conf_path),
            },
        }
        return sections

    def write_healthy(self, instances_path, name='nova.conf', **prealloc):
        path = os.path.join(self.tmp, name)
        return write_conf(path, self.healthy_sections(path, instances_path,
                                                      **prealloc))

    def run_check(self, *args, as_json=True):
        """(exit status, parsed JSON or stdout text, stderr)."""
        env = dict(os.environ)
        env['PATH'] = BIN + os.pathsep + env.get('PATH', '/usr/bin:/bin')
        cmd = [sys.executable, '-m', 'prealloc_backend.cmd.main', 'check']
        cmd += list(args) + (['--json'] if as_json else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              cwd=self.tmp, timeout=240)
        self.assertNotIn('Traceback', proc.stderr)
        self.assertNotIn('Traceback', proc.stdout)
        out = proc.stdout
        if as_json:
            try:
                out = json.loads(proc.stdout)
            except ValueError:
                self.fail('not JSON: %r (stderr %r)' % (proc.stdout,
                                                        proc.stderr[-2000:]))
            self.assertEqual(proc.returncode, out['result'])
            self.assertEqual(
                proc.returncode, max(c['result'] for c in out['checks']))
        return proc.returncode, out, proc.stderr

    @staticmethod
    def checks(out):
        return {c['check']: c for c in out['checks']}

    def assert_codes(self, out, expected):
        got = {name: c['result'] for name, c in self.checks(out).items()}
        self.assertEqual(expected, {k: got[k] for k in expected},
                         json.dumps(out, indent=1))


class TestHealthyHost(CheckTestCase):

    def test_healthy_temp_dir(self):
        instances = os.path.join(self.tmp, 'instances')
        os.mkdir(instances)
        conf_path = self.write_healthy(instances)
        # 64 MiB: the free-space verdict must not depend on how full the
        # machine's temporary filesystem is (the full case has its test).
        rc, out, _err = self.run_check('--config-file', conf_path,
                                       '--disk-size', '64M')
        self.assertEqual(0, rc, json.dumps(out, indent=1))
        for result in out['checks']:
            self.assertEqual(0, result['result'], result)
            self.assertIsNone(result['fix'])
        self.assertEqual([conf_path], out['config_files'])
        checks = self.checks(out)

        mode = checks['Effective mode']['facts']
        self.assertEqual('space', mode['mode'])
        self.assertEqual('[DEFAULT] preallocate_images = space',
                         mode['source'])
        self.assertEqual('qcow2', mode['disk_format'])
        self.assertEqual('falloc', mode['preallocation'])

        driver = checks['Compute driver']['facts']
        self.assertEqual('prealloc_backend.driver.LibvirtDriver',
                         driver['driver_class'])
        self.assertEqual(os.path.join(BIN, 'prealloc-nova-compute'),
                         driver['wrapper'])

        # The facts are the filesystem's, read independently here.
        fs = checks['Instances filesystem']['facts']
        self.assertEqual(findmnt_fstype(instances), fs['fs_type'])
        self.assertTrue(fs['fallocate'])
        probe = os.path.join(self.tmp, 'probe')
        subprocess.run(['fallocate', '-l', '64K', probe], check=True)
        self.assertGreaterEqual(os.stat(probe).st_blocks * 512, 64 * units.Ki)
        # (free_bytes is compared with statvfs on a filesystem of the
        # test's own below: others write to this one meanwhile.)
        space = checks['Free space']['facts']
        self.assertGreaterEqual(space['free_bytes'], space['needed_bytes'])
        self.assertEqual(64 * units.Mi, space['disk_bytes'])
        # falloc: the whole disk plus metadata, as qemu-img measures it.
        measured = json.loads(subprocess.run(
            ['qemu-img', 'measure', '--output=json', '-O', 'qcow2', '-o',
             'cluster_size=131072,extended_l2=on,preallocation=falloc',
             '--size', str(64 * units.Mi)], check=True, capture_output=True,
            text=True).stdout)
        self.assertEqual(measured['fully-allocated'], space['needed_bytes'])
        self.assertGreater(space['needed_bytes'], 64 * units.Mi)

        qemu = checks['qemu-img']['facts']
        version = subprocess.run(['qemu-img', '--version'], check=True,
                                 capture_output=True, text=True).stdout
        self.assertIn(qemu['version'], version)
        self.assertEqual('falloc', qemu['preallocation'])
        self.assertTrue(qemu['extended_l2'])
        self.assertGreaterEqual(qemu['allocated_bytes'],
                                check.PROBE_OVERLAY_BYTES)
        self.assertGreaterEqual(qemu['grown_allocated_bytes'],
                                check.PROBE_GROWN_BYTES)

        privsep = checks['Privsep daemon']['facts']
        self.assertEqual('helper_command', privsep['method'])
        self.assertEqual(instances, privsep['helper_instances_path'])
        self.assertEqual(PRIVSEP_HELPER, privsep['privsep_helper'])

        # Nothing left behind by the probes.
        self.assertEqual([], os.listdir(instances))


class TestFilesystems(CheckTestCase):

    def loop_instances(self, kind, size_mb):
        pb_fixtures.skip_unless_root(self)
        fs = self.useFixture(pb_fixtures.LoopFilesystem(kind, size_mb))
        instances = os.path.join(fs.path, 'instances')
        os.mkdir(instances)
        return instances

    def test_ext4_without_extents(self):
        instances = self.loop_instances('ext4-noextents', 64)
        vfs = os.statvfs(instances)
        free_before = vfs.f_bavail * vfs.f_frsize

        # warn (the default): spawns work, disks are not what space means.
        conf_path = self.write_healthy(instances, name='warn.conf')
        rc, out, _err = self.run_check('--config-file', conf_path,
                                       '--disk-size', '4M')
        self.assertEqual(1, rc, json.dumps(out, indent=1))
        self.assert_codes(out, {'Instances filesystem': 1, 'Free space': 0,
                                'qemu-img': 0, 'Privsep daemon': 0})
        fs = self.checks(out)['Instances filesystem']
        self.assertEqual('ext4', fs['facts']['fs_type'])
        self.assertFalse(fs['facts']['fallocate'])
        self.assertIn('NOT supported', fs['details'])
        self.assertIn('fallocate_unsupported = zero-fill', fs['fix'])
        # Measured before the qemu-img check writes its overlay; nothing
        # else writes to this filesystem (a directory block at most).
        self.assertAlmostEqual(free_before, fs['facts']['free_bytes'],
                               delta=64 * units.Ki)
        # What the backend would do there: metadata instead of falloc.
        qemu = self.checks(out)['qemu-img']['facts']
        self.assertEqual('metadata', qemu['preallocation'])
        # The kernel agrees with the probe.
        proc = subprocess.run(['fallocate', '-l', '64K',
                               os.path.join(instances, 'x')],
                              capture_output=True, text=True)
        self.assertNotEqual(0, proc.returncode)
        self.assertIn('not supported', proc.stderr)
        os.unlink(os.path.join(instances, 'x'))

        # fail: every spawn in mode space fails; the fix says how out.
        conf_path = self.write_healthy(instances, name='fail.conf',
                                       fallocate_unsupported='fail')
        rc, out, _err = self.run_check('--config-file', conf_path,
                                       '--disk-size', '4M')
        self.assertEqual(2, rc)
        self.assert_codes(out, {'Instances filesystem': 2})
        fs = self.checks(out)['Instances filesystem']
        self.assertIn('every spawn fails', fs['details'])
        self.assertIn('fallocate_unsupported = zero-fill', fs['fix'])
        self.assertIn('xfs', fs['fix'])
        self.assertEqual([], os.listdir(instances))

    def test_full_filesystem(self):
        instances = self.loop_instances('ext4', 16)
        fill_up(instances)
        vfs = os.statvfs(instances)
        self.assertLess(vfs.f_bavail * vfs.f_frsize, check.MIN_FREE_BYTES)
        conf_path = self.write_healthy(instances, mode='none')
        rc, out, _err = self.run_check('--config-file', conf_path)
        self.assertEqual(2, rc)
        self.assert_codes(out, {'Free space': 2, 'qemu-img': 1,
                                'Instances filesystem': 0})
        space = self.checks(out)['Free space']
        self.assertAlmostEqual(vfs.f_bavail * vfs.f_frsize,
                               space['facts']['free_bytes'],
                               delta=64 * units.Ki)
        self.assertLess(space['facts']['free_bytes'],
                        space['facts']['needed_bytes'])
        self.assertIn('Not enough space to preallocate disk',
                      space['details'])
        self.assertIn('Free space on that filesystem', space['fix'])
        self.assertEqual(['filler'], os.listdir(instances))


class TestBadConfigurations(CheckTestCase):

    def test_bad_option_values(self):
        instances = os.path.join(self.tmp, 'instances')
        os.mkdir(instances)
        conf_path = os.path.join(self.tmp, 'nova.conf')
        sections = self.healthy_sections(conf_path, instances, mode='bogus')
        sections['DEFAULT']['preallocate_images'] = 'always'
        write_conf(conf_path, sections)

        rc, out, _err = self.run_check('--config-file', conf_path)
        self.assertEqual(2, rc)
        config = self.checks(out)['Configuration']
        self.assertEqual(2, config['result'])
        self.assertIn("[prealloc_backend] mode = 'bogus' (in %s) is not "
                      "valid: allowed values are none, metadata, space, full"
                      % conf_path, config['details'])
        self.assertIn("[DEFAULT] preallocate_images = 'always' (in %s) is "
                      "not valid: allowed values are none, space"
                      % conf_path, config['details'])
        self.assertEqual(2, config['facts']['invalid'])
        mode = self.checks(out)['Effective mode']
        self.assertEqual(2, mode['result'])
        self.assertIn('whose value is invalid', mode['details'])

        # The table for people: the same sentence, no traceback.
        rc, text, _err = self.run_check('--config-file', conf_path,
                                        as_json=False)
        self.assertEqual(2, rc)
        flat = re.sub(r'[\s|]+', ' ', text)
        self.assertIn("[prealloc_backend] mode = 'bogus'", flat)
        self.assertIn('allowed values are none, metadata, space, full', flat)
        self.assertIn('Overall: Failure (exit status 2)', text)

    def test_misconfigured_host(self):
        instances = os.path.join(self.tmp, 'instances')
        os.mkdir(instances)
        conf_path = os.path.join(self.tmp, 'nova.conf')
        sections = self.healthy_sections(conf_path, instances,
                                         qcow2_extended_l2='false')
        # The natural guess, which nova cannot import.
        sections['DEFAULT']['compute_driver'] = (
            'prealloc_backend.driver.LibvirtDriver')
        # The daemon would not read nova.conf.
        sections['prealloc_backend_privsep']['helper_command'] = (
            PRIVSEP_HELPER)
        write_conf(conf_path, sections)
        rc, out, _err = self.run_check('--config-file', conf_path,
                                       '--disk-size', '4M')
        self.assertEqual(2, rc)
        self.assert_codes(out, {'Configuration': 0, 'Effective mode': 2,
                                'Compute driver': 2, 'Privsep daemon': 2})
        checks = self.checks(out)
        self.assertIn('qcow2_extended_l2', checks['Effective mode']['details'])
        self.assertIn('compute_driver = prealloc_backend.LibvirtDriver',
                      checks['Compute driver']['fix'])
        self.assertIn('prealloc-nova-compute', checks['Compute driver']['fix'])
        privsep = checks['Privsep daemon']
        self.assertIn('not %s' % instances, privsep['details'])
        self.assertIn('--config-file', privsep['fix'])
        self.assertEqual([], privsep['facts']['helper_config_files'])

    def test_missing_config_file(self):
        missing = os.path.join(self.tmp, 'missing.conf')
        rc, out, _err = self.run_check('--config-file', missing)
        self.assertEqual(2, rc)
        self.assertEqual(['Configuration'],
                         [c['check'] for c in out['checks']])
        self.assertIn(missing, out['checks'][0]['details'])
        self.assertIn('--config-file', out['checks'][0]['fix'])


class TestRootwrap(CheckTestCase):

    def test_root_helper_command_line_checked_against_filters(self):
        instances = os.path.join(self.tmp, 'instances')
        os.mkdir(instances)
        filters_dir = os.path.join(self.tmp, 'rootwrap.d')
        os.mkdir(filters_dir)
        shutil.copy(os.path.join(os.path.dirname(__file__), '..', '..',
                                 'etc', 'rootwrap.d',
                                 'prealloc_backend.filters'), filters_dir)
        rootwrap_conf = write_conf(
            os.path.join(self.tmp, 'rootwrap.conf'),
            {'DEFAULT': {'filters_path': filters_dir, 'exec_dirs': BIN}})
        conf_path = os.path.join(self.tmp, 'nova.conf')
        sections = self.healthy_sections(conf_path, instances, mode='none')
        del sections['prealloc_backend_privsep']
        sections['DEFAULT']['rootwrap_config'] = rootwrap_conf
        write_conf(conf_path, sections)

        rc, out, _err = self.run_check('--config-file', conf_path,
                                       '--disk-size', '4M')
        privsep = self.checks(out)['Privsep daemon']
        facts = privsep['facts']
        self.assertEqual('root_helper', facts['method'])
        # Exactly what oslo.privsep runs for nova-compute.
        self.assertEqual(
            ['sudo', 'nova-rootwrap', rootwrap_conf, 'privsep-helper',
             '--config-file', conf_path,
             '--privsep_context', 'prealloc_backend.privsep.ctx',
             '--privsep_sock_path'], facts['command'][:-1])
        self.assertEqual([os.path.join(filters_dir,
                                       'prealloc_backend.filters')],
                         facts['filter_files'])
        # The plugin's filter only allows configuration files under /etc:
        # oslo.rootwrap's own privsep-helper rule lets this one through.
        self.assertEqual('privsep-helper', facts['filter'])
        self.assertEqual(PRIVSEP_HELPER, facts['privsep_helper'])
        if shutil.which('sudo'):
            self.assertEqual(0, privsep['result'], privsep)
        else:
            # Mode none: only flavors asking for space or full would fail.
            self.assertEqual(1, privsep['result'])
            self.assertIn('sudo is not installed', privsep['details'])
            self.assertIn('helper_command', privsep['fix'])
        self.assertEqual(privsep['result'], rc)


class TestParseSize(base.BaseTestCase):

    def test_sizes(self):
        self.assertEqual(4 * units.Mi, check.parse_size('4M'))
        self.assertEqual(20 * units.Gi, check.parse_size('20G'))
        self.assertEqual(20 * units.Gi, check.parse_size('20GiB'))
        self.assertEqual(units.Ti, check.parse_size('1t'))
        self.assertEqual(512, check.parse_size('512'))
        self.assertRaises(ValueError, check.parse_size, '1.5G')
        self.assertRaises(ValueError, check.parse_size, 'big')
