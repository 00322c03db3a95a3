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

"""What each test tier needs from the machine, checked once per tier.

Each tier package (tests/unit, tests/integration, tests/privileged,
tests/functional, tests/functional/real, and the benchmark's
bench/prealloc_bench/tests) hands its discovery to
``load_tier`` through the ``load_tests`` protocol. When the machine lacks
something the tier needs (a command, root, a Python module, a libvirtd
that answers), the tier's tests are not loaded at all: only its
``<tier>.Prerequisites.test_prerequisites`` test is, and it reports ONE
line naming what is missing, the Debian package and the command that
installs it. It fails under ``CI=true`` (a tier never skips silently in
CI) and skips otherwise (a user without root or libvirt can still run the
other tiers). When nothing is missing, that test passes and the tier's
tests run after it.

``python -m tests.prereq [TIER...]`` prints the same lines.
"""

import os
import shutil
import subprocess
import sys
import unittest

# NOTE(unittest): unittest and testtools leave frames of modules that set this
# out of the tracebacks they print, so that a failing stand-in prints its one
# line.
__unittest = True

ROOT = 'root'
LIBVIRTD = 'libvirtd'
URI = 'qemu:///system'
INSTALL_HINT = 'bash tools/run-tests installs all of them'

# command -> Debian package that ships it.
PACKAGES = {
    'qemu-img': 'qemu-utils',
    'qemu-io': 'qemu-utils',
    'fallocate': 'util-linux',
    'mkswap': 'util-linux',
    'losetup': 'mount',
    'mount': 'mount',
    'umount': 'mount',
    'filefrag': 'e2fsprogs',
    'mkfs.ext4': 'e2fsprogs',
    'e2label': 'e2fsprogs',
    'mkfs.xfs': 'xfsprogs',
    'useradd': 'passwd',
    'virt-xml-validate': 'libvirt-clients',
    'xmllint': 'libxml2-utils',
    'virsh': 'libvirt-clients',
    'qemu-system-x86_64': 'qemu-system-x86',
    'busybox': 'busybox-static',
    'dpkg-deb': 'dpkg',
}
# Commands of the tier's own virtualenv (installed with the Python
# requirements, never by apt): name -> pip package.
VENV_COMMANDS = {
    'privsep-helper': 'oslo.privsep',
}
# Python modules a tier imports that tox installs: module -> (pip
# package, Debian packages its build needs).
MODULES = {
    'libvirt': ('libvirt-python',
                'libvirt-dev pkg-config gcc libc6-dev python3-dev'),
}

# e2label: nova's disk.extend runs it when a raw disk grows.
COMMON = ('qemu-img', 'qemu-io', 'fallocate', 'filefrag', 'e2label',
          'privsep-helper')
LOOP = ('mkfs.ext4', 'mkfs.xfs', 'mount', 'umount', 'losetup')

# tier package -> (what it needs, what it needs only when run as root).
TIERS = {
    'tests.unit': (COMMON, ()),
    # The benchmark's unit tests, in its own distribution (tox -e bench).
    'prealloc_bench.tests': (COMMON, ()),
    'tests.integration': (COMMON, ()),
    'tests.privileged': ((ROOT,) + COMMON + LOOP + ('useradd',), ()),
    'tests.functional': (
        COMMON + ('mkfs.ext4', 'mkswap', 'virt-xml-validate', 'xmllint'),
        ()),
    'tests.functional.real': (
        (ROOT, 'qemu-img', 'virsh', 'qemu-system-x86_64', 'busybox',
         'dpkg-deb', 'libvirt', LIBVIRTD), ()),
}

WHY_ROOT = {
    'tests.privileged': 'loop mounts, the real privsep daemon, useradd',
    'tests.functional.real': 'QEMU runs as root under the test-box '
                             'qemu.conf of .ci/libvirt-up',
}
RUN_AS_ROOT = {
    'tests.privileged': 'tox -e privileged',
    'tests.functional.real': 'tox -e functional-real',
}


def _which(command):
    # The PATH the tests see (tox.ini adds the sbin directories,
    # which Debian leaves out of a user's PATH).
    return shutil.which(command)


def _libvirtd_answers():
    """None when a libvirtd answers on URI, else what virsh said."""
    try:
        proc = subprocess.run(['virsh', '-c', URI, 'version'],
                              capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return 'virsh -c %s version did not answer in 30 s' % URI
    if proc.returncode == 0:
        return None
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1].strip() if lines else 'exit code %d' % proc.returncode


def problem(tier):
    """None when this machine can run ``tier``, else one line saying what
    is missing and how to install it.
    """
    needs, root_needs = TIERS[tier]
    if ROOT in needs and os.geteuid() != 0:
        return ('%s needs root (%s): run `%s` as root' %
                (tier, WHY_ROOT[tier], RUN_AS_ROOT[tier]))
    if os.geteuid() == 0:
        needs = needs + root_needs
    missing, packages = [], []
    for need in needs:
        if need in PACKAGES and not _which(need):
            missing.append('%s (%s)' % (need, PACKAGES[need]))
            if PACKAGES[need] not in packages:
                packages.append(PACKAGES[need])
    for need in needs:
        if need in VENV_COMMANDS and not os.access(
                os.path.join(os.path.dirname(sys.executable), need),
                os.X_OK):
            return ('%s needs %s in %s: `pip install %s` there (tox '
                    'installs it)' % (tier, need,
                                      os.path.dirname(sys.executable),
                                      VENV_COMMANDS[need]))
    if missing:
        return ('%s needs %s: apt-get install -y %s (%s)' %
                (tier, ', '.join(missing), ' '.join(packages),
                 INSTALL_HINT))
    for need in needs:
        if need in MODULES:
            try:
                __import__(need)
            except ImportError:
                pip_name, build = MODULES[need]
                return ('%s needs the %s Python module: apt-get install -y '
                        '%s, then `pip install %s` in the test '
                        'virtualenv (tox does)' % (tier, need, build,
                                                   pip_name))
    if LIBVIRTD in needs:
        why = _libvirtd_answers()
        if why:
            return ('%s needs a libvirtd answering on %s (%s): as root, '
                    '`PREALLOC_REAL_LIBVIRT=1 bash .ci/libvirt-up` sets '
                    'one up (libvirt-daemon-system, a test-box qemu.conf; '
                    '`bash .ci/libvirt-down` undoes it), or bash '
                    'tools/run-tests does both' % (tier, URI, why))
    return None


def _prerequisites_test(tier, message):
    """``<tier>.Prerequisites.test_prerequisites``: passes when ``message``
    is None, else fails (CI=true) or skips with it.
    """
    in_ci = os.environ.get('CI') == 'true'

    def test_prerequisites(self):
        if message is None:
            return
        if in_ci:
            raise self.failureException('CI=true: %s' % message)
        self.skipTest(message)

    cls = type('Prerequisites', (unittest.TestCase,),
               {'test_prerequisites': test_prerequisites,
                '__module__': tier})
    return cls('test_prerequisites')


def load_tier(tier, loader, standard_tests, pattern):
    """``load_tests`` of a tier package: its prerequisites test, then its
    tests when nothing is missing.
    """
    message = problem(tier)
    suite = loader.suiteClass([_prerequisites_test(tier, message)])
    if message is None:
        here = os.path.dirname(os.path.abspath(sys.modules[tier].__file__))
        suite.addTests(standard_tests)
        suite.addTests(loader.discover(start_dir=here,
                                       pattern=pattern or 'test*.py'))
    return suite


def main(argv):
    tiers = argv or sorted(TIERS)
    status = 0
    for tier in tiers:
        message = problem(tier)
        print(message or '%s: every prerequisite is here' % tier)
        status = status or (1 if message else 0)
    return status


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
