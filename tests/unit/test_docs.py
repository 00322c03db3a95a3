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

"""The configuration and extra-spec pages list what the code accepts.

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
import io
import os
import shutil
import tempfile

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
        with open(os.path.join(ROOT, 'doc', 'source', 'admin',
                               'flavors.rst')) as f:
            lines = f.read().splitlines()
        prefix = 'Failed to set flavor properties: BadRequestException: 400:'
        shown = {}
        for index, line in enumerate(lines):
            if line.strip().startswith('$ openstack'):
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
