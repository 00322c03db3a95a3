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

"""``prealloc-backend report`` end to end in this process: a real
nova.conf, real disks (qemu-img, fallocate(2)), the file written, then
parsed back with prometheus_client's own parser and compared with the
files (st_blocks, ``qemu-img info``, filefrag).

Replaced, because the unit tier runs no libvirtd: the read-only libvirt
connection (tests/base.py's FakeReadOnlyConnection, answering nova's own
metadata XML); the cloud tier runs the command against real libvirtds.
"""

import io
import os
import stat

import fixtures
from oslo_utils import units
from prometheus_client import parser

from prealloc_backend.checks import capacity
from prealloc_backend.cmd import main as cmd_main
from prealloc_backend.cmd import report
from prealloc_backend.system import fileops
from tests import base
from tests import fixtures as pb_fixtures

GiB = units.Gi
MiB = units.Mi


def parse(text):
    """{metric name: {frozenset(labels): value}} of the text format."""
    found = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[
                frozenset(sample.labels.items())] = sample.value
    return found


def filefrag_unwritten(path):
    size = os.stat(path).st_size
    return sum(max(0, min((start + length) * 4096, size) - start * 4096)
               for start, length, unwritten in pb_fixtures.extents(path)
               if unwritten)


class ReportCase(base.CapacityHostCase):

    def setUp(self):
        super().setUp()
        self.out_dir = os.path.join(self.tmp, 'textfile')
        os.mkdir(self.out_dir, 0o755)
        self.output = os.path.join(self.out_dir, 'prealloc_backend.prom')
        pb_fixtures.write_conf(self.conf_path,
                               self.nova_conf(images_type='qcow2'))
        self.domains = []
        real = capacity.read_guests
        self.useFixture(fixtures.MockPatchObject(
            capacity, 'read_guests',
            side_effect=lambda uri, connect=None: real(
                uri, base.FakeReadOnlyConnection(self.domains))))
        # report's configuration goes into nova's global CONF.
        from oslo_config import fixture as config_fixture

        from prealloc_backend import conf
        self.useFixture(config_fixture.Config(conf.CONF))

    def run_report(self, *extra):
        err = io.StringIO()
        out = io.StringIO()
        self.useFixture(fixtures.MonkeyPatch('sys.stderr', err))
        self.useFixture(fixtures.MonkeyPatch('sys.stdout', out))
        code = cmd_main.main(['report', '--config-file', self.conf_path,
                              '--output', self.output] + list(extra))
        return code, out.getvalue(), err.getvalue()


class TestReport(ReportCase):

    def test_written_file_parses_and_matches_the_files(self):
        space, space_path = self.disk(mode='space')
        full, full_path = self.disk(mode='full', size=32 * MiB)
        local, local_path = self.disk(name='disk.local', mode='space',
                                      fmt='raw', size=16 * MiB, uuid=full)
        self.domains = [
            base.FakeDomain(space, state=capacity.VIR_DOMAIN_PAUSED,
                            reason=capacity.VIR_DOMAIN_PAUSED_IOERROR,
                            flavor=(1, 0, 0, {})),
            base.FakeDomain(full, flavor=(1, 1, 0,
                                          {'prealloc:mode': 'full'}))]
        code, _out, err = self.run_report()
        self.assertEqual(report.OK, code, err)
        with open(self.output) as f:
            text = f.read()
        metrics = parse(text)
        self.assertEqual(0o644, stat.S_IMODE(os.stat(self.output).st_mode))
        self.assertEqual({frozenset({('error', '')}): 1.0},
                         metrics['prealloc_report_success'])

        disks = {(space, 'disk', 'space', 'qcow2'): space_path,
                 (full, 'disk', 'full', 'qcow2'): full_path,
                 (full, 'disk.local', 'full', 'raw'): local_path}
        for (uuid, name, mode, fmt), path in disks.items():
            labels = frozenset({('instance_uuid', uuid), ('disk', name),
                                ('mode', mode), ('format', fmt)})
            info = pb_fixtures.qemu_img_info(path)
            self.assertEqual(info['virtual-size'],
                             metrics['prealloc_disk_virtual_bytes'][labels])
            self.assertEqual(os.stat(path).st_blocks * 512,
                             metrics['prealloc_disk_allocated_bytes'][labels])
            self.assertEqual(filefrag_unwritten(path),
                             metrics['prealloc_disk_unwritten_bytes'][labels])
        # Every disk holds its blocks: at its policy (as adopt's verdict
        # judges it, reserved and written alike; the unwritten bytes above
        # tell them apart).
        self.assertEqual(
            {frozenset({('instance_uuid', space), ('disk', 'disk'),
                        ('mode', 'space'), ('format', 'qcow2')}): 1.0,
             frozenset({('instance_uuid', full), ('disk', 'disk'),
                        ('mode', 'full'), ('format', 'qcow2')}): 1.0,
             frozenset({('instance_uuid', full), ('disk', 'disk.local'),
                        ('mode', 'full'), ('format', 'raw')}): 1.0},
            metrics['prealloc_disk_at_policy'])
        self.assertEqual({frozenset({('instance_uuid', space)}): 1.0,
                          frozenset({('instance_uuid', full)}): 0.0},
                         metrics['prealloc_guest_paused_io_error'])
        path_label = frozenset({('path', self.instances)})
        vfs = os.statvfs(self.instances)
        self.assertEqual(vfs.f_blocks * vfs.f_frsize,
                         metrics['prealloc_fs_size_bytes'][path_label])
        self.assertEqual(pb_fixtures.allocated(self.base),
                         metrics['prealloc_fs_base_images_bytes'][path_label])
        self.assertEqual(
            sum(filefrag_unwritten(p) for p in disks.values()),
            metrics['prealloc_fs_reserved_unwritten_bytes'][path_label])
        self.assertEqual(3, metrics['prealloc_disks'][path_label])
        self.assertEqual(1.0, metrics['prealloc_libvirt_up'][path_label])
        self.assertEqual(
            1.0, metrics['prealloc_placement_allocation_ratio'][path_label])
        # Placement's offer: (total - reserved) less the guests' flavors
        # (1 GiB, then 1 + 1 GiB).
        offered = (metrics['prealloc_placement_total_bytes'][path_label] -
                   metrics['prealloc_placement_reserved_bytes'][path_label]
                   - 3 * GiB)
        self.assertEqual(offered,
                         metrics['prealloc_placement_offered_bytes'][
                             path_label])
        self.assertEqual({frozenset({
            ('path', self.instances), ('mode', 'space'),
            ('format', 'qcow2'), ('reserving', 'true'),
            ('disk_inventory', 'reservable')}): 1.0},
            metrics['prealloc_host_info'])

    def test_stdout(self):
        self.disk()
        code, out, _err = self.run_report('--stdout')
        self.assertEqual(report.OK, code)
        self.assertIn('prealloc_disks{path="%s"} 1.0' % self.instances, out)
        self.assertFalse(os.path.exists(self.output))

    def test_not_measured_still_writes_the_failure(self):
        link = os.path.join(self.tmp, 'link')
        os.symlink(self.instances, link)
        pb_fixtures.write_conf(self.conf_path, pb_fixtures.check_sections(
            self.conf_path, link))
        code, _out, err = self.run_report()
        self.assertEqual(report.NOT_MEASURED, code)
        self.assertIn('symlink', err)
        with open(self.output) as f:
            metrics = parse(f.read())
        (labels, value), = metrics['prealloc_report_success'].items()
        self.assertEqual(0.0, value)
        self.assertIn('symlink', dict(labels)['error'])
        self.assertNotIn('prealloc_disks', metrics)

    def test_libvirt_down_is_partial(self):
        self.disk()

        def refuse(uri, connect=None):
            raise RuntimeError('Failed to connect socket')

        self.useFixture(fixtures.MockPatchObject(capacity, 'read_guests',
                                                 side_effect=refuse))
        code, _out, err = self.run_report()
        self.assertEqual(report.PARTIAL, code)
        self.assertIn('Failed to connect socket', err)
        with open(self.output) as f:
            metrics = parse(f.read())
        self.assertEqual(
            0.0, metrics['prealloc_libvirt_up'][frozenset(
                {('path', self.instances)})])
        self.assertNotIn('prealloc_placement_offered_bytes', metrics)


class TestWrite(ReportCase):

    def test_replaced_whole_flushed_before_the_rename(self):
        with open(self.output, 'w') as f:
            f.write('old\n')
        calls = []
        real_fsync, real_rename = os.fsync, os.rename

        def fsync(fd):
            calls.append(('fsync', os.readlink('/proc/self/fd/%d' % fd)))
            return real_fsync(fd)

        def rename(src, dst, src_dir_fd, dst_dir_fd):
            # Names in the directory written through, never paths.
            self.assertEqual(src_dir_fd, dst_dir_fd)
            where = os.readlink('/proc/self/fd/%d' % src_dir_fd)
            with open(os.path.join(where, src)) as f:
                calls.append(('rename', where, src, dst, f.read()))
            return real_rename(src, dst, src_dir_fd=src_dir_fd,
                               dst_dir_fd=dst_dir_fd)

        self.useFixture(fixtures.MonkeyPatch('os.fsync', fsync))
        self.useFixture(fixtures.MonkeyPatch('os.rename', rename))
        report.write(self.output, b'new 1\n')
        tmp = 'prealloc_backend.prom.%d.tmp' % os.getpid()
        self.assertEqual([('fsync', os.path.join(self.out_dir, tmp)),
                          ('rename', self.out_dir, tmp,
                           'prealloc_backend.prom', 'new 1\n'),
                          ('fsync', self.out_dir)], calls)
        with open(self.output) as f:
            self.assertEqual('new 1\n', f.read())
        self.assertEqual(['prealloc_backend.prom'], os.listdir(self.out_dir))

    def test_failed_write_keeps_the_old_file(self):
        with open(self.output, 'w') as f:
            f.write('old\n')

        def fail(fd):
            raise OSError(5, 'Input/output error')

        self.useFixture(fixtures.MonkeyPatch('os.fsync', fail))
        self.assertRaises(OSError, report.write, self.output, b'new\n')
        with open(self.output) as f:
            self.assertEqual('old\n', f.read())
        self.assertEqual(['prealloc_backend.prom'], os.listdir(self.out_dir))

    def test_refusals(self):
        self.assertIn('only *.prom', report.refusal(self.output + '.txt'))
        self.assertIn('is not a directory', report.refusal(
            os.path.join(self.tmp, 'no', 'x.prom')))
        self.assertIsNone(report.refusal(self.output))
        if os.geteuid() != 0:
            return
        # As root: a directory others may write to is refused.
        shared = os.path.join(self.tmp, 'shared')
        os.mkdir(shared)
        os.chmod(shared, 0o777)
        self.assertIn('may be written by its group or by others',
                      report.refusal(os.path.join(shared, 'x.prom')))
        code, _out, err = self.run_report('--output',
                                          os.path.join(shared, 'x.prom'))
        self.assertEqual(report.ERROR_EXIT, code)
        self.assertIn('refusing to write', err)
        self.assertEqual([], os.listdir(shared))
        # Another user's directory: refused.
        theirs = os.path.join(self.tmp, 'theirs')
        os.mkdir(theirs, 0o755)
        os.chown(theirs, 65534, 65534)
        self.assertIn('is owned by', report.refusal(
            os.path.join(theirs, 'x.prom')))

    def test_root_directory_under_another_users_parent(self):
        # Debian's layout: /var/lib/prometheus is the prometheus user's,
        # its node-exporter directory root's. Root writes there through a
        # descriptor of that directory; a symlink put in its place is
        # refused, and whatever the parent's owner renames, nothing is
        # written anywhere else.
        if os.geteuid() != 0:
            self.skipTest('needs root (a directory of another user)')
        parent = os.path.join(self.tmp, 'prometheus')
        os.mkdir(parent, 0o755)
        os.chown(parent, 65534, 65534)
        textfile = os.path.join(parent, 'node-exporter')
        os.mkdir(textfile, 0o755)
        output = os.path.join(textfile, 'prealloc_backend.prom')
        self.assertIsNone(report.refusal(output))
        report.write(output, b'one\n')
        with open(output) as f:
            self.assertEqual('one\n', f.read())
        # The parent's owner swaps the directory for a symlink elsewhere.
        elsewhere = os.path.join(self.tmp, 'elsewhere')
        os.mkdir(elsewhere, 0o755)
        os.rename(textfile, textfile + '.moved')
        os.symlink(elsewhere, textfile)
        self.assertIn('a symlink on the way', report.refusal(output))
        self.assertRaises(report.UnsafeOutput, report.write, output,
                          b'two\n')
        self.assertEqual([], os.listdir(elsewhere))

    def test_bad_deadline(self):
        code, _out, err = self.run_report('--deadline', '0')
        self.assertEqual(report.ERROR_EXIT, code)
        self.assertIn('--deadline 0', err)

    def test_write_file_is_fileops(self):
        # The durable write is fileops.write_file's (tested in
        # tests/unit/system/test_fileops.py).
        seen = []
        real = fileops.write_file
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_backend.system.fileops.write_file',
            lambda *a, **k: seen.append((a, k)) or real(*a, **k)))
        self.disk()
        code, _out, _err = self.run_report()
        self.assertEqual(report.OK, code)
        # A name in the directory's descriptor.
        (args, kwargs), = seen
        self.assertEqual(('prealloc_backend.prom', ), args[:1])
        self.assertIsInstance(kwargs['dir_fd'], int)


class TestShippedFiles(ReportCase):
    """etc/prometheus's alert rules and etc/systemd's units agree with the
    command.
    """

    TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))

    def exported(self):
        uuid, _path = self.disk()
        self.domains = [base.FakeDomain(uuid, flavor=(1, 0, 0, {}))]
        code, _out, _err = self.run_report()
        self.assertEqual(report.OK, code)
        with open(self.output) as f:
            return set(parse(f.read()))

    def test_alert_rules_use_exported_metrics(self):
        import re

        import yaml

        with open(os.path.join(self.TOP, 'etc', 'prometheus',
                               'prealloc-backend-alerts.yml')) as f:
            rules = yaml.safe_load(f)
        exprs = [rule['expr'] for group in rules['groups']
                 for rule in group['rules']]
        self.assertEqual(5, len(exprs))
        used = set(re.findall(r'\bprealloc_[a-z_]+\b', ' '.join(exprs)))
        self.assertIn('prealloc_guest_paused_io_error', used)
        self.assertEqual(set(), used - self.exported())

    def test_systemd_unit_runs_the_command(self):
        with open(os.path.join(self.TOP, 'etc', 'systemd',
                               'prealloc-backend-report.service')) as f:
            unit = f.read()
        exec_start = [line for line in unit.splitlines()
                      if line.startswith('ExecStart=')]
        self.assertEqual(
            ['ExecStart=/usr/bin/prealloc-backend report --config-file '
             '/etc/nova/nova.conf --output %s' % report.DEFAULT_OUTPUT],
            exec_start)
        self.assertIn('SuccessExitStatus=%d' % report.PARTIAL, unit)
        with open(os.path.join(self.TOP, 'etc', 'systemd',
                               'prealloc-backend-report.timer')) as f:
            self.assertIn('OnUnitInactiveSec=1min', f.read())
