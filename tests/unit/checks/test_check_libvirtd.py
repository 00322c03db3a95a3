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

"""The libvirt checks: qemu.conf's disk ownership, the metadata cache.

Each test writes a real qemu.conf (the text of Debian's libvirt 9.0 file
where it matters) and a real nova.conf, and runs the check functions on
them; the libvirt version is the one of this host's libvirt daemon, read
here independently.
"""

import os
import pwd
import re
import shutil
import subprocess

from oslo_utils import units
from oslotest import base as oslo_base

from prealloc_backend.checks import libvirtd
from prealloc_backend.planner import diskplan
from tests import base

# /etc/libvirt/qemu.conf of Debian 12's libvirt-daemon-system 9.0.0
# (lines 511-533): every setting commented out, libvirt's defaults apply.
DEBIAN_OWNERSHIP = '''\
# name.
#
# Some examples of valid values are:
#
#       user = "qemu"   # A user named "qemu"
#       user = "+0"     # Super user (uid=0)
#       user = "100"    # A user named "100" or a user with uid=100
#
#user = "libvirt-qemu"

# The group for QEMU processes run by the system instance. It can be
# specified in a similar way to user.
#group = "libvirt-qemu"

# Whether libvirt should dynamically change file ownership
# to match the configured user/group above. Defaults to 1.
# Set to 0 to disable file ownership changes.
#dynamic_ownership = 1

# Whether libvirt should remember and restore the original
# ownership over files it is relabeling. Defaults to 1, set
# to 0 to disable the feature.
#remember_owner = 1
'''


class TestParseConf(oslo_base.BaseTestCase):

    def test_all_commented(self):
        self.assertEqual({}, libvirtd.parse_conf(DEBIAN_OWNERSHIP))

    def test_values(self):
        text = ('user = "+0"   # root\n'
                "group = 'kvm'\n"
                'remember_owner = 0\n'
                'remember_owner = 1\n'
                'cgroup_device_acl = [\n'
                '    "/dev/null", "/dev/full",\n'
                '    "/dev/zero",\n'
                ']\n'
                'max_files = -1; seccomp_sandbox = 1\n'
                'note = """two\nlines"""\n')
        self.assertEqual({'user': '+0', 'group': 'kvm', 'remember_owner': 1,
                          'cgroup_device_acl': ['/dev/null', '/dev/full',
                                                '/dev/zero'],
                          'max_files': -1, 'seccomp_sandbox': 1,
                          'note': 'two\nlines'},
                         libvirtd.parse_conf(text))

    def test_syntax_errors(self):
        for text, where in (('remember_owner 0\n', 'line 1'),
                            ('\nuser = root\n', 'line 2'),
                            ('acl = ["/dev/null"\n', 'missing'),
                            ('user = "root\n', 'line 1'),
                            ('= 1\n', 'line 1')):
            exc = self.assertRaises(libvirtd.ConfSyntaxError,
                                    libvirtd.parse_conf, text)
            self.assertIn(where, str(exc), text)

    def test_this_hosts_file(self):
        if not os.path.isfile('/etc/libvirt/qemu.conf'):
            self.skipTest('no /etc/libvirt/qemu.conf on this host')
        values = libvirtd.read_conf('/etc/libvirt/qemu.conf')
        # The settings grep finds uncommented are the ones parsed.
        with open('/etc/libvirt/qemu.conf') as f:
            names = {m.group(1) for m in re.finditer(
                r'^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*=', f.read(), re.M)}
        self.assertEqual(names, set(values))


class LibvirtCase(base.CheckTestCase):

    def setUp(self):
        super().setUp()
        self.qemu_conf = os.path.join(self.tmp, 'qemu.conf')

    def host(self, qemu_conf_text=None, mode='space', disk_size=64 * units.Mi,
             images_type=None, **options):
        if qemu_conf_text is not None:
            with open(self.qemu_conf, 'w') as f:
                f.write(qemu_conf_text)
        return self.check_host(
            self.nova_conf(images_type, mode=mode, **options),
            disk_size=disk_size, qemu_conf=self.qemu_conf)


class TestOwnership(LibvirtCase):

    def test_debian_defaults(self):
        res = libvirtd.check_ownership(self.host(DEBIAN_OWNERSHIP))
        self.assertEqual(libvirtd.result.Code.SUCCESS, res.code, res.details)
        self.assertEqual(1, res.facts['remember_owner'])
        self.assertFalse(res.facts['remember_owner_set'])
        self.assertEqual(1, res.facts['dynamic_ownership'])
        self.assertIsNone(res.facts['qemu_user'])
        present = []
        for name in ('libvirt-qemu', 'qemu'):
            if subprocess.run(['getent', 'passwd', name],
                              capture_output=True).returncode == 0:
                present.append(name)
        self.assertEqual(present, res.facts['qemu_user_candidates'])
        self.assertIn('remember_owner = 1 (default)', res.details)
        self.assertIn('nova user or the QEMU user', res.details)

    def test_remember_owner_off_fails_where_the_daemon_allocates(self):
        text = DEBIAN_OWNERSHIP + 'remember_owner = 0\nuser = "+0"\n'
        for mode in ('space', 'full'):
            res = libvirtd.check_ownership(self.host(text, mode=mode))
            self.assertEqual(libvirtd.result.Code.FAILURE, res.code, mode)
            self.assertIn('remember_owner = 0', res.details)
            self.assertIn('root:root', res.details)
            self.assertIn('refuses root-owned disks', res.details)
            self.assertIn('set remember_owner = 1', res.fix)
            self.assertIn(self.qemu_conf, res.fix)
            self.assertEqual(0, res.facts['remember_owner'])
            self.assertEqual(0, res.facts['qemu_user_uid'])
            self.assertEqual('root', res.facts['qemu_user_name'])

    def test_remember_owner_off_warns_in_other_modes(self):
        for mode in ('none', 'metadata'):
            res = libvirtd.check_ownership(self.host('remember_owner = 0\n',
                                                     mode=mode))
            self.assertEqual(libvirtd.result.Code.WARNING, res.code, mode)
            self.assertIn('prealloc:mode=space or full', res.details)
            self.assertIn('set remember_owner = 1', res.fix)

    def test_without_dynamic_ownership_owners_never_change(self):
        res = libvirtd.check_ownership(self.host(
            'dynamic_ownership = 0\nremember_owner = 0\n'
            'user = "no-such-user-here"\n'))
        self.assertEqual(libvirtd.result.Code.SUCCESS, res.code, res.details)
        self.assertEqual(0, res.facts['dynamic_ownership'])
        self.assertIn('never changes the owner', res.details)
        self.assertIsNone(res.facts['qemu_user_uid'])
        self.assertIn('no user of this host', res.details)

    def test_named_user(self):
        name = pwd.getpwuid(os.getuid()).pw_name
        res = libvirtd.check_ownership(self.host('user = "%s"\n' % name))
        self.assertEqual(os.getuid(), res.facts['qemu_user_uid'])
        self.assertIn('user = "%s" (uid %d)' % (name, os.getuid()),
                      res.details)

    def test_values_libvirt_refuses(self):
        for text in ('remember_owner = "no"\n', 'dynamic_ownership = 2\n',
                     'remember_owner 0\n'):
            res = libvirtd.check_ownership(self.host(text))
            self.assertEqual(libvirtd.result.Code.FAILURE, res.code, text)
            self.assertIn('libvirt refuses to start', res.details)
            self.assertIn(self.qemu_conf, res.details)

    def test_missing_file(self):
        res = libvirtd.check_ownership(self.host())
        self.assertEqual(libvirtd.result.Code.WARNING, res.code)
        self.assertIn('not found', res.details)
        self.assertIn('--qemu-conf', res.fix)


def libvirt_daemon_version():
    """(path, version) of this host's libvirt daemon, read by the test."""
    for name in ('virtqemud', 'libvirtd'):
        path = shutil.which(name, path=os.environ.get('PATH', '') +
                            ':/usr/sbin:/usr/local/sbin:/sbin')
        if path:
            out = subprocess.run([path, '--version'], capture_output=True,
                                 text=True, check=True).stdout
            return path, out.split()[-1]
    return None, None


class TestMetadataCache(LibvirtCase):

    def plan(self, host):
        return diskplan.make_plan(host.conf.prealloc_backend, {}, host.mode,
                                host.disk_format, host.disk_size,
                                host.fs_facts())

    def test_qcow2(self):
        # 1 TiB: more than QEMU's default L2 cache covers.
        host = self.host(disk_size=units.Ti)
        res = libvirtd.check_metadata_cache(host)
        cache = self.plan(host).metadata_cache_bytes
        self.assertIsNotNone(cache)
        self.assertEqual(cache, res.facts['metadata_cache_bytes'])
        daemon, version = libvirt_daemon_version()
        if daemon is None:
            self.assertEqual(libvirtd.result.Code.WARNING, res.code)
            self.assertIn('no libvirt daemon', res.details)
            return
        self.assertEqual(libvirtd.result.Code.SUCCESS, res.code, res.details)
        self.assertEqual(daemon, res.facts['libvirt_daemon'])
        self.assertEqual(version, res.facts['libvirt_version'])
        self.assertIn('(libvirt %s) honours it' % version, res.details)

    def test_cache_beyond_the_cap(self):
        # 64 TiB: no cache within 1 MiB covers it.
        host = self.host(disk_size=64 * units.Ti,
                         qcow2_metadata_cache_max_mb=1)
        res = libvirtd.check_metadata_cache(host)
        self.assertIsNone(self.plan(host).metadata_cache_bytes)
        self.assertEqual(libvirtd.result.Code.WARNING, res.code, res.details)
        self.assertIn('qcow2_metadata_cache_max_mb = 1', res.details)
        self.assertIn('Raise qcow2_metadata_cache_max_mb', res.fix)

    def test_default_cache_covers_a_small_disk(self):
        host = self.host()
        res = libvirtd.check_metadata_cache(host)
        self.assertIsNone(self.plan(host).metadata_cache_bytes)
        self.assertEqual(libvirtd.result.Code.SUCCESS, res.code, res.details)
        self.assertIn("QEMU's default L2 cache (32 MiB) covers it",
                      res.details)
        self.assertNotIn('libvirt_version', res.facts)

    def test_mode_none(self):
        host = self.host(mode='none', disk_size=units.Ti)
        self.assertIsNone(self.plan(host).metadata_cache_bytes)
        res = libvirtd.check_metadata_cache(host)
        self.assertIn('In mode none disks get no <metadata_cache>',
                      res.details)
        self.assertIsNotNone(res.facts['metadata_cache_bytes'])

    def test_qemu_default_cache(self):
        res = libvirtd.check_metadata_cache(
            self.host(qcow2_l2_cache='qemu-default', disk_size=units.Ti))
        self.assertEqual(libvirtd.result.Code.SUCCESS, res.code)
        self.assertIsNone(res.facts['metadata_cache_bytes'])
        self.assertIn("QEMU's default", res.details)

    def test_raw_disks(self):
        res = libvirtd.check_metadata_cache(self.host(images_type='raw'))
        self.assertEqual(libvirtd.result.Code.SUCCESS, res.code)
        self.assertIn('not qcow2', res.details)
