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

"""The committed sample configuration is what the generator produces.

The generator runs in-process with the repository's own generator
configuration (what ``tox -e genconfig`` runs), through the installed
``oslo.config.opts`` entry point; a difference means an option changed
without ``tox -e genconfig``.
"""

import configparser
import difflib
import os

import fixtures
from oslo_config import generator
from oslotest import base

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
GENERATOR_CONF = os.path.join(ROOT, 'etc',
                              'prealloc-backend-config-generator.conf')
SAMPLE = os.path.join(ROOT, 'etc', 'prealloc_backend.conf.sample')


class TestSampleConfig(base.BaseTestCase):

    def _generate(self):
        out = os.path.join(self.useFixture(fixtures.TempDir()).path,
                           'sample.conf')
        generator.main(['--config-file', GENERATOR_CONF,
                        '--output-file', out])
        with open(out) as f:
            return f.read()

    def test_sample_is_up_to_date(self):
        generated = self._generate()
        with open(SAMPLE) as f:
            committed = f.read()
        diff = ''.join(difflib.unified_diff(
            committed.splitlines(True), generated.splitlines(True),
            'etc/prealloc_backend.conf.sample (committed)', 'generated'))
        if committed != generated:
            self.fail('The sample configuration is out of date: run "tox -e '
                      'genconfig" and commit the result.\n' + diff)

    def test_generator_writes_the_committed_path(self):
        # tox -e genconfig runs the generator without --output-file.
        gen = configparser.ConfigParser()
        gen.read(GENERATOR_CONF)
        self.assertEqual('etc/prealloc_backend.conf.sample',
                         gen['DEFAULT']['output_file'])
        self.assertEqual(os.path.join(ROOT, gen['DEFAULT']['output_file']),
                         SAMPLE)

    def test_sample_documents_every_section_an_operator_sets(self):
        sample = configparser.ConfigParser(interpolation=None)
        sample.read(SAMPLE)
        self.assertIn('prealloc_backend', sample.sections())
        # The privsep daemon's section: helper_command is how deployments
        # without nova-rootwrap start it.
        self.assertIn('prealloc_backend_privsep', sample.sections())
        with open(SAMPLE) as f:
            text = f.read()
        for line in ('#mode = <None>', '#fallocate_unsupported = warn',
                     '#qcow2_cluster_size = 128K',
                     '#helper_command = <None>'):
            self.assertIn(line, text.splitlines())
