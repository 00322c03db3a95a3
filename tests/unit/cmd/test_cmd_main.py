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

"""prealloc_backend/cmd/main.py: ``prealloc-backend COMMAND`` hands the
rest of the line to that command's module, in this process (the command
run as operators run it is in tests/integration).
"""

import io

import fixtures

from prealloc_backend.cmd import main as cmd_main
from tests import base


class MainTestCase(base.TestCase):

    def run_main(self, argv):
        out, err = io.StringIO(), io.StringIO()
        self.useFixture(fixtures.MonkeyPatch('sys.stdout', out))
        self.useFixture(fixtures.MonkeyPatch('sys.stderr', err))
        try:
            rc = cmd_main.main(argv)
        except SystemExit as exc:
            rc = exc.code
        return rc, out.getvalue(), err.getvalue()

    def test_subcommands(self):
        parser = cmd_main.build_parser()
        self.assertEqual({'check', 'adopt', 'report'},
                         set(cmd_main.SUBCOMMANDS))
        args = parser.parse_args(['check'])
        self.assertEqual(('check', 'prealloc_backend.cmd.check'),
                         (args.command, args.module))

    def test_a_command_is_required(self):
        rc, _out, err = self.run_main([])
        self.assertEqual(2, rc)
        self.assertIn('the following arguments are required: COMMAND', err)
        rc, _out, err = self.run_main(['nope'])
        self.assertEqual(2, rc)
        self.assertIn("invalid choice: 'nope'", err)

    def test_the_command_parses_its_own_options(self):
        rc, out, _err = self.run_main(['check', '--help'])
        self.assertEqual(0, rc)
        self.assertIn('usage: prealloc-backend check', out)
        self.assertIn('--disk-size', out)
        self.assertIn(cmd_main.SUBCOMMANDS['check'], ' '.join(out.split()))
        rc, _out, err = self.run_main(['check', '--no-such-option'])
        self.assertEqual(2, rc)
        self.assertIn('prealloc-backend check', err)

    def test_the_command_runs_with_its_arguments(self):
        # check's own verdict on its arguments, before any check.
        rc, out, err = self.run_main(['check', '--disk-size', 'big'])
        self.assertEqual(2, rc, err)
        self.assertEqual('', out)
        self.assertIn("'big' is not a size", err)
