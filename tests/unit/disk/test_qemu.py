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

"""prealloc_backend.disk.qemu: one wrapper per qemu-img verb, on real files
with the real qemu-img.
"""

import json
import os
import shutil
import subprocess

import fixtures
from oslo_utils import units

from prealloc_backend.disk import qemu
from prealloc_backend import exception
from prealloc_backend.planner import qcow2_layout
from tests import base
from tests import fixtures as pb_fixtures

Prealloc = qcow2_layout.Qcow2Preallocation


class _Layout:
    """The three DiskPlan fields convert and create_overlay read."""

    def __init__(self, cluster_size=64 * units.Ki, extended_l2=True,
                 preallocation=Prealloc.METADATA):
        self.cluster_size = cluster_size
        self.extended_l2 = extended_l2
        self.preallocation = preallocation


class TestInfo(base.TestCase):

    def test_needs_raw_or_qcow2(self):
        path = os.path.join(self.instances_path, 'disk')
        open(path, 'wb').close()
        for fmt in (None, 'vmdk', 'qcow2,raw'):
            exc = self.assertRaises(exception.QemuImgError, qemu.info, path,
                                    fmt)
            self.assertIn(repr(fmt), str(exc))

    def test_reads_with_the_format_given(self):
        path = os.path.join(self.instances_path, 'disk')
        with open(path, 'wb') as f:
            f.truncate(units.Mi)
        data = qemu.info(path, 'raw')
        self.assertEqual(('raw', units.Mi, None),
                         (data.format, data.virtual_size, data.cluster_size))


class TestImageInfo(base.TestCase):
    """ImageInfo: qemu-img info's answer read once, typed and checked; the
    same facts from a qcow2 header's first bytes.
    """

    def _qcow2(self, name, *opts, backing=None, size=units.Mi):
        path = os.path.join(self.instances_path, name)
        cmd = ['qemu-img', 'create', '-q', '-f', 'qcow2']
        if backing:
            cmd += ['-F', 'raw', '-b', backing]
        for opt in opts:
            cmd += ['-o', opt]
        subprocess.run(cmd + [path, str(size)], check=True)
        return path

    def _answer(self, **fields):
        data = {'format': 'qcow2', 'virtual-size': units.Mi,
                'cluster-size': 65536}
        data.update(fields)
        return json.dumps({k: v for k, v in data.items() if v is not None})

    def test_an_overlay_read_by_qemu_img_and_by_its_header(self):
        backing = os.path.join(self.instances_path, 'base')
        with open(backing, 'wb') as f:
            f.truncate(units.Mi)
        path = self._qcow2('disk', 'extended_l2=on', 'cluster_size=128k',
                           backing=backing, size=4 * units.Mi)
        read = qemu.info(path, 'qcow2')
        self.assertEqual(
            qemu.ImageInfo(format='qcow2', virtual_size=4 * units.Mi,
                           cluster_size=128 * units.Ki, extended_l2=True,
                           has_backing=True, backing_file=backing,
                           backing_format='raw',
                           full_backing_filename=backing),
            read)
        # The header gives the same layout, the name where it reaches it.
        with open(path, 'rb') as f:
            head = f.read(units.Ki)
        header = qemu.ImageInfo.from_header(head)
        self.assertEqual(
            (read.virtual_size, read.cluster_size, read.extended_l2,
             read.has_backing, read.backing_file),
            (header.virtual_size, header.cluster_size, header.extended_l2,
             header.has_backing, header.backing_file))
        short = qemu.ImageInfo.from_header(head[:qemu.HEADER])
        self.assertEqual((True, None),
                         (short.has_backing, short.backing_file))
        self.assertEqual(short, qemu.header_info(path))
        self.assertEqual(read.existing(5), header.existing(5))
        self.assertIsNone(read.refusal())
        self.assertFalse(read.standalone)

    def test_version_2_and_no_extended_l2(self):
        path = self._qcow2('disk', 'compat=0.10')
        read = qemu.info(path, 'qcow2')
        self.assertEqual((units.Mi, 65536, False, False, True),
                         (read.virtual_size, read.cluster_size,
                          read.extended_l2, read.has_backing,
                          read.standalone))
        self.assertEqual(read, qemu.header_info(path))

    def test_a_data_file_is_read_and_refused(self):
        data_file = os.path.join(self.instances_path, 'data')
        path = self._qcow2('disk', 'data_file=%s' % data_file)
        read = qemu.info(path, 'qcow2')
        self.assertEqual(data_file, read.data_file)
        self.assertFalse(read.standalone)
        self.assertIn(repr(data_file), read.refusal())

    def test_a_protocol_name_is_refused(self):
        for fields in ({'backing-filename': 'nbd:host:1'},
                       {'backing-filename': 'base',
                        'full-backing-filename': 'json:{}'}):
            read = qemu.ImageInfo.from_json(self._answer(**fields))
            self.assertIn('not a plain file name', read.refusal())

    def test_not_a_qcow2_header(self):
        path = self._qcow2('disk')
        with open(path, 'rb') as f:
            head = bytearray(f.read(qemu.HEADER))
        self.assertIsNotNone(qemu.ImageInfo.from_header(bytes(head)))
        self.assertIsNone(qemu.ImageInfo.from_header(bytes(head[:71])))
        self.assertIsNone(qemu.ImageInfo.from_header(b'\0' * qemu.HEADER))
        for bits in (8, 22):
            head[20:24] = bits.to_bytes(4, 'big')
            self.assertIsNone(qemu.ImageInfo.from_header(bytes(head)))

    def test_a_malformed_answer_is_refused_naming_the_field(self):
        for fields, named in (
                ({'cluster-size': None}, 'cluster-size'),
                ({'cluster-size': 65535}, 'cluster-size'),
                ({'cluster-size': 256}, 'cluster-size'),
                ({'cluster-size': True}, 'cluster-size'),
                ({'backing-filename': 7}, 'backing-filename'),
                ({'backing-filename-format': []},
                 'backing-filename-format'),
                ({'format-specific': 'x'}, 'format-specific'),
                ({'format-specific': {'data': {'extended-l2': 'yes'}}},
                 'extended-l2'),
                ({'format-specific': {'data': {'data-file': 1}}},
                 'data-file')):
            exc = self.assertRaises(exception.QemuImgOutputError,
                                    qemu.ImageInfo.from_json,
                                    self._answer(**fields), 'qemu-img info x')
            self.assertIn(repr(named), str(exc))
            self.assertIn('qemu-img info x', str(exc))
        # A raw image has no clusters.
        raw = qemu.ImageInfo.from_json(self._answer(
            **{'format': 'raw', 'cluster-size': None}))
        self.assertEqual((None, True), (raw.cluster_size, raw.standalone))


def recording_qemu_img(test):
    """A 'qemu-img' first on PATH that records its arguments, one per line,
    and runs the real one: the command line as qemu-img received it.
    Returns the file the arguments are written to.
    """
    bindir = test.useFixture(fixtures.TempDir()).path
    log = os.path.join(bindir, 'argv')
    with open(os.path.join(bindir, 'qemu-img'), 'w') as f:
        f.write('#!/bin/sh\nprintf "%%s\\n" "$@" > %s\nexec %s "$@"\n'
                % (log, shutil.which('qemu-img')))
    os.chmod(os.path.join(bindir, 'qemu-img'), 0o755)
    test.useFixture(fixtures.EnvironmentVariable(
        'PATH', bindir + os.pathsep + os.environ['PATH']))
    return log


class TestConvert(base.TestCase):

    def setUp(self):
        super().setUp()
        self.src = os.path.join(self.instances_path, 'src')
        pb_fixtures.write_pattern(self.src, 4 * units.Mi, seed=3)
        self.dst = os.path.join(self.instances_path, 'dst')

    def test_standalone_with_the_layout(self):
        qemu.convert(self.src, 'raw', self.dst,
                     _Layout(cluster_size=128 * units.Ki, extended_l2=True,
                             preallocation=Prealloc.METADATA),
                     'none')
        info = pb_fixtures.qemu_img_info(self.dst)
        self.assertEqual('qcow2', info['format'])
        self.assertEqual(128 * units.Ki, info['cluster-size'])
        self.assertTrue(info['format-specific']['data']['extended-l2'])
        self.assertNotIn('backing-filename', info)
        self.assertEqual(0, pb_fixtures.qemu_img_compare(self.src,
                                                         self.dst)[0])

    def test_every_argument_passed_through(self):
        log = recording_qemu_img(self)
        qemu.convert(self.src, 'raw', self.dst,
                     _Layout(cluster_size=128 * units.Ki, extended_l2=False,
                             preallocation=Prealloc.OFF),
                     'none')
        with open(log) as f:
            argv = f.read().split('\n')[:-1]
        self.assertEqual(
            ['convert', '-t', 'none', '-f', 'raw', '-O', 'qcow2', '-o',
             'cluster_size=131072,extended_l2=off,preallocation=off',
             self.src, self.dst], argv)

    def test_overlay_of_a_backing_file(self):
        overlay = os.path.join(self.instances_path, 'overlay')
        subprocess.run(['qemu-img', 'create', '-f', 'qcow2', '-F', 'raw',
                        '-b', self.src, overlay], check=True,
                       capture_output=True)
        qemu.convert(overlay, 'qcow2', self.dst,
                     _Layout(extended_l2=False, preallocation=Prealloc.OFF),
                     'writeback', backing_file=self.src, backing_fmt='raw')
        info = pb_fixtures.qemu_img_info(self.dst)
        self.assertEqual(self.src, info['backing-filename'])
        self.assertFalse(info['format-specific']['data']['extended-l2'])
        # Nothing of its own: every cluster reads from the backing file.
        self.assertLess(pb_fixtures.allocated(self.dst), units.Mi)

    def test_failure_is_typed_and_names_the_command(self):
        exc = self.assertRaises(
            exception.QemuImgError, qemu.convert,
            os.path.join(self.instances_path, 'absent'), 'raw', self.dst,
            _Layout(), 'none')
        self.assertIn('convert', str(exc))
        self.assertFalse(os.path.exists(self.dst))

    def test_a_cache_mode_ignoring_flushes_is_refused(self):
        # qemu-img's default for convert ('unsafe') drops flushes: the
        # caller must name one that honours them.
        for cache in ('unsafe', None, 'writethrough,x'):
            exc = self.assertRaises(
                exception.QemuImgError, qemu.convert, self.src, 'raw',
                self.dst, _Layout(), cache)
            self.assertIn('cache mode', str(exc))
        self.assertFalse(os.path.exists(self.dst))


class TestCompare(base.TestCase):

    def _qcow2(self, name, seed):
        raw = os.path.join(self.instances_path, name + '.raw')
        pb_fixtures.write_pattern(raw, units.Mi, seed=seed)
        path = os.path.join(self.instances_path, name)
        subprocess.run(['qemu-img', 'convert', '-f', 'raw', '-O', 'qcow2',
                        raw, path], check=True, capture_output=True)
        return path

    def test_same_content_passes(self):
        qemu.compare(self._qcow2('a', 1), self._qcow2('b', 1))

    def test_different_content_raises(self):
        first, second = self._qcow2('a', 1), self._qcow2('b', 2)
        exc = self.assertRaises(exception.QemuImgError, qemu.compare,
                                first, second)
        self.assertEqual(1, exc.kwargs['exit_code'])


class TestRepairLeaks(base.TestCase):

    def setUp(self):
        super().setUp()
        self.path = os.path.join(self.instances_path, 'disk')
        subprocess.run(['qemu-img', 'create', '-f', 'qcow2', self.path,
                        str(units.Mi)], check=True, capture_output=True)

    def test_a_leak_is_freed(self):
        # A cluster counted, referenced by nothing (what a cut growth
        # leaves at the end of the file).
        end = os.stat(self.path).st_size
        pb_fixtures.count_past_end(self.path)
        os.truncate(self.path, end + 65536)
        data = qemu.repair_leaks(self.path)
        self.assertEqual(1, data['leaks-fixed'])
        # The end of the last cluster in use (the file's last one is
        # shorter than a cluster).
        self.assertEqual(-(-end // 65536) * 65536, data['image-end-offset'])
        subprocess.run(['qemu-img', 'check', '-f', 'qcow2', self.path],
                       check=True, capture_output=True)

    def test_corruption_is_refused(self):
        # The header's cluster counted 0 while it is in use: corruption,
        # which -r leaks does not repair (exit 1: "need to rebuild
        # refcount structures").
        with open(self.path, 'r+b') as f:
            f.seek(48)
            f.seek(int.from_bytes(f.read(8), 'big'))
            f.seek(int.from_bytes(f.read(8), 'big'))
            f.write(b'\0\0')
        exc = self.assertRaises(exception.QemuImgError, qemu.repair_leaks,
                                self.path)
        self.assertEqual(1, exc.kwargs['exit_code'])
        self.assertIn('refcount=0 reference=1', str(exc))


class TestCreateOverlay(base.TestCase):

    def test_comma_in_backing_refused(self):
        path = os.path.join(self.instances_path, 'disk')
        exc = self.assertRaises(
            exception.AllocationFailed, qemu.create_overlay, path,
            units.Mi, '/x,y', 'raw', _Layout())
        self.assertIn("'/x,y'", str(exc))
        self.assertFalse(os.path.exists(path))


class TestZeroedWithoutCluster(base.TestCase):
    """Ranges of a preallocated overlay that read as zeros with no host
    cluster of their own: written as zeros with unmap (what QEMU 7.2's
    block copy does with a guest's zeroed ranges), as against without
    (the cluster kept). Real qemu-img and qemu-io.
    """

    def setUp(self):
        super().setUp()
        d = self.useFixture(fixtures.TempDir()).path
        backing = os.path.join(d, 'base.raw')
        with open(backing, 'wb') as f:
            f.truncate(16 * units.Mi)
        self.path = os.path.join(d, 'disk')
        subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-F',
                        'raw', '-b', backing, '-o',
                        'preallocation=falloc,extended_l2=on,'
                        'cluster_size=128k', self.path, str(16 * units.Mi)],
                       check=True)

    def qemu_io(self, command):
        subprocess.run(['qemu-io', '-f', 'qcow2', '-c', command, self.path],
                       check=True, capture_output=True)

    def test_zeros_written_with_unmap_are_counted(self):
        self.assertEqual(0, qemu.zeroed_without_cluster(self.path))
        self.qemu_io('write -z 1M 1M')
        self.qemu_io('write -P 7 4M 1M')
        self.assertEqual(0, qemu.zeroed_without_cluster(self.path))
        self.qemu_io('write -z -u 8M 2M')
        self.assertEqual(2 * units.Mi, qemu.zeroed_without_cluster(self.path))
