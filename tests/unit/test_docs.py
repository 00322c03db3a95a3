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

"""The pages say what the code does, and their commands run.

TestDocCommands: every command a page shows in a literal block is run by a
test or by the cloud tier (doc/source/_examples/cloud, tools/doc_examples.py);
TestDocExamplesRunner: that runner compares output as it says.

The configuration and extra-spec pages list what the code accepts:

The two pages of doc/source/configuration (config.rst: the options;
extra-specs.rst: the flavor extra specs) are built with Sphinx's API, in
this process, into a temporary directory, with the extensions
``tox -e docs`` uses for them (oslo_config.sphinxext, doc/ext/extra_specs):
the page sources are the repository's own files. The built HTML is then
compared with ``prealloc_backend.conf.list_opts()`` and with the
``prealloc:`` validators nova-api registered
(nova.api.validation.extra_specs.validators, loaded from the plugin's entry
point). The theme is Sphinx's default: the theme is not what is tested.
"""

import html.parser
import importlib.util
import io
import os
import re
import shutil
import subprocess
import tempfile
import textwrap
from unittest import mock

import fixtures
from nova.api.validation.extra_specs import validators as nova_validators
from oslotest import base
from sphinx import application

from prealloc_backend.adapter import extra_specs
from prealloc_backend import conf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
DOC = os.path.join(ROOT, 'doc')
PAGES = ('configuration/config.rst', 'configuration/extra-specs.rst')

CONF_PY = """
import sys
sys.path.insert(0, %(ext)r)
extensions = ['oslo_config.sphinxext', 'extra_specs']
master_doc = 'index'
"""

INDEX = """
Test
====

.. toctree::

   configuration/config
   configuration/extra-specs
"""


class _Sections(html.parser.HTMLParser):
    """{id of a <dt>: text from that <dt> to the next <dt> with an id}."""

    def __init__(self):
        super().__init__()
        self.sections = {}
        self._current = None

    def handle_starttag(self, tag, attrs):
        ident = dict(attrs).get('id')
        if tag == 'dt' and ident:
            self._current = ident
            self.sections[ident] = ''

    def handle_data(self, data):
        if self._current:
            self.sections[self._current] += data


def build_pages(tmp):
    """Build PAGES from doc/source into ``tmp``; return {page: html}."""
    src = os.path.join(tmp, 'source')
    for page in PAGES:
        os.makedirs(os.path.dirname(os.path.join(src, page)), exist_ok=True)
        shutil.copy(os.path.join(DOC, 'source', page),
                    os.path.join(src, page))
    with open(os.path.join(src, 'conf.py'), 'w') as f:
        f.write(CONF_PY % {'ext': os.path.join(DOC, 'ext')})
    with open(os.path.join(src, 'index.rst'), 'w') as f:
        f.write(INDEX)
    out = os.path.join(tmp, 'html')
    # Links to the pages left out (:doc:`sample`...) only warn here.
    app = application.Sphinx(src, src, out, os.path.join(tmp, 'doctrees'),
                             'html', status=io.StringIO(),
                             warning=io.StringIO(), freshenv=True)
    app.build()
    pages = {}
    for page in PAGES:
        with open(os.path.join(out, page[:-len('.rst')] + '.html')) as f:
            pages[page] = f.read()
    return pages


def sections(page_html):
    parser = _Sections()
    parser.feed(page_html)
    return parser.sections


class TestConfigurationPages(base.BaseTestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        tmp = tempfile.mkdtemp(prefix='prealloc-docs-')
        try:
            cls.pages = build_pages(tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_every_option_of_list_opts_is_on_the_page(self):
        expected = {'%s.%s' % (group.name, opt.dest)
                    for group, opts in conf.list_opts() for opt in opts}
        self.assertIn('prealloc_backend.mode', expected)
        self.assertIn('prealloc_backend_privsep.helper_command', expected)
        shown = {ident for ident in
                 sections(self.pages['configuration/config.rst'])
                 if ident.split('.', 1)[0] in
                 {group.name for group, _opts in conf.list_opts()}}
        self.assertEqual(sorted(expected), sorted(shown))

    def test_every_option_is_shown_with_its_default(self):
        found = sections(self.pages['configuration/config.rst'])
        for group, opts in conf.list_opts():
            for opt in opts:
                if opt.default in (None, [], ''):
                    continue
                text = found['%s.%s' % (group.name, opt.dest)]
                default = opt.sample_default or opt.default
                if isinstance(default, list):
                    default = default[0]
                self.assertIn(str(default), text,
                              '%s.%s' % (group.name, opt.dest))

    def test_every_prealloc_key_nova_api_knows_is_on_the_page(self):
        # What nova-api validates: the validators it loaded from the
        # plugin's entry point, by name (a parameterised name such as
        # prealloc:{key} is one entry).
        registered = {name for name in nova_validators.VALIDATORS
                      if name.split(':', 1)[0] == extra_specs.NAMESPACE}
        self.assertIn('prealloc:mode', registered)
        self.assertIn('prealloc:cluster_size', registered)
        found = sections(self.pages['configuration/extra-specs.rst'])
        prefix = 'extra-spec-'
        shown = {ident[len(prefix):] for ident in found
                 if ident.startswith(prefix)}
        self.assertEqual(sorted(registered), sorted(shown))

    def test_every_accepted_value_is_on_the_page(self):
        found = sections(self.pages['configuration/extra-specs.rst'])
        checked = 0
        for validator in extra_specs.register():
            for value in validator.value.get('enum', ()):
                # accepted by nova-api (raises otherwise) ...
                nova_validators.validate(validator.name, value)
                # ... and listed under its key
                self.assertIn(value, found['extra-spec-' + validator.name],
                              validator.name)
                checked += 1
        self.assertGreaterEqual(checked, 10)


class TestFlavorRefusals(base.BaseTestCase):
    """admin/flavors.rst shows nova-api's refusals of a bad value and of an
    unknown key as the openstack client prints them: the messages are
    nova-api's own, as its registered validators make them today.
    """

    def _shown(self):
        # the session admin/flavors.rst includes (and the cloud tier runs)
        with open(os.path.join(ROOT, 'doc', 'source', '_examples', 'cloud',
                               'flavors-refusal.console')) as f:
            lines = f.read().splitlines()
        prefix = 'Failed to set flavor properties: BadRequestException: 400:'
        shown = {}
        for index, line in enumerate(lines):
            if line.startswith('$ openstack') and ' flavor set ' in line:
                prop = line.split('--property ')[1].split()[0]
                printed = lines[index + 1].strip()
                self.assertTrue(printed.startswith(prefix), printed)
                shown[prop] = printed.split(', ', 1)[1]
        return shown

    def test_messages_are_nova_api_s(self):
        shown = self._shown()
        self.assertEqual({'prealloc:mode=fast', 'prealloc:mdoe=full'},
                         set(shown))
        for prop, printed in shown.items():
            name, value = prop.split('=')
            try:
                nova_validators.validate(name, value)
            except Exception as exc:
                self.assertEqual(str(exc), printed)
            else:
                self.fail('nova-api accepts %s' % prop)


def _load_doc_examples():
    """tools/doc_examples.py (the cloud tier's runner of the pages' sessions)
    as a module: tools/ is no package.
    """
    spec = importlib.util.spec_from_file_location(
        'doc_examples', os.path.join(ROOT, 'tools', 'doc_examples.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


doc_examples = _load_doc_examples()
SOURCE = os.path.join(DOC, 'source')
# A literal block's line is a command when it is "$ COMMAND", or, in a
# block without prompts, when its first word is one of these.
COMMAND_WORDS = {
    '.', 'bash', 'find', 'git', 'nova-manage', 'nova-status', 'openstack',
    'oslo-config-generator', 'pip', 'pip3', 'prealloc-backend',
    'prealloc-nova-compute', 'prealloc-privsep-helper', 'python3', 'sudo',
    'systemctl', 'tox', 'virsh'}
# Commands a page shows in a literal block that run somewhere else than in
# a session of doc/source/_examples/cloud: {regex of the command:
# (file of the repository, text it must contain)}.
RUN_ELSEWHERE = {
    # .ci/run: the clean-clone CI run of contributor/testing.rst
    r'bash tools/quickstart': ('.ci/run', 'bash tools/quickstart'),
    r'bash tools/run-tests': ('.ci/run', 'bash tools/run-tests'),
    # tools/cloud-up installs the plugin from the clone with the same
    # constraints (uv pip install, not pip)
    r'pip install -c upper-constraints\.txt \.': (
        'tools/cloud-up', '-c "$TOP/upper-constraints.txt"'),
    # tools/quickstart installs both from the clone (uv pip install)
    r"pip install \. '\./bench\[plot\]'": (
        'tools/quickstart', '"$TOP/bench[plot]"'),
    # the integration tier runs the check command with these options (on
    # files of its own)
    r'prealloc-backend check --config-file /etc/nova/nova\.conf': (
        'tests/integration/test_check_command.py', "'--config-file'"),
    r'prealloc-backend check --config-file /etc/nova/nova\.conf '
    r'--config-dir /etc/nova/nova\.conf\.d --json': (
        'tests/integration/test_check_command.py', "'--config-dir'"),
    r'prealloc-backend check --disk-size 200G': (
        'tests/integration/test_check_command.py', "'--disk-size'"),
    r'prealloc-backend check --qemu-conf /etc/kolla/nova-libvirt/'
    r'qemu\.conf': (
        'tests/integration/test_check_command.py', "'--qemu-conf'"),
    # the plugin's Tempest test runs the command on a compute host of the
    # one-box cloud (PreallocAdoptTest), with nova-compute's configuration
    r'prealloc-backend adopt --config-file /etc/nova/nova\.conf '
    r'(--all --dry-run|--instance UUID)': (
        'tempest-plugin/prealloc_backend_tempest_plugin/tests/compute/'
        'test_prealloc_disks.py', "prealloc_backend_command, 'adopt'"),
    # the plugin's Tempest test runs it on both compute hosts of the cloud
    # (PreallocCapacityTest), with nova-compute's configuration
    r'prealloc-backend report --config-file /etc/nova/nova\.conf '
    r'--stdout': (
        'tempest-plugin/prealloc_backend_tempest_plugin/host.py',
        "prealloc_backend_command, 'report'"),
    # TestDocCommands.test_upgrade_leftovers_find below
    r"find /var/lib/nova/instances -name '\*\.prealloc-journal' "
    r"-o -name '\*\.prealloc-tmp'": (
        'tests/unit/test_docs.py', 'def test_upgrade_leftovers_find'),
}
# What no test runs yet, on pages this list does not own: {(page, command)}.
# Each is in the report of issue 34; a command that leaves its page must
# leave the list (test_not_covered_list_is_current).
NOT_COVERED = {
    ('admin/security.rst',
     'sudo -u nova prealloc-bench --dir /var/lib/nova/instances'),
    ('cli/prealloc-bench.rst',
     'prealloc-bench --quick --only create --dir /tmp/i22b '
     '--json /tmp/i22b.json'),
    ('cli/prealloc-backend-check.rst',
     'prealloc-backend check [--config-file PATH ...] '
     '[--config-dir DIR ...]'),
    ('cli/prealloc-backend-adopt.rst',
     'prealloc-backend adopt [--config-file PATH ...] '
     '[--config-dir DIR ...]'),
    ('cli/prealloc-backend-report.rst',
     'prealloc-backend report [--config-file PATH ...] '
     '[--config-dir DIR ...]'),
    ('cli/prealloc-nova-compute.rst',
     "prealloc-nova-compute [nova-compute's arguments]"),
    ('contributor/testing.rst',
     'python3 -m venv .venv && .venv/bin/pip install -c '
     'upper-constraints.txt -r tools/requirements.txt && .venv/bin/tox '
     '-e py3'),
}
LITERALINCLUDE = re.compile(r'^\s*\.\. literalinclude:: (\S+)\s*$')
CLOUD_EXAMPLES = '/_examples/cloud/'


def pages():
    """{page path under doc/source: its lines}."""
    found = {}
    for directory, _dirs, files in os.walk(SOURCE):
        for name in files:
            if name.endswith('.rst'):
                path = os.path.join(directory, name)
                with open(path) as f:
                    found[os.path.relpath(path, SOURCE)] = f.read(
                        ).splitlines()
    return found


def literal_blocks(lines):
    """[[line]] of the page's literal blocks (``::`` paragraphs and
    ``code-block``/``code`` directives), dedented.
    """
    blocks = []
    index = 0
    while index < len(lines):
        line = lines[index]
        stripped = line.strip()
        index += 1
        directive = re.match(r'\.\. (code-block|code|sourcecode)::', stripped)
        if not (directive or (stripped.endswith('::') and
                              not stripped.startswith('.. '))):
            continue
        indent = len(line) - len(line.lstrip())
        # a directive's options, then the blank line
        while directive and index < len(lines) and \
                lines[index].strip().startswith(':'):
            index += 1
        block = []
        while index < len(lines):
            text = lines[index]
            if text.strip() and len(text) - len(text.lstrip()) <= indent:
                break
            block.append(text)
            index += 1
        body = textwrap.dedent('\n'.join(block)).strip('\n')
        if body:
            blocks.append(body.splitlines())
    return blocks


def commands(block):
    """The command lines of a literal block."""
    if any(line.startswith('$ ') for line in block):
        found = [line[2:] for line in block if line.startswith('$ ')]
    else:
        found = [line for line in block
                 if line.strip() and line.split()[0] in COMMAND_WORDS]
    return [doc_examples.strip_comment(line) for line in found]


class TestDocCommands(base.BaseTestCase):
    """Every command a page shows is run by a test or by the cloud tier.

    A page's cloud commands are console sessions in doc/source/_examples/cloud
    that the page includes (literalinclude) and tools/cloud-tempest runs
    against the one-box cloud with tools/doc_examples.py, comparing the
    output with the page's; the commands that need no cloud are in
    RUN_ELSEWHERE, each with the file that runs it; NOT_COVERED lists, page
    by page, what nothing runs yet.
    """

    def setUp(self):
        super().setUp()
        self.pages = pages()
        self.assertIn('admin/flavors.rst', self.pages)

    def _shown_commands(self):
        shown = []
        for page, lines in sorted(self.pages.items()):
            for block in literal_blocks(lines):
                shown += [(page, command) for command in commands(block)]
        return shown

    def test_every_command_on_a_page_runs_somewhere(self):
        shown = self._shown_commands()
        # the inventory finds commands in both kinds of blocks
        self.assertIn(('contributor/testing.rst', 'bash tools/run-tests'),
                      shown)
        self.assertIn(('install/upgrade.rst', "find /var/lib/nova/instances "
                       "-name '*.prealloc-journal' -o -name "
                       "'*.prealloc-tmp'"), shown)
        uncovered = [
            (page, command) for page, command in shown
            if (page, command) not in NOT_COVERED and
            not any(re.fullmatch(pattern, command)
                    for pattern in RUN_ELSEWHERE)]
        self.assertEqual(
            [], uncovered,
            'commands that nothing runs: put them in a session of '
            'doc/source/_examples/cloud (literalinclude) or have a test run '
            'them (RUN_ELSEWHERE)')

    def test_not_covered_list_is_current(self):
        self.assertEqual(set(), NOT_COVERED - set(self._shown_commands()))

    def test_run_elsewhere_still_runs_them(self):
        for pattern, (path, text) in RUN_ELSEWHERE.items():
            with open(os.path.join(ROOT, path)) as f:
                self.assertIn(text, f.read(), pattern)

    def test_every_session_is_on_a_page_and_every_include_exists(self):
        included = set()
        for page, lines in self.pages.items():
            for line in lines:
                match = LITERALINCLUDE.match(line)
                if match and match.group(1).startswith(CLOUD_EXAMPLES):
                    name = match.group(1)[len(CLOUD_EXAMPLES):]
                    self.assertTrue(os.path.exists(
                        os.path.join(doc_examples.EXAMPLES, name)),
                        '%s includes %s' % (page, name))
                    included.add(name[:-len('.console')])
        sessions = set(doc_examples.sessions())
        self.assertIn('flavors-refusal', sessions)
        self.assertEqual(sessions, included)

    def test_sessions_parse_and_name_the_cloud_commands(self):
        for name in doc_examples.sessions():
            with open(os.path.join(doc_examples.EXAMPLES,
                                   name + '.console')) as f:
                steps = doc_examples.parse(f.read())
            self.assertTrue(steps, name)
            for step in steps:
                self.assertIn(step.command.split()[0], COMMAND_WORDS,
                              '%s: %s' % (name, step.command))

    def test_upgrade_leftovers_find(self):
        # install/upgrade.rst's command, on a directory of its own
        shown = [command for page, command in self._shown_commands()
                 if page == 'install/upgrade.rst' and
                 command.startswith('find ')]
        self.assertEqual(1, len(shown))
        tmp = tempfile.mkdtemp(prefix='prealloc-docs-')
        self.addCleanup(shutil.rmtree, tmp)
        for name in ('a/disk', 'a/disk.prealloc-journal',
                     'b/disk.prealloc-tmp', 'b/disk.info'):
            os.makedirs(os.path.join(tmp, os.path.dirname(name)),
                        exist_ok=True)
            open(os.path.join(tmp, name), 'w').close()
        out = subprocess.run(
            shown[0].replace('/var/lib/nova/instances', tmp), shell=True,
            check=True, stdout=subprocess.PIPE, universal_newlines=True)
        self.assertEqual(
            sorted(os.path.join(tmp, name) for name in
                   ('a/disk.prealloc-journal', 'b/disk.prealloc-tmp')),
            sorted(out.stdout.split()))


class TestDocExamplesRunner(base.BaseTestCase):
    """tools/doc_examples.py compares what a session prints with the page,
    here on sessions of a temporary directory run by the local bash.
    """

    def _run(self, console, setup=None, cleanup=None, openrc=None):
        tmp = tempfile.mkdtemp(prefix='prealloc-docs-')
        self.addCleanup(shutil.rmtree, tmp)
        for name, text in (('s.console', console), ('s.setup', setup),
                           ('s.cleanup', cleanup), ('openrc', openrc)):
            if text is not None:
                with open(os.path.join(tmp, name), 'w') as f:
                    f.write(text)
        self.useFixture(fixtures.MonkeyPatch(
            'tests.unit.test_docs.doc_examples.EXAMPLES', tmp))
        env = {'PATH': os.environ['PATH'], 'HOME': tmp}
        with mock.patch('builtins.print'):
            return doc_examples.run_session('s', tmp, env), tmp

    def test_output_and_environment_carry_over(self):
        failures, _tmp = self._run(
            '$ export GREETING=hello  # a comment\n'
            '# a comment line\n'
            '$ echo "$GREETING 3f2a-9c01 x/y"\n'
            'hello FLAVOR_ID ...\n'
            '$ bash tools/cloud-up\n')
        self.assertEqual([], failures)

    def test_sessions_start_with_the_cloud_s_openrc(self):
        failures, _tmp = self._run(
            '$ echo "$OS_CLOUD_NAME"\none-box\n', setup='[ -n "$OS_X" ]',
            cleanup='[ -n "$OS_X" ]',
            openrc='export OS_CLOUD_NAME=one-box OS_X=1\n')
        self.assertEqual([], failures)

    def test_other_output_fails(self):
        failures, _tmp = self._run('$ echo hello\nhallo\n')
        self.assertEqual(1, len(failures))
        self.assertIn("expected 'hallo', got 'hello'", failures[0])
        failures, _tmp = self._run('$ printf "a\\nb\\n"\na\n')
        self.assertIn('1 lines expected, 2 printed', failures[0])

    def test_failed_command_without_output_fails_and_cleanup_runs(self):
        failures, tmp = self._run('$ false\n$ touch "$HOME/never"\n',
                                  setup='touch "$HOME/set-up"',
                                  cleanup='touch "$HOME/cleaned"')
        self.assertEqual(1, len(failures))
        self.assertIn('exit status 1', failures[0])
        self.assertTrue(os.path.exists(os.path.join(tmp, 'set-up')))
        self.assertTrue(os.path.exists(os.path.join(tmp, 'cleaned')))
        self.assertFalse(os.path.exists(os.path.join(tmp, 'never')))
