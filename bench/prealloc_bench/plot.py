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

"""``--plot``: a PNG chart of a run, the report's headline first.

matplotlib is an optional dependency (the distribution's ``plot`` extra):
nothing else needs it. The first panel is the report's summary
(report.summary_rows: per plugin mode, the 4 KiB new-cluster writes'
ratios to nova's overlay and to raw fallocated). Then one small panel per
workload with at most six horizontal bars, each a ratio, never a raw
figure: the plugin's four modes, nova's space mode and the raw file that
is the workload's limit, over the workload's reference (nova's overlay,
``nova none``, where the workload has it, drawn as the dashed line at 1),
from one group (the default layout; the warm pass of the reads; the size
of the creations with the most rows). The report has every row. Labels
are one line each on horizontal bars, so they cannot overlap; panels sit
in two columns. It runs as the command's user and writes only the --plot
file named.
"""

import importlib
import textwrap

from prealloc_backend import sizes
from prealloc_bench import engine
from prealloc_bench import report

MISSING = ('--plot needs matplotlib, which is not installed in this Python '
           'environment (%s); install it with "pip install matplotlib" (the '
           'plot extra: prealloc-backend-bench[plot]), or '
           'run without --plot (--json keeps every figure)')


def missing():
    """None when matplotlib can be imported, else the message to print."""
    try:
        importlib.import_module('matplotlib')
    except ImportError as exc:
        return MISSING % exc
    return None


# The rows a workload's panel shows, in this order, when measured: the
# first raw file among its rows (its limit) is put before them.
PANEL_VARIANTS = ('nova-space', 'plugin-none', 'plugin-metadata',
                  'plugin-space', 'plugin-full')
# The reference a panel's ratios are over, the first one a workload has.
PANEL_REFERENCES = ('nova-none', 'raw-fallocated', 'raw-sparse')
REFERENCE_NAMES = {'nova-none': "nova's overlay (nova none)",
                   'raw-fallocated': 'raw fallocated',
                   'raw-sparse': 'raw sparse'}


def _measured(workload, group):
    return [c for c in workload['cases']
            if c['group'] == group and c.get('median') is not None]


def _panel_group(workload):
    """The group a workload's panel shows: the default layout, the warm
    pass of the reads, else the one with the most measured rows (the
    first of those).
    """
    groups = []
    for case in workload['cases']:
        if case['group'] not in groups:
            groups.append(case['group'])
    for group in (engine.DEFAULT_GROUP, workload.get('warm_group')):
        if group in groups and _measured(workload, group):
            return group
    return max(groups, key=lambda g: len(_measured(workload, g)),
               default=None)


def _bars(workload):
    """(group, reference, labels, ratios, errors) of a workload's panel:
    its rows' median paired ratios over the reference (whiskers: min and
    max, where several repetitions), None where it has no ratio to show.
    """
    group = _panel_group(workload)
    rows = {c['variant']: c for c in _measured(workload, group)}
    reference = next((k for k in PANEL_REFERENCES
                      if k in rows and k in workload.get('references', ())),
                     None)
    if reference is None:
        return None
    limit = next((c['variant'] for c in workload['cases']
                  if c['variant'].startswith('raw-') and
                  c['variant'] in rows and c['variant'] != reference), None)
    labels, ratios, lows, highs = [], [], [], []
    for key in ((limit,) if limit else ()) + PANEL_VARIANTS:
        paired = rows.get(key, {}).get('ratios', {}).get(reference)
        if key == reference or not paired:
            continue
        labels.append(rows[key]['label'])
        ratios.append(paired['median'])
        lows.append(paired['median'] - paired.get('min', paired['median']))
        highs.append(paired.get('max', paired['median']) - paired['median'])
    if not labels:
        return None
    return group, reference, labels, ratios, [lows, highs]


def _panels(result):
    """('headline', report.summary_rows) first where the run has it, then
    ('workload', (workload, its _bars)) for each workload with a ratio.
    """
    panels = []
    rows = report.summary_rows(result)
    if rows and any(r['x_nova'] or r['x_raw'] for r in rows):
        panels.append(('headline', rows))
    for w in result['workloads']:
        bars = _bars(w)
        if bars:
            panels.append(('workload', (w, bars)))
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
            # On white: the dashed line at 1 must not cross the figure.
            axis.annotate('%.2fx' % value if value else 'n/a', (x, value),
                          xytext=(0, 3), textcoords='offset points',
                          ha='center', fontsize=9, zorder=5,
                          bbox={'facecolor': 'white', 'edgecolor': 'none',
                                'pad': 0.5})
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
                   % sizes.human(report.summary_disk(result)),
                   fontsize=10)


def _fmt(ratio):
    """'0.037x', '1.04x', '12x'."""
    if ratio >= 10:
        return '%.0fx' % ratio
    return ('%.2fx' if ratio >= 0.1 else '%.2gx') % ratio


def _draw_workload(axis, workload, bars):
    group, reference, labels, ratios, errors = bars
    colors = [{'raw': 'tab:gray', 'nova': 'tab:orange'}.get(
        label.split()[0], 'tab:blue') for label in labels]
    positions = range(len(labels))
    axis.barh(positions, ratios, xerr=errors if any(map(any, errors))
              else None, capsize=2, color=colors)
    axis.axvline(1, color='black', linewidth=0.8, linestyle='--')
    axis.set_yticks(positions)
    axis.set_yticklabels(labels, fontsize=8)
    # The first row on top, as in the report's table.
    axis.invert_yaxis()
    positive = [r for r in ratios if r > 0]
    if positive and max(positive + [1]) / min(positive + [1]) > 20:
        axis.set_xscale('log')
        axis.set_xlim(min(positive + [1]) / 3, max(positive + [1]) * 6)
    else:
        axis.set_xlim(0, max(ratios + [1]) * 1.3)
    for y, ratio in zip(positions, ratios):
        # On white: the dashed line at 1 must not cross the figure.
        axis.annotate(_fmt(ratio), (ratio, y), xytext=(3, 0),
                      textcoords='offset points', va='center', fontsize=8,
                      zorder=5, bbox={'facecolor': 'white',
                                      'edgecolor': 'none', 'pad': 0.5})
    better = ('above 1: faster' if workload['higher_is_better'] else
              'below 1: %s' % ('fewer' if workload['unit'] == 'extents'
                               else 'quicker'))
    axis.set_xlabel('x %s (%s)' % (REFERENCE_NAMES[reference], better),
                    fontsize=8)
    axis.tick_params(axis='x', labelsize=8)
    title = workload['title']
    if group and group != engine.DEFAULT_GROUP:
        title += ' (%s)' % group.split(':')[0]
    axis.set_title('\n'.join(textwrap.wrap(title, 48)), fontsize=9)


def render(result, path):
    """Write the chart of ``result`` (engine/report dict) to ``path``:
    the summary's ratios across the top, then the workloads' panels in
    two columns.
    """
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib import pyplot

    panels = _panels(result)
    workloads = [data for kind, data in panels if kind == 'workload']
    if not workloads:
        raise ValueError('nothing was measured: no chart to draw')
    headline = [data for kind, data in panels if kind == 'headline']
    rows = (len(workloads) + 1) // 2
    heights = ([3.6] if headline else []) + [2.4] * rows
    figure = pyplot.figure(figsize=(12, sum(heights) + 0.6))
    grid = figure.add_gridspec(len(heights), 2, height_ratios=heights)
    if headline:
        _draw_headline(figure.add_subplot(grid[0, :]), headline[0], result)
    first = 1 if headline else 0
    for i, (workload, bars) in enumerate(workloads):
        _draw_workload(figure.add_subplot(grid[first + i // 2, i % 2]),
                       workload, bars)
    host = result['host']
    figure.suptitle('prealloc-bench, %s, %s (%s run), %s' % (
        host['hostname'], host['filesystem'], result['run'],
        result['date']), fontsize=10)
    # Leave the top 0.5 inch for the title.
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.5 / (sum(heights) + 0.6)))
    figure.savefig(path, format='png', dpi=100)
    pyplot.close(figure)
