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

"""``--plot``: a PNG bar chart of a run, one panel per workload.

matplotlib is an optional dependency: nothing else of the plugin needs it,
and compute hosts rarely have it. The first panel is the report's
summary (report.summary_rows: per mode, the ratios to nova's overlay and to
raw fallocated); then one panel per workload, horizontal bars (one label a
line, so they cannot overlap): medians, whiskers min and max.
It runs as the command's user and writes only the --plot file named.
"""

import importlib

from prealloc_backend import sizes
from prealloc_bench import engine
from prealloc_bench import report

MISSING = ('--plot needs matplotlib, which is not installed in this Python '
           'environment (%s); install it with "pip install matplotlib", or '
           'run without --plot (--json keeps every figure)')


def missing():
    """None when matplotlib can be imported, else the message to print."""
    try:
        importlib.import_module('matplotlib')
    except ImportError as exc:
        return MISSING % exc
    return None


def _bars(workload):
    """One horizontal bar per measured row: labels on one line each (the
    group in brackets where the workload has several), medians, and the
    whiskers (median - min, max - median).
    """
    labels, medians, lows, highs = [], [], [], []
    groups = {c['group'] for c in workload['cases']}
    for case in workload['cases']:
        if case.get('median') is None:
            continue
        label = case['label']
        if len(groups) > 1 and case['group'] != engine.DEFAULT_GROUP:
            # '1 TiB, cold: first pass ...' -> '1 TiB, cold'; 'default
            # layout, beyond the backing file' -> 'beyond the backing file'.
            label += ' (%s)' % case['group'].split(':')[0].replace(
                engine.DEFAULT_GROUP + ', ', '')
        labels.append(label)
        medians.append(case['median'])
        lows.append(case['median'] - case['min'])
        highs.append(case['max'] - case['median'])
    return labels, medians, [lows, highs]


def _panels(result):
    """('headline', report.summary_rows) first where the run has it, then
    ('workload', w) for each workload with a figure.
    """
    panels = []
    rows = report.summary_rows(result)
    if rows:
        panels.append(('headline', rows))
    panels.extend(('workload', w) for w in result['workloads']
                  if any(c.get('median') is not None for c in w['cases']))
    return panels


def _headline_bars(rows):
    """Modes, then their ratios to nova's overlay and to raw fallocated
    (0 where not measured: the bar is absent and labelled n/a).
    """
    return ([r['mode'] for r in rows], [r['x_nova'] or 0 for r in rows],
            [r['x_raw'] or 0 for r in rows])


def _draw_headline(axis, rows, result):
    modes, x_nova, x_raw = _headline_bars(rows)
    width = 0.38
    for offset, values, color, name in (
            (-width / 2, x_nova, 'tab:orange', "x nova's overlay "
             '(preallocate_images=none)'),
            (width / 2, x_raw, 'tab:gray', 'x raw fallocated (the limit)')):
        positions = [i + offset for i in range(len(modes))]
        axis.bar(positions, values, width, color=color, label=name)
        for x, value in zip(positions, values):
            axis.annotate('%.2fx' % value if value else 'n/a', (x, value),
                          xytext=(0, 3), textcoords='offset points',
                          ha='center', fontsize=9)
    axis.axhline(1, color='black', linewidth=0.8, linestyle='--')
    axis.set_xticks(range(len(modes)))
    axis.set_xticklabels(['plugin %s' % m for m in modes], fontsize=10)
    axis.set_ylabel('ratio (above 1: faster)')
    # Room above the bars for the legend.
    axis.set_ylim(0, max(x_nova + x_raw + [1]) * 1.5)
    axis.legend(fontsize=9, loc='upper right')
    axis.set_title('Summary: 4 KiB first writes, each into a new cluster, '
                   '%s disks\nthe plugin\'s writes per second over the '
                   "reference's in the same repetition (median)"
                   % sizes.human(result['config'].get('write_disk')),
                   fontsize=10)


def _draw_workload(axis, workload):
    labels, medians, errors = _bars(workload)
    colors = [{'raw': 'tab:gray', 'nova': 'tab:orange'}.get(
        label.split()[0], 'tab:blue') for label in labels]
    positions = range(len(labels))
    axis.barh(positions, medians, xerr=errors, capsize=2, color=colors)
    axis.set_yticks(positions)
    axis.set_yticklabels(labels, fontsize=8)
    # The first row on top, as in the report's table.
    axis.invert_yaxis()
    better = 'higher' if workload['higher_is_better'] else 'lower'
    axis.set_xlabel(workload['unit'], fontsize=8)
    axis.tick_params(axis='x', labelsize=8)
    axis.set_title('%s (%s is better)' % (workload['title'], better),
                   fontsize=9)
    positive = [m for m in medians if m > 0]
    if positive and max(positive) / min(positive) > 50:
        axis.set_xscale('log')


def render(result, path):
    """Write the chart of ``result`` (engine/report dict) to ``path``:
    the summary's ratios first, then one panel per workload, each as
    tall as its rows need.
    """
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib import pyplot

    panels = _panels(result)
    if not any(kind == 'workload' for kind, _data in panels):
        raise ValueError('nothing was measured: no chart to draw')
    heights = [4.0 if kind == 'headline' else
               1.0 + 0.24 * len(_bars(data)[0]) for kind, data in panels]
    figure, axes = pyplot.subplots(
        len(panels), 1, figsize=(11, sum(heights) + 0.6), squeeze=False,
        gridspec_kw={'height_ratios': heights})
    for axis, (kind, data) in zip(axes[:, 0], panels):
        if kind == 'headline':
            _draw_headline(axis, data, result)
        else:
            _draw_workload(axis, data)
    host = result['host']
    figure.suptitle('prealloc-bench, %s, %s (%s run), %s' % (
        host['hostname'], host['filesystem'], result['run'],
        result['date']), fontsize=10)
    # Leave the top 0.5 inch for the title.
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.5 / (sum(heights) + 0.6)))
    figure.savefig(path, format='png', dpi=100)
    pyplot.close(figure)
