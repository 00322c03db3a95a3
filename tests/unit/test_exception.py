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

"""prealloc_backend/exception.py: every class's message names its values,
rebuilds from the message alone (as oslo.privsep re-raises a daemon's
error: ``import_class(name)(*args)``) and is the nova exception nova
expects.
"""

import ast
import inspect
import re

from nova import exception as nova_exception
from oslo_utils import importutils
from oslotest import base

from prealloc_backend import exception
from tests import fixtures as pb_fixtures

KEY = re.compile(r'%\((\w+)\)([sdr])')


def classes():
    return [cls for _name, cls in inspect.getmembers(exception,
                                                       inspect.isclass)
            if cls.__module__ == exception.__name__]


def values_for(cls):
    """Keyword arguments for every key of cls.msg_fmt, each unmistakable
    in the message.
    """
    kwargs = {}
    for index, (key, conv) in enumerate(KEY.findall(cls.msg_fmt)):
        kwargs[key] = 7000 + index if conv == 'd' else 'val-%s' % key
    return kwargs


class ExceptionTestCase(base.BaseTestCase):

    def test_every_class_is_a_nova_exception_with_its_values(self):
        found = classes()
        self.assertGreater(len(found), 15)
        for cls in found:
            self.assertTrue(issubclass(cls, nova_exception.NovaException),
                            cls)
            kwargs = values_for(cls)
            self.assertTrue(kwargs, '%s: a message naming no value' % cls)
            message = str(cls(**kwargs))
            self.assertNotIn('%(', message, cls)
            for value in kwargs.values():
                self.assertIn(str(value), message, cls)

    def test_every_value_raised_with_is_in_the_message(self):
        # Each keyword a raise site of the package passes is shown in the
        # message (a value dropped from msg_fmt would go unseen).
        by_name = {cls.__name__: cls for cls in classes()}
        seen = 0
        for path, tree in pb_fixtures.package_trees():
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and
                        isinstance(node.func, ast.Attribute) and
                        isinstance(node.func.value, ast.Name) and
                        node.func.value.id == 'exception' and
                        node.func.attr in by_name):
                    continue
                cls = by_name[node.func.attr]
                keys = {k for k, _c in KEY.findall(cls.msg_fmt)}
                for kw in node.keywords:
                    if kw.arg is None or isinstance(
                            getattr(cls, kw.arg, None), property):
                        continue  # kept as an attribute (stdout)
                    seen += 1
                    self.assertIn(kw.arg, keys, '%s:%d %s(%s=...) is '
                                  'not in its message' % (
                                      path, node.lineno, cls.__name__,
                                      kw.arg))
        self.assertGreater(seen, 50)

    def test_rebuilt_from_the_message_alone(self):
        # oslo_privsep.daemon: the client raises
        # importutils.import_class(module.name)(*exc.args).
        for cls in classes():
            exc = cls(**values_for(cls))
            name = '%s.%s' % (cls.__module__, cls.__name__)
            rebuilt = importutils.import_class(name)(*exc.args)
            self.assertIs(cls, type(rebuilt))
            self.assertEqual(str(exc), str(rebuilt), cls)

    def test_kinds(self):
        # What nova and oslo.config make of each: Invalid is a 400 for the
        # API, InvalidDiskInfo what nova raises for a disk it will not open.
        for cls in (exception.InvalidPreallocMode,
                    exception.InvalidFlavorPolicy, exception.InvalidOption,
                    exception.ConflictingOptions, exception.InvalidPath,
                    exception.InvalidSize, exception.DiskOwnedByRoot):
            self.assertTrue(issubclass(cls, nova_exception.Invalid), cls)
            self.assertEqual(400, cls.code, cls)
        self.assertTrue(issubclass(exception.InvalidOption, ValueError))
        for cls in (exception.DiskFormatMismatch,
                    exception.UnsafeDiskHeader):
            self.assertTrue(issubclass(cls, nova_exception.InvalidDiskInfo))
        self.assertTrue(issubclass(exception.QemuImgError,
                                   exception.ProcessFailed))
        self.assertTrue(issubclass(exception.AllocationOutOfSpace,
                                   exception.AllocationFailed))

    def test_process_failed_fields(self):
        exc = exception.ProcessFailed(cmd='qemu-img info x', exit_code=-9,
                                      stderr='boom', stdout='out')
        self.assertEqual(('qemu-img info x', -9, 'boom', 'out'),
                         (exc.cmd, exc.exit_code, exc.stderr, exc.stdout))
        self.assertEqual('qemu-img info x failed with exit code -9: boom',
                         str(exc))

    def test_process_failed_without_error_output(self):
        exc = exception.QemuImgError(cmd='qemu-img check d', exit_code=3,
                                     stderr='')
        self.assertEqual('qemu-img check d failed with exit code 3 and no '
                         'error output', str(exc))
        rebuilt = exception.QemuImgError(*exc.args)
        self.assertEqual(str(exc), str(rebuilt))
        self.assertIsNone(rebuilt.exit_code)

    def test_process_timeout_names_command_and_limit(self):
        exc = exception.ProcessTimeout(cmd='cp a b', timeout=30)
        self.assertEqual('cp a b', exc.cmd)
        self.assertEqual('cp a b did not finish within 30 s; it was killed',
                         str(exc))
