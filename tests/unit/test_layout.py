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

import ast
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
    """False for an __init__.py holding only comments and a docstring."""
    with open(path) as f:
        body = ast.parse(f.read()).body
    return any(not (isinstance(node, ast.Expr) and
                    isinstance(node.value, ast.Constant))
               for node in body)


def mirror_of(relpath):
    """tests/unit's path for a module, from its path in the package: the
    same folder, ``test_`` and the module's name, prefixed where the
    folder's modules share names with other tiers' tests
    (``checks/owner.py`` -> ``checks/test_check_owner.py``,
    ``disk/qemu.py`` -> ``disk/test_qemu.py``, ``checks/__init__.py`` ->
    ``checks/test_checks.py``).
    """
    parts = relpath[:-len('.py')].split(os.sep)
    if len(parts) == 1:
        return 'test_%s.py' % parts[0]
    if len(parts) != 2:
        raise AssertionError('prealloc_backend/%s: no mirror rule for this '
                             'place (tests/unit/test_layout.py)' % relpath)
    folder, name = parts
    if name == '__init__':
        return os.path.join(folder, 'test_%s.py' % folder)
    if folder in PREFIX:
        return os.path.join(folder, 'test_%s_%s.py' % (PREFIX[folder], name))
    return os.path.join(folder, 'test_%s.py' % name)


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
        self.assertEqual('test_sizes.py', mirror_of('sizes.py'))
        self.assertEqual('checks/test_check_owner.py',
                         mirror_of('checks/owner.py'))
        self.assertEqual('disk/test_qemu.py', mirror_of('disk/qemu.py'))
        self.assertEqual('checks/test_checks.py',
                         mirror_of('checks/__init__.py'))
        self.assertEqual('cmd/test_cmd_check.py', mirror_of('cmd/check.py'))
        self.assertRaises(AssertionError, mirror_of, 'disk/a/b.py')

    def test_every_module_has_its_mirror(self):
        unit = os.path.join(TOP, 'tests', 'unit')
        found = modules()
        self.assertIn('system/fileops.py', found)
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
