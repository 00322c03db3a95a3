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

"""Sphinx configuration of prealloc_backend's documentation.

Built by ``tox -e docs`` (``sphinx-build -W --keep-going``: a warning
fails the build). The options, the sample configuration, the flavor extra
specs, the commands' arguments and the module reference are rendered from
the code; the pages do not repeat them.
"""

import os
import sys

# doc/ext: the extra-spec directive (extra_specs.py) and the argparse
# parsers of the commands (cli_parsers.py).
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__),
                                                '..', 'ext')))

extensions = [
    'openstackdocstheme',
    'oslo_config.sphinxext',
    'oslo_config.sphinxconfiggen',
    'sphinx.ext.autodoc',
    'sphinxarg.ext',
    'extra_specs',
]

# oslo_config.sphinxconfiggen: writes _static/prealloc_backend.conf.sample
# from the same generator file as ``tox -e genconfig``.
config_generator_config_file = (
    '../../etc/prealloc-backend-config-generator.conf')
sample_config_basename = '_static/prealloc_backend'

# openstackdocstheme
openstackdocs_repo_name = 'openstack/prealloc-backend'
openstackdocs_use_storyboard = False
openstackdocs_auto_name = False
openstackdocs_pdf_link = False

project = 'prealloc_backend'
copyright = 'prealloc_backend developers'

source_suffix = {'.rst': 'restructuredtext'}
master_doc = 'index'
exclude_patterns = []
pygments_style = 'native'
add_module_names = False

# autodoc: the modules' opening docstrings (what each module does, and
# as which user it runs); the code's own docstrings are read in the code.
autodoc_default_options = {}

html_theme = 'openstackdocs'
html_static_path = ['_static']
