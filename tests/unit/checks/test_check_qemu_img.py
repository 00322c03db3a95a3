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

"""The qemu-img check with this host's real qemu-img.

The overlay is made in the test's own instances directory; its version and
what it allocated are read back here with qemu-img and stat. A QEMU too old
for extended_l2 cannot run here: a script printing an old version stands
for it.
"""

import os
import re
import subprocess

import fixtures

from prealloc_backend.checks import qemu_img
from prealloc_backend.checks import result
from tests import base


class TestQemuImg(base.CheckTestCase):

    def check(self, **options):
        return qemu_img.check_qemu_img(self.check_host(
            self.nova_conf(**options)))

    def test_space(self):
        res = self.check()
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        out = subprocess.run(['qemu-img', '--version'], check=True,
                             capture_output=True, text=True).stdout
        version = re.search(r'version (\d+\.\d+\.\d+)', out).group(1)
        self.assertEqual(version, res.facts['version'])
        self.assertEqual('falloc', res.facts['preallocation'])
        self.assertTrue(res.facts['extended_l2'])
        # falloc: every data cluster allocated, before and after growing.
        self.assertGreaterEqual(res.facts['allocated_bytes'],
                                qemu_img.PROBE_OVERLAY_BYTES)
        self.assertGreaterEqual(res.facts['grown_allocated_bytes'],
                                qemu_img.PROBE_GROWN_BYTES)
        self.assertIn('extended_l2=on, preallocation=falloc', res.details)
        self.assertEqual([], os.listdir(self.instances))

    def test_mode_none_tests_what_flavors_may_ask(self):
        res = self.check(mode='none')
        self.assertEqual(result.Code.SUCCESS, res.code, res.details)
        self.assertEqual('metadata', res.facts['preallocation'])
        self.assertTrue(res.facts['extended_l2'])
        # metadata only: the data area stays thin.
        self.assertLess(res.facts['allocated_bytes'],
                        qemu_img.PROBE_OVERLAY_BYTES)
        self.assertEqual([], os.listdir(self.instances))

    def test_no_qemu_img(self):
        empty = self.useFixture(fixtures.TempDir()).path
        self.useFixture(fixtures.EnvironmentVariable('PATH', empty))
        res = self.check()
        self.assertEqual(result.Code.FAILURE, res.code)
        self.assertIn('qemu-img cannot run', res.details)
        self.assertIn('qemu-utils', res.fix)

    def test_qemu_without_extended_l2(self):
        bindir = self.useFixture(fixtures.TempDir()).path
        fake = os.path.join(bindir, 'qemu-img')
        with open(fake, 'w') as f:
            f.write('#!/bin/sh\necho "qemu-img version 5.1.0 (old)"\n')
        os.chmod(fake, 0o755)
        self.useFixture(fixtures.EnvironmentVariable(
            'PATH', bindir + os.pathsep + os.environ['PATH']))
        res = self.check()
        self.assertEqual(result.Code.FAILURE, res.code)
        self.assertEqual('5.1.0', res.facts['version'])
        self.assertIn('came with QEMU 5.2', res.details)
        self.assertIn('Upgrade QEMU', res.fix)
