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

"""prealloc_backend/disk/hostcaps.py: the discard-no-unref probes.

The QEMU probe runs the machine's real qemu-img; which answer is right
for it is checked on both platforms by the real tier
(tests/functional/real/test_trim.py, against QEMU's and libvirt's
versions). Here: what each answer is made of, and failures of the probe,
which qemu-img cannot be made to produce (mocked, said at each test).
"""

import os
import subprocess

import fixtures

from prealloc_backend.disk import hostcaps
from prealloc_backend.disk import qemu
from prealloc_backend import exception
from tests import base


class QemuProbeTestCase(base.TestCase):

    def test_real_qemu_img(self):
        tmp = self.useFixture(fixtures.TempDir()).path
        self.useFixture(fixtures.MonkeyPatch('tempfile.tempdir', tmp))
        answer = hostcaps.qemu_discard_no_unref()
        version = subprocess.run(['qemu-img', '--version'], check=True,
                                 capture_output=True, text=True).stdout
        if answer.supported:
            self.assertIn('opens a qcow2', answer.reason)
        else:
            self.assertIn("no 'discard-no-unref' option", answer.reason,
                          version)
        # Nothing is left of the scratch image.
        self.assertEqual([], os.listdir(tmp))

    def test_comma_in_the_temporary_directory(self):
        tmp = os.path.join(self.useFixture(fixtures.TempDir()).path, 'a,b')
        os.mkdir(tmp)
        self.useFixture(fixtures.MonkeyPatch('tempfile.tempdir', tmp))
        answer = hostcaps.qemu_discard_no_unref()
        self.assertNotIn('the probe failed', answer.reason)

    def test_other_failure_is_no_with_the_reason(self):
        # qemu-img failing for another reason (mocked: a broken qemu-img
        # cannot be installed for one test) is a no, never a crash.
        self.useFixture(fixtures.MockPatchObject(
            qemu, 'execute', side_effect=exception.QemuImgError(
                cmd='qemu-img create', exit_code=1,
                stderr='Could not create: No space left on device')))
        answer = hostcaps.qemu_discard_no_unref()
        self.assertFalse(answer.supported)
        self.assertIn('the probe failed', answer.reason)
        self.assertIn('No space left on device', answer.reason)


class LibvirtProbeTestCase(base.TestCase):

    def schema(self, text):
        path = os.path.join(self.useFixture(fixtures.TempDir()).path,
                            'domaincommon.rng')
        with open(path, 'w') as f:
            f.write(text)
        return path

    def test_named(self):
        path = self.schema('<attribute name="discard_no_unref">')
        answer = hostcaps.libvirt_discard_no_unref((path,))
        self.assertTrue(answer.supported)
        self.assertIn(path, answer.reason)

    def test_not_named(self):
        path = self.schema('<attribute name="discard">')
        answer = hostcaps.libvirt_discard_no_unref((path,))
        self.assertFalse(answer.supported)
        self.assertIn('libvirt < 9.5', answer.reason)

    def test_missing_then_found(self):
        path = self.schema('discard_no_unref')
        answer = hostcaps.libvirt_discard_no_unref(('/nonexistent.rng',
                                                    path))
        self.assertTrue(answer.supported)

    def test_not_installed(self):
        answer = hostcaps.libvirt_discard_no_unref(('/nonexistent.rng',))
        self.assertFalse(answer.supported)
        self.assertIn('not installed', answer.reason)


class BothTestCase(base.TestCase):

    def setUp(self):
        super().setUp()
        hostcaps.forget()
        self.addCleanup(hostcaps.forget)

    def answers(self, qemu_answer, libvirt_answer):
        # The two probes are tested above; here only how they combine.
        self.qemu = self.useFixture(fixtures.MockPatchObject(
            hostcaps, 'qemu_discard_no_unref',
            return_value=qemu_answer)).mock
        self.useFixture(fixtures.MockPatchObject(
            hostcaps, 'libvirt_discard_no_unref',
            return_value=libvirt_answer))

    def test_both_needed(self):
        yes = hostcaps.Answer(True, 'y')
        for q, lv, want in ((yes, yes, True),
                            (yes, hostcaps.Answer(False, 'old libvirt'),
                             False),
                            (hostcaps.Answer(False, 'old qemu'), yes,
                             False)):
            hostcaps.forget()
            self.answers(q, lv)
            answer = hostcaps.discard_no_unref()
            self.assertEqual(want, answer.supported)
            self.assertIn("libvirtd's own versions not asked", answer.reason)
            if not want:
                self.assertIn('old', answer.reason)

    def test_asked_once(self):
        self.answers(hostcaps.Answer(True, 'y'), hostcaps.Answer(True, 'y'))
        hostcaps.discard_no_unref()
        hostcaps.discard_no_unref()
        self.assertEqual(1, self.qemu.call_count)

    def test_failed_probe_asked_again(self):
        self.answers(hostcaps.Answer(False, 'the probe failed: full',
                                     definite=False),
                     hostcaps.Answer(True, 'y'))
        hostcaps.discard_no_unref()
        hostcaps.discard_no_unref()
        self.assertEqual(2, self.qemu.call_count)

    def test_connection_floors(self):
        yes = hostcaps.Answer(True, 'y')
        for lib, emulator, want in (
                (11003000, 10000013, True),
                (9005000, 8001003, True),
                (9004000, 10000013, False),
                (11003000, 8001002, False)):
            hostcaps.forget()
            self.answers(yes, yes)
            hostcaps.record_connection(lib, emulator)
            answer = hostcaps.discard_no_unref()
            self.assertEqual(want, answer.supported, (lib, emulator, answer))
            self.assertNotIn('not asked', answer.reason)
        self.assertIn('8.1.2', answer.reason)
