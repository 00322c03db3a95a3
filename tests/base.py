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

"""Base test case: real temporary instances_path, real qemu-img."""

import os

import fixtures
from nova import objects
from oslo_config import fixture as config_fixture
from oslo_utils import uuidutils
from oslotest import base

from prealloc_backend import conf
from prealloc_backend import fsprobe
from tests import fixtures as pb_fixtures

objects.register_all()

CONF = conf.CONF


class TestCase(base.BaseTestCase):
    """oslotest's base (timeout, temp files, log capture) plus a temporary
    instances_path, the plugin's options reset after each test and its
    privsep entrypoints in-process.
    """

    def setUp(self):
        super().setUp()
        self.flags_fixture = self.useFixture(config_fixture.Config(CONF))
        self.instances_path = self.useFixture(fixtures.TempDir()).path
        self.flags(instances_path=self.instances_path)
        self.useFixture(pb_fixtures.PrivsepInProcess())
        fsprobe.forget()
        self.addCleanup(fsprobe.forget)

    def flags(self, group=None, **kw):
        for name, value in kw.items():
            self.flags_fixture.config(group=group, **{name: value})

    def make_instance(self, extra_specs=None, **flavor_fields):
        flavor = objects.Flavor(extra_specs=dict(extra_specs or {}),
                                **flavor_fields)
        return objects.Instance(uuid=uuidutils.generate_uuid(),
                                flavor=flavor)

    def use_loop_fs(self, kind, size_mb):
        pb_fixtures.skip_unless_root(self)
        fs = self.useFixture(pb_fixtures.LoopFilesystem(kind, size_mb))
        self.flags(instances_path=fs.path)
        self.instances_path = fs.path
        return fs

    def base_path(self, name):
        base_dir = os.path.join(self.instances_path, '_base')
        os.makedirs(base_dir, exist_ok=True)
        return os.path.join(base_dir, name)
