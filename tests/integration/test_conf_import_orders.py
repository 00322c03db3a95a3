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

"""Options: both import orders of nova's and the plugin's options load, in
a fresh Python each (an import order cannot be undone in this process).
"""

import subprocess
import sys

from tests import base


def _run(code):
    return subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True)


class TestImportOrders(base.TestCase):
    """Both import orders load, and preallocate_images stays nova's."""

    CHECK = (
        'import nova.conf.compute as c\n'
        'from prealloc_backend import conf as p\n'
        'opt = p.CONF._get_opt_info("preallocate_images")["opt"]\n'
        'assert opt is [o for o in c.ALL_OPTS\n'
        '               if o.name == "preallocate_images"][0], opt\n'
        'assert list(opt.type.choices) == ["none", "space"]\n'
        'assert "mode" in p.CONF.prealloc_backend\n'
        'print("ok")\n')

    def test_nova_first(self):
        proc = _run('import nova.conf\nimport prealloc_backend.conf\n' +
                    self.CHECK)
        self.assertEqual('ok', proc.stdout.strip(), proc.stderr)

    def test_plugin_first(self):
        proc = _run('import prealloc_backend.conf\nimport nova.conf\n' +
                    self.CHECK)
        self.assertEqual('ok', proc.stdout.strip(), proc.stderr)

    def test_driver_module_first(self):
        proc = _run('import prealloc_backend.adapter.driver\n'
                    'import nova.conf\n' +
                    self.CHECK)
        self.assertEqual('ok', proc.stdout.strip(), proc.stderr)
