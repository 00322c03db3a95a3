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

"""The plugin's privsep context as a fresh process (the daemon) reads it."""

import os
import subprocess
import sys

from oslo_privsep import capabilities

from tests import base


class CapabilitiesTestCase(base.TestCase):

    def test_exactly_dac_override(self):
        # The daemon opens disks that libvirt may have chown'ed to the
        # qemu user (mode 0600): CAP_DAC_OVERRIDE and nothing else. The
        # context stores it as the default of its section's option, which
        # is what a fresh process (the daemon) reads; this test process's
        # configuration fixtures reset option defaults, so ask a fresh one.
        out = subprocess.run(
            [sys.executable, '-c',
             'from oslo_config import cfg\n'
             'import prealloc_backend.privsep as p\n'
             'print(p.ctx.cfg_section, '
             'cfg.CONF[p.ctx.cfg_section].capabilities)'],
            env=dict(os.environ, OS_NOVA_DISABLE_EVENTLET_PATCHING='true'),
            capture_output=True, text=True, check=True).stdout.split()
        self.assertEqual(['prealloc_backend_privsep',
                          '[%d]' % capabilities.CAP_DAC_OVERRIDE], out)
