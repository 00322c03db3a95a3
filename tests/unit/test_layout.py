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

"""The tests' layout (doc/source/contributor/testing.rst, "Where a test
lives"): every module of prealloc_backend has its mirror
tests/unit/test_<module>.py, and no test file's name repeats across tiers.
No exceptions are listed: a new module comes with its mirror.
"""

import os

from oslotest import base

import prealloc_backend

TOP = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
PACKAGE = os.path.dirname(os.path.abspath(prealloc_backend.__file__))
# A subpackage's modules: test_<prefix>_<module>.py; its __init__.py (when
# it holds code): test_<subpackage>.py.
PREFIX = {'bench': 'bench', 'checks': 'check', 'cmd': 'cmd',
          'privsep': 'privsep'}


def has_code(path):
    """False for an empty __init__.py (or one holding only comments)."""
    with open(path) as f:
        return any(line.strip() and not line.lstrip().startswith('#')
                   for line in f)


def mirror_of(relpath):
    """tests/unit's file name for a module, from its path in the package
    (``checks/owner.py`` -> ``test_check_owner.py``).
    """
    parts = relpath[:-len('.py')].split(os.sep)
    if len(parts) == 1:
        return 'test_%s.py' % parts[0]
    if len(parts) == 2 and parts[1] == '__init__':
        return 'test_%s.py' % parts[0]
    if len(parts) == 2 and parts[0] in PREFIX:
        return 'test_%s_%s.py' % (PREFIX[parts[0]], parts[1])
    raise AssertionError('prealloc_backend/%s: no mirror rule for this '
                         'place (tests/unit/test_layout.py PREFIX)' % relpath)


def modules():
    """Paths, relative to the package, of its modules that hold code."""
    found = []
    for directory, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != '__pycache__')
        for name in sorted(files):
            path = os.path.join(directory, name)
            if name.endswith('.py') and (name != '__init__.py' or
                                         has_code(path)):
                found.append(os.path.relpath(path, PACKAGE))
    return found


def test_files():
    """{basename: [paths relative to tests/]} of every test_*.py."""
    found = {}
    for directory, dirs, files in os.walk(os.path.join(TOP, 'tests')):
        dirs[:] = [d for d in dirs if d != '__pycache__']
        for name in files:
            if name.startswith('test_') and name.endswith('.py'):
                found.setdefault(name, []).append(os.path.relpath(
                    os.path.join(directory, name), TOP))
    return found


class LayoutTestCase(base.BaseTestCase):

    def test_mirror_rule(self):
        self.assertEqual('test_fileops.py', mirror_of('fileops.py'))
        self.assertEqual('test_check_owner.py', mirror_of('checks/owner.py'))
        self.assertEqual('test_bench_engine.py',
                         mirror_of('bench/engine.py'))
        self.assertEqual('test_checks.py', mirror_of('checks/__init__.py'))
        self.assertEqual('test_cmd_check.py', mirror_of('cmd/check.py'))
        self.assertRaises(AssertionError, mirror_of, 'new/thing.py')
        self.assertRaises(AssertionError, mirror_of, 'bench/a/b.py')

    def test_every_module_has_its_mirror(self):
        unit = os.path.join(TOP, 'tests', 'unit')
        found = modules()
        self.assertIn('fileops.py', found)
        missing = ['prealloc_backend/%s -> tests/unit/%s' % (m, mirror_of(m))
                   for m in found
                   if not os.path.exists(os.path.join(unit, mirror_of(m)))]
        self.assertEqual([], missing, 'modules without their mirror test')

    def test_no_two_modules_share_a_mirror(self):
        by_mirror = {}
        for m in modules():
            by_mirror.setdefault(mirror_of(m), []).append(m)
        shared = {k: v for k, v in by_mirror.items() if len(v) > 1}
        self.assertEqual({}, shared)

    def test_no_test_file_name_repeats_across_tiers(self):
        repeated = {name: sorted(paths)
                    for name, paths in test_files().items()
                    if len(paths) > 1}
        self.assertEqual({}, repeated, 'a test file name means one thing '
                         'across tiers: rename the other tiers\' files for '
                         'what they prove')
