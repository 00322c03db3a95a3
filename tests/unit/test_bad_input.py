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

"""Bad input: configuration, flavor extra specs and qemu-img's output.

* Every ``[prealloc_backend]`` option given invalid values, as a
  configuration file would give them: the start-up check
  (``hostpolicy.validate``) fails, naming the option, the value and what
  is allowed, before any disk is touched.
* Contradictory combinations (refused at start-up, or resolved as
  conf.py's help documents, on real disks) are in
  tests/privileged/test_contradictions.py: some need a loop-mounted filesystem.
* qemu-img answering something unexpected, faked by a script named qemu-img
  placed first on PATH (the real one behind it for every other call): a
  typed QemuImgError or QemuImgOutputError comes out of the plugin's call
  (or of the spawn), never a KeyError or TypeError from deeper down, and no
  half-made disk stays.
"""

import os
import stat
import subprocess
import textwrap

import fixtures
from nova import exception as nova_exception
from oslo_config import cfg
from oslo_log import log as logging
from oslo_utils import units
import testscenarios

from prealloc_backend.adapter import backend
from prealloc_backend import conf
from prealloc_backend.disk import qemu
from prealloc_backend import exception
from prealloc_backend.planner import hostpolicy
from prealloc_backend.planner import modes
from tests import base
from tests import fixtures as pb_fixtures

LOG = logging.getLogger(__name__)

load_tests = testscenarios.load_tests_apply_scenarios

GROUP = conf.GROUP_NAME

# option -> (invalid values, words the error must contain to say what is
# allowed)
INVALID = {
    'mode': (['bogus', 'Space', 'falloc', 'off', 'preallocate', '',
              'space,full'],
             ['none', 'metadata', 'space', 'full']),
    'qcow2_extended_l2': (['maybe', '2', '', 'enabled'],
                          ['true', 'false']),
    'qcow2_cluster_size': (['32K', '16K', '4M', '64k', '65536', 'Auto', '',
                            '1.5M'],
                           ['64K', '128K', '256K', '512K', '1M', '2M']),
    'qcow2_l2_cache': (['full', 'none', 'Full-Coverage', ''],
                       ['full-coverage', 'qemu-default']),
    'qcow2_metadata_cache_max_mb': (['0', '-1', '4097', '1e3', 'abc', '1.5',
                                     ''],
                                    ['1', '4096']),
    'fallocate_unsupported': (['ignore', 'zero_fill', 'Warn', 'skip', ''],
                              ['warn', 'fail', 'zero-fill']),
    'allocation_timeout': (['-1', 'soon', '2.5', '1h', ''], ['0']),
    'progress_interval': (['0', '-10', 'often', '0.5', ''], ['1']),
}


def option_scenarios():
    return [('%s=%r' % (name, value), {'option': name, 'value': value,
                                        'allowed': allowed})
            for name, (values, allowed) in INVALID.items()
            for value in values]


class InvalidOptionTestCase(base.TestCase):
    """One invalid value of one option, from a configuration file."""

    scenarios = option_scenarios()

    def test_refused_at_startup(self):
        # load_raw_values parses the value as a configuration file
        # would give it; oslo.config validates it when it is read.
        self.flags_fixture.load_raw_values(group=GROUP,
                                           **{self.option: self.value})
        exc = self.assertRaises((exception.PreallocError,
                                 cfg.ConfigSourceValueError),
                                hostpolicy.validate, conf.CONF)
        message = str(exc)
        self.assertIn(self.option, message)
        self.assertIn(GROUP, message, 'the group is not named')
        if self.value:
            self.assertIn(repr(self.value), message, 'the value is not named')
        else:
            self.assertTrue("''" in message or 'empty' in message,
                            'the empty value is not named')
        for word in self.allowed:
            self.assertIn(word, message, 'what is allowed is not said')
        LOG.info('%s', message)


class ValidOptionControlTestCase(base.TestCase):
    """Control: every option at a valid non-default value passes, so the
    refusals above are about the values.
    """

    def test_valid_values(self):
        self.flags_fixture.load_raw_values(
            group=GROUP, mode='metadata', qcow2_extended_l2='true',
            qcow2_cluster_size='256K', qcow2_l2_cache='qemu-default',
            qcow2_metadata_cache_max_mb='4096',
            fallocate_unsupported='zero-fill', allocation_timeout='0',
            progress_interval='1')
        self.assertIs(modes.Mode.METADATA, hostpolicy.validate(conf.CONF))
        opts = conf.CONF.prealloc_backend
        self.assertEqual(4096, opts.qcow2_metadata_cache_max_mb)


class NovaOptionTestCase(base.TestCase):

    def test_invalid_preallocate_images(self):
        for value in ('full', 'Space', 'metadata', 'falloc', ''):
            self.flags_fixture.load_raw_values(preallocate_images=value)
            exc = self.assertRaises((exception.PreallocError,
                                     cfg.ConfigSourceValueError),
                                    hostpolicy.validate, conf.CONF)
            message = str(exc)
            self.assertIn('preallocate_images', message)
            self.assertIn(repr(value), message)
            self.assertIn('none', message)
            self.assertIn('space', message)


class BadFlavorTestCase(base.TestCase):
    """An invalid prealloc:mode extra spec: a clear error, nothing left."""

    def test_invalid_values(self):
        source = os.path.join(self.instances_path, 'src')
        pb_fixtures.make_base(source, 'raw', units.Mi, seed=4)

        def fetch(target, *args, **kwargs):
            subprocess.run(['cp', source, target], check=True)

        for value in ('bogus', '', 'falloc', '1', 'space,full', 'thick'):
            for images_type in ('raw', 'qcow2'):
                instance = self.make_instance(
                    extra_specs={modes.FLAVOR_MODE_KEY: value})
                image = backend.Backend(images_type == 'qcow2').by_name(
                    instance, 'disk', images_type)
                exc = self.assertRaises(exception.InvalidFlavorPolicy,
                                        image.cache, fetch_func=fetch,
                                        filename='img', size=4 * units.Mi,
                                        image_id='img')
                message = str(exc)
                self.assertIn(modes.FLAVOR_MODE_KEY, message)
                self.assertIn(repr(value), message)
                self.assertIn(modes.allowed(), message)
                self.assertIsInstance(exc, nova_exception.Invalid)
                directory = os.path.dirname(image.path)
                self.assertEqual(
                    [], [f for f in os.listdir(directory)
                         if f != 'disk.info'], (value, images_type))


FAKE_QEMU_IMG = textwrap.dedent('''\
    #!/bin/sh
    # A fake qemu-img for tests: behaviour.<subcommand> beside this script
    # may answer instead of the real qemu-img; otherwise the real one runs.
    here=$(dirname "$0")
    if [ -f "$here/behaviour.$1" ]; then
        . "$here/behaviour.$1"
    fi
    exec %s "$@"
''')

# What 'qemu-img info' may answer; each case names the error it must give.
# A condition on "$2" targets the plugin's own calls (which put
# --output=json first) and leaves nova's calls to the real qemu-img.
OURS = 'if [ "$2" = "--output=json" ]; then %s; fi'
BAD_INFO = [
    ('not json', "printf 'garbage'; exit 0", exception.QemuImgOutputError),
    ('empty', 'exit 0', exception.QemuImgOutputError),
    ('json list', "printf '[]'; exit 0", exception.QemuImgOutputError),
    ('json string', "printf '\"x\"'; exit 0", exception.QemuImgOutputError),
    ('no virtual-size', "printf '{\"format\": \"qcow2\"}'; exit 0",
     exception.QemuImgOutputError),
    ('virtual-size string',
     "printf '{\"virtual-size\": \"1024\", \"format\": \"qcow2\"}'; exit 0",
     exception.QemuImgOutputError),
    ('virtual-size bool',
     "printf '{\"virtual-size\": true, \"format\": \"qcow2\"}'; exit 0",
     exception.QemuImgOutputError),
    ('virtual-size float',
     "printf '{\"virtual-size\": 1024.5, \"format\": \"qcow2\"}'; exit 0",
     exception.QemuImgOutputError),
    ('virtual-size negative',
     "printf '{\"virtual-size\": -1, \"format\": \"qcow2\"}'; exit 0",
     exception.QemuImgOutputError),
    ('format null',
     "printf '{\"virtual-size\": 1024, \"format\": null}'; exit 0",
     exception.QemuImgOutputError),
    ('not utf-8', "printf '\\377\\376{'; exit 0",
     exception.QemuImgOutputError),
    ('warning before json',
     "printf 'WARNING: x\\n{\"virtual-size\": 1, \"format\": \"raw\"}';"
     " exit 0", exception.QemuImgOutputError),
    ('huge output', "head -c 4000000 /dev/zero | tr '\\\\0' x; exit 0",
     exception.QemuImgOutputError),
    ('exit 1 with stderr', "echo 'qemu-img: boom' >&2; exit 1",
     exception.QemuImgError),
    ('exit 1 silent', 'exit 1', exception.QemuImgError),
    ('killed', 'kill -9 $$', exception.QemuImgError),
]


def qemu_img_scenarios(cases):
    return [(label, {'script': script, 'error': error})
            for label, script, error in cases]


class FakeQemuImgBase(base.TestCase):

    def setUp(self):
        super().setUp()
        self.bindir = self.useFixture(fixtures.TempDir()).path
        real = subprocess.run(['sh', '-c', 'command -v qemu-img'],
                              capture_output=True, text=True,
                              check=True).stdout.strip()
        fake = os.path.join(self.bindir, 'qemu-img')
        with open(fake, 'w') as f:
            f.write(FAKE_QEMU_IMG % real)
        os.chmod(fake, stat.S_IRWXU)
        self.useFixture(fixtures.EnvironmentVariable(
            'PATH', self.bindir + os.pathsep + os.environ['PATH']))
        self.useFixture(fixtures.EnvironmentVariable('REAL_QEMU_IMG', real))
        self.source = os.path.join(self.useFixture(
            fixtures.TempDir()).path, 'src')
        pb_fixtures.make_base(self.source, 'raw', units.Mi + 512, seed=6)
        self.flags(group=GROUP, mode='space')

    def behave(self, subcommand, script):
        path = os.path.join(self.bindir, 'behaviour.' + subcommand)
        if script is None:
            if os.path.exists(path):
                os.unlink(path)
            return
        with open(path, 'w') as f:
            f.write(script + '\n')

    def fetch(self, target, *args, **kwargs):
        subprocess.run(['cp', self.source, target], check=True)

    def spawn(self, instance, size):
        image = backend.Backend(True).by_name(instance, 'disk', 'qcow2')
        image.cache(fetch_func=self.fetch, filename='img', size=size,
                    image_id='img')
        return image.path

    def assert_clear(self, exc, error):
        label = self.id()
        self.assertIsInstance(exc, error, '%s: %r' % (label, exc))
        message = str(exc)
        if error is exception.QemuImgError:
            # The message names the command that failed (info, create...).
            self.assertTrue(exc.cmd, label)
            self.assertIn(exc.cmd.split()[0], message, label)
            self.assertIn(exc.cmd, message, label)
        else:
            self.assertIn('qemu-img', message, label)
        # A fault message, not a dump of whatever qemu-img printed.
        self.assertLess(len(message), 2000, label)

    def leftovers(self, instance):
        directory = os.path.join(self.instances_path, instance.uuid)
        if not os.path.isdir(directory):
            return []
        return [f for f in os.listdir(directory) if f != 'disk.info']


class InfoOutputTestCase(FakeQemuImgBase):

    scenarios = qemu_img_scenarios(BAD_INFO)

    def test_direct(self):
        disk = os.path.join(self.instances_path, 'disk')
        subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', disk,
                        '4M'], check=True)
        self.behave('info', OURS % self.script)
        exc = self.assertRaises(exception.PreallocError, qemu.info, disk,
                                'qcow2')
        self.assert_clear(exc, self.error)

    def test_during_resize(self):
        """The plugin reads qemu-img info to grow a disk: a bad answer
        fails the resize with the typed error, and the disk is intact.
        """
        instance = self.make_instance()
        disk = self.spawn(instance, 4 * units.Mi)
        before = pb_fixtures.qemu_img_info(disk)
        self.behave('info', OURS % self.script)
        exc = self.assertRaises(exception.PreallocError, self.spawn,
                                instance, 8 * units.Mi)
        self.assert_clear(exc, self.error)
        self.behave('info', None)
        self.assertEqual(before, pb_fixtures.qemu_img_info(disk))
        self.assertEqual(['disk'], self.leftovers(instance))


# 'qemu-img create -f qcow2 -o <options> <path> <size>': $6 is the file it
# creates, $7 the size.
BAD_CREATE = [
    ('exit 1 with stderr', "echo 'qemu-img: boom' >&2; exit 1",
     exception.QemuImgError),
    ('half-written then exit 1', 'printf QFI > "$6"; exit 1',
     exception.QemuImgError),
    ('killed half-way', 'printf QFI > "$6"; kill -9 $$',
     exception.QemuImgError),
    ('exit 0, no file', 'exit 0', exception.PreallocError),
    ('exit 0, empty file', ': > "$6"; exit 0', exception.PreallocError),
    ('exit 0, raw file', 'truncate -s "$7" "$6"; exit 0',
     exception.PreallocError),
    # A valid qcow2 image of the right size, but without the backing file:
    # the guest would see zeros instead of its image.
    ('exit 0, no backing file',
     'exec "$REAL_QEMU_IMG" create -q -f qcow2 "$6" "$7"',
     exception.PreallocError),
]


class CreateOutputTestCase(FakeQemuImgBase):

    # A root disk larger than its image (grown after creation) and a disk
    # of the image's own size (size None: rescue), which nothing reads
    # again after qemu-img create.
    scenarios = testscenarios.multiply_scenarios(
        qemu_img_scenarios(BAD_CREATE),
        [('grown', {'size': 4 * units.Mi}), ('image size', {'size': None})])

    def test_spawn(self):
        self.behave('create', self.script)
        instance = self.make_instance()
        exc = self.assertRaises(exception.PreallocError, self.spawn,
                                instance, self.size)
        self.assertIsInstance(exc, self.error)
        self.assertEqual([], self.leftovers(instance))


BAD_RESIZE = [
    ('exit 1 with stderr', "echo 'qemu-img: boom' >&2; exit 1",
     exception.QemuImgError),
    ('exit 0, nothing done', 'exit 0', exception.PreallocError),
]


class ResizeOutputTestCase(FakeQemuImgBase):

    scenarios = qemu_img_scenarios(BAD_RESIZE)

    def test_grow(self):
        instance = self.make_instance()
        disk = self.spawn(instance, 4 * units.Mi)
        before = pb_fixtures.qemu_img_info(disk)
        self.behave('resize', self.script)
        exc = self.assertRaises(exception.PreallocError, self.spawn,
                                instance, 8 * units.Mi)
        self.assertIsInstance(exc, self.error)
        self.behave('resize', None)
        self.assertEqual(before, pb_fixtures.qemu_img_info(disk))


class FakeQemuImgTestCase(FakeQemuImgBase):

    def test_qemu_img_works_through_the_fake(self):
        """Control: with no behaviour file the real qemu-img answers."""
        disk = self.spawn(self.make_instance(), 4 * units.Mi)
        self.assertEqual(4 * units.Mi,
                         qemu.info(disk, 'qcow2').virtual_size)

    def test_not_installed(self):
        """No qemu-img on PATH at all."""
        empty = self.useFixture(fixtures.TempDir()).path
        os.symlink(subprocess.run(['sh', '-c', 'command -v env'],
                                  capture_output=True, text=True,
                                  check=True).stdout.strip(),
                   os.path.join(empty, 'env'))
        disk = os.path.join(self.instances_path, 'disk')
        with open(disk, 'wb') as f:
            f.truncate(units.Mi)
        self.useFixture(fixtures.EnvironmentVariable('PATH', empty))
        exc = self.assertRaises(exception.QemuImgError, qemu.info, disk,
                                'raw')
        self.assertIn('qemu-img', str(exc))
