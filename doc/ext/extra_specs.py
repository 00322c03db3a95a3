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

"""Render the ``prealloc:`` flavor extra specs from their validators.

The same approach as nova's ``doc/ext/extra_specs.py``, which renders
nova's extra specs from ``nova.api.validation.extra_specs``: the page lists
what ``prealloc_backend.adapter.extra_specs.register()`` gives nova-api (name,
type, allowed values, description), so the documentation cannot drift from
what nova-api accepts. One directive, ``.. prealloc-extra-specs::``, and a
domain ``prealloc`` with ``.. prealloc:extra-spec::`` and the role
``:prealloc:extra-spec:`` to link to one key.
"""

from docutils import nodes
from docutils.parsers import rst
from docutils import statemachine
from sphinx import addnodes
from sphinx import directives as sphinx_directives
from sphinx import domains
from sphinx import roles
from sphinx.util import logging
from sphinx.util import nodes as sphinx_nodes

from prealloc_backend.adapter import extra_specs

LOG = logging.getLogger(__name__)

ID_PREFIX = 'extra-spec-'


def anchor(name):
    """The HTML id of extra spec ``name`` (``prealloc:mode`` ->
    ``extra-spec-prealloc:mode``).
    """
    return ID_PREFIX + name


class ExtraSpecXRefRole(roles.XRefRole):
    """``:prealloc:extra-spec:`prealloc:mode``` links to one key."""

    def __init__(self):
        super().__init__(warn_dangling=True)

    def process_link(self, env, refnode, has_explicit_title, title, target):
        return title, target


class ExtraSpecDirective(sphinx_directives.ObjectDescription):
    """One extra spec: ``.. prealloc:extra-spec:: prealloc:mode``."""

    def handle_signature(self, sig, signode):
        signode += addnodes.desc_name(sig, sig)
        signode['allnames'] = [sig]
        return sig

    def add_target_and_index(self, name, sig, signode):
        signode['ids'].append(anchor(sig))
        self.state.document.note_explicit_target(signode)
        self.env.domaindata['prealloc']['extra_specs'][sig] = (
            self.env.docname)


def _indent(text):
    return '    ' + text if text else text


def format_validator(validator):
    """reStructuredText lines for one validator: its name (parameters
    shown as ``{name}``), value type, allowed values, the description and
    each parameter's description.
    """
    value = validator.value
    yield '.. prealloc:extra-spec:: %s' % validator.name
    yield ''
    yield _indent(':Type: %s' % value['type'].__name__)
    if value.get('enum'):
        yield _indent(':Allowed values: %s' % ', '.join(
            '``%s``' % v for v in value['enum']))
    if value.get('min') is not None:
        yield _indent(':Min: %s' % value['min'])
    if value.get('max') is not None:
        yield _indent(':Max: %s' % value['max'])
    yield ''
    for line in validator.description.splitlines():
        yield _indent(line)
    yield ''
    for param in validator.parameters:
        yield _indent('``{%s}``: %s' % (param['name'],
                                       param['description']))
        yield ''
    if validator.deprecated:
        yield _indent('.. warning::')
        yield ''
        yield _indent(_indent('This extra spec is deprecated.'))
        yield ''


class ExtraSpecsDirective(rst.Directive):
    """Every validator of prealloc_backend.adapter.extra_specs, in the order
    ``register()`` returns them.
    """

    has_content = False

    def run(self):
        result = statemachine.ViewList()
        source = self.state.document.current_source
        validators = extra_specs.register()
        if not validators:
            LOG.warning('prealloc_backend.adapter.extra_specs.register() returned '
                        'no validator')
        count = 0
        for validator in validators:
            for line in format_validator(validator):
                result.append(line, source, count)
                count += 1
        node = nodes.section()
        node.document = self.state.document
        sphinx_nodes.nested_parse_with_titles(self.state, result, node)
        return node.children


class PreallocDomain(domains.Domain):
    """The ``prealloc`` domain: extra specs and links to them."""

    name = 'prealloc'
    label = 'prealloc_backend'
    object_types = {'extra-spec': domains.ObjType('extra spec',
                                                  'extra-spec')}
    directives = {'extra-spec': ExtraSpecDirective}
    roles = {'extra-spec': ExtraSpecXRefRole()}
    initial_data = {'extra_specs': {}}

    def clear_doc(self, docname):
        specs = self.data['extra_specs']
        for name in [n for n, doc in specs.items() if doc == docname]:
            del specs[name]

    def resolve_xref(self, env, fromdocname, builder, typ, target, node,
                     contnode):
        docname = self.data['extra_specs'].get(target)
        if typ != 'extra-spec' or docname is None:
            return None
        return sphinx_nodes.make_refnode(builder, fromdocname, docname,
                                         anchor(target), contnode, target)

    def merge_domaindata(self, docnames, otherdata):
        for target, docname in otherdata['extra_specs'].items():
            if docname in docnames:
                self.data['extra_specs'][target] = docname


def setup(app):
    app.add_domain(PreallocDomain)
    app.add_directive('prealloc-extra-specs', ExtraSpecsDirective)
    return {'parallel_read_safe': True, 'parallel_write_safe': True}
