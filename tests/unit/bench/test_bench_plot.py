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

"""prealloc_backend/bench/plot.py: the chart drawn for real with
matplotlib (installed by test-requirements) and its absence reported.
"""

import os
import sys
from unittest import mock

from prealloc_bench import plot
from tests import base


def result(*workloads):
    return {'run': 'quick', 'date': '2026-11-24',
            'host': {'hostname': 'h', 'filesystem': 'ext4'},
            'workloads': list(workloads)}


def workload(*cases):
    return {'title': 'W', 'unit': 'IOPS', 'higher_is_better': True,
            'cases': list(cases)}


def case(label, median, low, high, group='g'):
    return {'label': label, 'group': group, 'median': median, 'min': low,
            'max': high}


class PlotTestCase(base.TestCase):

    def test_missing(self):
        self.assertIsNone(plot.missing())
        # None in sys.modules makes the import fail, as without it.
        with mock.patch.dict(sys.modules, {'matplotlib': None}):
            self.assertIn('pip install matplotlib', plot.missing())

    def test_bars(self):
        w = workload(case('raw sparse', 10, 8, 11),
                     case('plugin space', None, None, None),
                     case('plugin metadata', 20, 20, 25, group='h'),
                     case('nova none', 1, 1, 1, group='default layout'),
                     case('nova none', 1, 1, 1, group='default layout, '
                          'beyond the backing file'))
        labels, medians, errors = plot._bars(w)
        # One line each, the group after the variant but for the default
        # layout's: they label horizontal bars, one under the other, so
        # they cannot overlap.
        self.assertEqual(['raw sparse (g)', 'plugin metadata (h)',
                          'nova none',
                          'nova none (beyond the backing file)'], labels)
        self.assertEqual([10, 20, 1, 1], medians)
        self.assertEqual([[2, 0, 0, 0], [1, 5, 0, 0]], errors)

    def test_headline_first(self):
        headline = {'name': 'new-cluster-write', 'cases': []}
        other = workload(case('raw sparse', 10, 8, 11))
        rows = [{'mode': 'none', 'x_nova': 1.0, 'x_raw': 0.5},
                {'mode': 'metadata', 'x_nova': 12.0, 'x_raw': 0.95},
                {'mode': 'full', 'x_nova': None, 'x_raw': None}]
        with mock.patch.object(plot.report, 'summary_rows',
                               return_value=rows):
            panels = plot._panels(result(other, headline))
        self.assertEqual(('headline', rows), panels[0])
        self.assertEqual([('workload', other)], panels[1:])
        self.assertEqual((['none', 'metadata', 'full'], [1.0, 12.0, 0],
                          [0.5, 0.95, 0]), plot._headline_bars(rows))

    def test_render_png(self):
        path = os.path.join(self.instances_path, 'c.png')
        plot.render(result(workload(case('raw sparse', 10, 8, 11)),
                           workload(case('nova none', None, None, None))),
                    path)
        with open(path, 'rb') as f:
            self.assertEqual(b'\x89PNG\r\n\x1a\n', f.read(8))
        exc = self.assertRaises(ValueError, plot.render, result(workload(
            case('x', None, None, None))), path + '2')
        self.assertIn('nothing was measured', str(exc))
        self.assertFalse(os.path.exists(path + '2'))
