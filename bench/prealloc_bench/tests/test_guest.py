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

"""bench --guest: the in-guest write workload of the real-hypervisor issue.

The real boots run in tests/functional/real (and by hand, with
``prealloc-bench --guest``); here the workload's own logic.
"""

import gzip

import fixtures

from prealloc_bench import cmd as cmd_bench
from prealloc_bench import engine
from prealloc_bench import guest
from prealloc_bench import guest_writes
from prealloc_bench import workloads
from tests import base


class GuestWritesTestCase(base.TestCase):

    def test_no_guest_skips_every_variant_with_the_reason(self):
        # No kernel anywhere: build_guest's own error, as on a host
        # without the guest cache.
        self.useFixture(fixtures.MockPatchObject(
            guest, 'build_guest',
            side_effect=guest.GuestError('no kernel image found')))
        workload = guest_writes.GuestWrites()
        with engine.Bench(self.instances_path, engine.QUICK) as bench:
            out = bench.run_workload(workload)
        rows = out['cases']
        self.assertEqual(len(workloads.WRITE_VARIANTS), len(rows))
        for row in rows:
            self.assertIn('no kernel image found', row['skip'])
            self.assertEqual([None], row['samples'])
        self.assertIn('accelerator: none', out['engine'])

    def test_write_size_fits_the_disk(self):
        workload = guest_writes.GuestWrites()
        for config in (engine.QUICK, engine.DEFAULT):
            with engine.Bench(self.instances_path, config) as bench:
                mib = workload._mib(bench)
            self.assertLessEqual(mib * 2 ** 20, config.write_disk)
            self.assertGreater(mib, 0)

    def test_opt_in_flag(self):
        import argparse
        parser = argparse.ArgumentParser()
        cmd_bench.add_arguments(parser)
        self.assertTrue(parser.parse_args(['--guest']).guest)
        self.assertFalse(parser.parse_args([]).guest)
        self.assertNotIn(guest_writes.GuestWrites.name,
                         [w.name for w in workloads.instances()])


class AcceleratorTestCase(base.TestCase):
    """KVM where /dev/kvm is offered, TCG only where it is not.

    /dev/kvm cannot be taken away from or given to this host for a
    test, nor a KVM guest made to hang on demand: kvm_usable() and the
    probe boot are replaced, the rule itself is what runs.
    """

    def setUp(self):
        super().setUp()
        self.useFixture(fixtures.MockPatchObject(guest, '_kvm_boots', {}))
        self.guest = guest.Guest(kernel='/k', initramfs='/i', release='r')

    def test_tcg_only_where_kvm_is_not_offered(self):
        self.useFixture(fixtures.MockPatchObject(guest, 'kvm_usable',
                                                 return_value=False))
        probe = self.useFixture(fixtures.MockPatchObject(guest,
                                                         '_probe_boot'))
        self.assertEqual('tcg', guest.accelerator(guest=self.guest))
        probe.mock.assert_not_called()

    def test_kvm_where_offered(self):
        self.useFixture(fixtures.MockPatchObject(guest, 'kvm_usable',
                                                 return_value=True))
        self.useFixture(fixtures.MockPatchObject(guest, '_probe_boot',
                                                 return_value=True))
        self.assertEqual('kvm', guest.accelerator(guest=self.guest))

    def test_offered_kvm_that_does_not_boot_is_an_error_not_tcg(self):
        self.useFixture(fixtures.MockPatchObject(guest, 'kvm_usable',
                                                 return_value=True))
        probe = self.useFixture(fixtures.MockPatchObject(
            guest, '_probe_boot', return_value=False))
        for _ in range(2):
            exc = self.assertRaises(guest.GuestError, guest.accelerator,
                                    guest=self.guest)
            self.assertIn('/dev/kvm is offered but the guest does not boot '
                          'under KVM', str(exc))
        # One probe per guest and process.
        self.assertEqual(1, probe.mock.call_count)
        # TCG stays available to whoever asks for it explicitly.
        self.assertEqual('tcg', guest.accelerator(prefer_kvm=False,
                                                  guest=self.guest))


class ConsoleTestCase(base.TestCase):

    def test_kernel_cmdline_skips_the_timer_check(self):
        # Under TCG the check can time out on a busy host and the boot
        # hangs (seen in CI); every guest boots without it.
        for action in (guest.ACTION_WRITE, guest.ACTION_IDLE,
                       guest.ACTION_PROBE):
            self.assertIn('no_timer_check',
                          guest.kernel_cmdline(action).split())

    def test_trim_cmdline(self):
        words = guest.kernel_cmdline(guest.ACTION_TRIM, mib=4,
                                     trim_off_mib=100, trim_mib=200).split()
        for word in ('prealloc_action=trim', 'prealloc_mib=4',
                     'prealloc_md5_mib=1', 'prealloc_trim_off_mib=100',
                     'prealloc_trim_mib=200'):
            self.assertIn(word, words)

    def test_every_action_reaches_init(self):
        # /init's action names are filled in when the initramfs is made.
        data = gzip.decompress(guest._initramfs_bytes([], '/bin/true'))
        self.assertNotIn(b'@ACTION_', data)
        self.assertIn(b'"$action" = probe ]', data)
        for action in (guest.ACTION_WRITE, guest.ACTION_TRIM):
            self.assertIn(b'\n%s)\n' % action.encode(), data)

    def test_init_announces_its_boot_before_anything_else(self):
        lines = guest.INIT_SCRIPT.splitlines()
        start = [i for i, line in enumerate(lines) if ' start boot_id=' in
                 line]
        self.assertEqual(1, len(start))
        # Right after the console is set up: before modules, before the
        # disk is waited for.
        self.assertLess(start[0], lines.index('arg() {'))

    def test_parse_console_starts(self):
        mark = guest.CONSOLE_MARK
        text = '\n'.join([
            '[    0.012000] ..MP-BIOS bug: 8254 timer not connected',
            '%s start boot_id=aaa' % mark,
            '%s ready action=idle dev=vda size=1' % mark,
            '%s idle md5_mib=1 md5=x boot_id=aaa' % mark,
            'noise %s start boot_id=zzz' % mark,
            '  %s start boot_id=bbb  ' % mark,
            '%s starting boot_id=ccc' % mark,
        ])
        self.assertEqual(['aaa', 'bbb'], guest.parse_console_starts(text))
        self.assertEqual([], guest.parse_console_starts(
            '[    0.012000] ..MP-BIOS bug: 8254 timer not connected'))
        # parse_console keeps only the last start.
        self.assertEqual({'boot_id': 'bbb'},
                         guest.parse_console(text)['start'])


class BlockioTestCase(base.TestCase):
    """The blockio action's command lines and parsers; its real boots are
    in tests/functional/real/test_real_512e.py.
    """

    def setUp(self):
        super().setUp()
        self.guest = guest.Guest(kernel='/k', initramfs='/i', release='r')

    def test_blockio_cmdline(self):
        words = guest.kernel_cmdline(guest.ACTION_BLOCKIO,
                                     step=guest.STEP_DD512, count=8,
                                     sector=3, fs='xfs').split()
        for word in ('prealloc_action=blockio', 'prealloc_step=dd512',
                     'prealloc_fs=xfs', 'prealloc_count=8',
                     'prealloc_sector=3'):
            self.assertIn(word, words)

    def test_bad_step_or_filesystem_is_named(self):
        exc = self.assertRaises(ValueError, guest.kernel_cmdline,
                                guest.ACTION_BLOCKIO, step='rm -rf')
        self.assertIn("'rm -rf'", str(exc))
        self.assertIn('dd512', str(exc))
        exc = self.assertRaises(ValueError, guest.kernel_cmdline,
                                guest.ACTION_BLOCKIO, fs='btrfs')
        self.assertIn("'btrfs'", str(exc))
        self.assertIn('xfs', str(exc))

    def test_advertised_block_sizes_on_the_device(self):
        cmd = guest.qemu_command(self.guest, '/d,x', 'qcow2', 'c', 'tcg',
                                 '/c', block_sizes=(512, 4096),
                                 trace_path='/t')
        drive = cmd[cmd.index('-drive') + 1]
        self.assertIn('file=/d,,x', drive)
        self.assertIn('if=none', drive)
        self.assertIn('id=disk0', drive)
        self.assertEqual('virtio-blk-pci,drive=disk0,logical_block_size=512,'
                         'physical_block_size=4096',
                         cmd[cmd.index('-device') + 1])
        self.assertEqual(['-trace', 'enable=virtio_blk_handle_write', '-D',
                          '/t'], cmd[-4:])
        # Without: QEMU's own virtio disk, as before.
        cmd = guest.qemu_command(self.guest, '/d', 'qcow2', 'c', 'tcg', '/c')
        self.assertIn('if=virtio', cmd[cmd.index('-drive') + 1])
        self.assertNotIn('-device', cmd)
        self.assertNotIn('-trace', cmd)

    def test_write_test_boots_with_the_block_sizes(self):
        # run_write_test hands block_sizes to the command line it runs
        # (the boot itself is mocked: the real tier boots guests).
        ran = []
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_bench.guest._run_guest',
            lambda cmd, timeout, console: ran.append(cmd)))
        self.useFixture(fixtures.MonkeyPatch(
            'prealloc_bench.guest.write_result',
            lambda text, accel, runner: 'result'))
        self.assertEqual('result', guest.run_write_test(
            '/d', 'qcow2', guest=self.guest, accel='tcg',
            workdir=self.instances_path, block_sizes=(512, 4096)))
        self.assertIn('virtio-blk-pci,drive=disk0,logical_block_size=512,'
                      'physical_block_size=4096', ran[0])

    def test_parse_write_trace(self):
        # QEMU 7.2's log backend, with and without its pid@time prefix.
        text = '\n'.join([
            '1234@1700000000.000001:virtio_blk_handle_write vdev 0x55 '
            'req 0x7f sector 8 nsectors 1',
            'virtio_blk_handle_write vdev 0x55 req 0x7f sector 16 '
            'nsectors 8',
            'virtio_blk_handle_read vdev 0x55 req 0x7f sector 0 nsectors 1',
            'virtio_blk_handle_write vdev 0x55 req 0x7f sector 9 nsectors 1',
        ])
        self.assertEqual({512: 2, 4096: 1}, guest.parse_write_trace(text))
        self.assertEqual({}, guest.parse_write_trace(''))

    def test_tools_come_with_their_libraries(self):
        files = dict(guest._tool_files(('/usr/bin/dd',)))
        self.assertIn('/usr/bin/dd', files)
        self.assertTrue(any('/libc.so' in p for p in files), list(files))
        self.assertTrue(any('ld-linux' in p for p in files), list(files))
        data = gzip.decompress(guest._initramfs_bytes(
            [], '/bin/true', sorted(files.items())))
        self.assertIn(b'usr/bin/dd\x00', data)
        self.assertIn(b'\nblockio)\n', data)
