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

"""bench/prealloc_bench/plot.py: its few, normalised bars per panel, the
chart drawn for real with matplotlib (the bench's plot extra, installed
by tox) and its absence reported.
"""

import os
import sys
from unittest import mock

from prealloc_bench import engine
from prealloc_bench import plot
from prealloc_bench import report
from prealloc_bench import variants
from tests import base


def result(*workloads):
    return {'run': 'quick', 'date': '2026-11-24', 'config': {},
            'host': {'hostname': 'h', 'filesystem': 'ext4'},
            'workloads': list(workloads)}


def case(variant, median, group=engine.DEFAULT_GROUP, samples=None):
    out = {'variant': variant, 'label': variants.by_key(variant).label,
           'group': group, 'samples': samples or [median]}
    out.update(engine.summary(out['samples']) if median is not None else
               {'median': None})
    return out


def workload(*cases, references=('raw-fallocated', 'raw-zero-written',
                                  'nova-none', 'nova-space'), **kw):
    w = dict({'name': 'w', 'title': 'W', 'unit': 'IOPS',
              'higher_is_better': True, 'references': list(references),
              'cases': list(cases)}, **kw)
    report.add_ratios(w)
    return w


def writes():
    """Every row of a first-write workload, the default layout and beyond
    the backing file: nova's overlay at 100.
    """
    rows = []
    for group in (engine.DEFAULT_GROUP, engine.BEYOND_GROUP):
        rows += [case('raw-fallocated', 500, group),
                 case('raw-zero-written', 600, group),
                 case('nova-none', 100, group),
                 case('nova-space', 90, group),
                 case('plugin-none', 100, group),
                 case('plugin-metadata', 1000, group),
                 case('plugin-space', 200, group),
                 case('plugin-full', None, group),
                 case('raw-sparse', 800, group)]
    return workload(*rows)


class PlotTestCase(base.TestCase):

    def test_missing(self):
        self.assertIsNone(plot.missing())
        # None in sys.modules makes the import fail, as without it.
        with mock.patch.dict(sys.modules, {'matplotlib': None}):
            self.assertIn('pip install matplotlib', plot.missing())
            self.assertIn('prealloc-backend-bench[plot]', plot.missing())

    def test_bars_few_and_normalised(self):
        group, reference, labels, ratios, errors = plot._bars(writes())
        # The default layout only, over nova's overlay: its limit (the
        # first raw file), nova space and the plugin's measured modes; not
        # the reference itself, the other raw files or the other group.
        self.assertEqual((engine.DEFAULT_GROUP, 'nova-none'),
                         (group, reference))
        self.assertEqual(['raw fallocated', 'nova space', 'plugin none',
                          'plugin metadata', 'plugin space'], labels)
        self.assertEqual([5.0, 0.9, 1.0, 10.0, 2.0], ratios)
        # One repetition: no whiskers.
        self.assertEqual([[0] * 5, [0] * 5], errors)

    def test_whiskers_of_the_paired_ratios(self):
        w = workload(case('nova-none', 100, samples=[100, 100, 200]),
                     case('plugin-metadata', 1000,
                          samples=[1000, 800, 1000]))
        _group, _ref, labels, ratios, errors = plot._bars(w)
        # Ratios 10, 8 and 5: median 8, whiskers down 3, up 2.
        self.assertEqual((['plugin metadata'], [8.0]), (labels, ratios))
        self.assertEqual([[3.0], [2.0]], errors)

    def test_panel_group_and_reference(self):
        warm, cold = '1 TiB, warm: second pass', '1 TiB, cold: first pass'
        reads = workload(case('raw-sparse', 50, cold),
                         case('nova-none', 100, cold),
                         case('raw-sparse', 80, warm),
                         case('nova-none', 100, warm),
                         case('plugin-metadata', 90, warm),
                         references=('raw-sparse', 'nova-none'),
                         warm_group=warm)
        self.assertEqual((warm, 'nova-none', ['raw sparse',
                                              'plugin metadata'],
                          [0.8, 0.9]), plot._bars(reads)[:4])
        # No default layout: the group with the most measured rows.
        create = workload(case('nova-none', 1, '1 TiB'),
                          case('plugin-none', 1, '1 TiB'),
                          case('raw-fallocated', 0.01, '10 GiB'),
                          case('nova-none', 0.5, '10 GiB'),
                          case('plugin-none', 0.5, '10 GiB'),
                          references=('nova-none',))
        self.assertEqual(('10 GiB', ['raw fallocated', 'plugin none'],
                          [0.02, 1.0]),
                         (plot._bars(create)[0], plot._bars(create)[2],
                          plot._bars(create)[3]))
        # Without nova's overlay, over the raw reference.
        extents = workload(case('raw-fallocated', 1, ''),
                           case('plugin-none', 4, ''),
                           references=('raw-fallocated',))
        self.assertEqual(('raw-fallocated', ['plugin none'], [4.0]),
                         (plot._bars(extents)[1], plot._bars(extents)[2],
                          plot._bars(extents)[3]))
        # Nothing to divide by: no panel.
        self.assertIsNone(plot._bars(workload(case('plugin-none', 4))))

    def test_headline_first(self):
        headline = {'name': 'new-cluster-write', 'cases': []}
        other = writes()
        rows = [{'mode': 'none', 'x_nova': 1.0, 'x_raw': 0.5},
                {'mode': 'metadata', 'x_nova': 12.0, 'x_raw': 0.95},
                {'mode': 'full', 'x_nova': None, 'x_raw': None}]
        with mock.patch.object(plot.report, 'summary_rows',
                               return_value=rows):
            panels = plot._panels(result(other, headline))
        self.assertEqual(('headline', rows), panels[0])
        self.assertEqual([('workload', (other, plot._bars(other)))],
                         panels[1:])
        self.assertEqual((['none', 'metadata', 'full'], [1.0, 12.0, 0],
                          [0.5, 0.95, 0]), plot._headline_bars(rows))

    def test_ratio_labels(self):
        self.assertEqual(['0.037x', '0.91x', '1.04x', '12x'],
                         [plot._fmt(r) for r in (0.0371, 0.912, 1.04,
                                                 12.4)])

    def test_render_png(self):
        path = os.path.join(self.instances_path, 'c.png')
        plot.render(result(writes(), workload(case('nova-none', None))),
                    path)
        with open(path, 'rb') as f:
            self.assertEqual(b'\x89PNG\r\n\x1a\n', f.read(8))
        exc = self.assertRaises(ValueError, plot.render, result(workload(
            case('nova-none', None))), path + '2')
        self.assertIn('nothing was measured', str(exc))
        self.assertFalse(os.path.exists(path + '2'))
