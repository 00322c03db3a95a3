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
and compute hosts rarely have it. Bars are medians, whiskers min and max.
It runs as the command's user and writes only the --plot file named.
"""

import importlib
import textwrap

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
    labels, medians, lows, highs = [], [], [], []
    groups = {c['group'] for c in workload['cases']}
    for case in workload['cases']:
        if case.get('median') is None:
            continue
        # Narrow bars: break 'nova in-tree space' over lines.
        label = textwrap.fill(case['label'], 12)
        if len(groups) > 1:
            # '1 TiB, cold: first pass ...' -> '1 TiB, cold'.
            label += '\n' + textwrap.fill(case['group'].split(':')[0], 16)
        labels.append(label)
        medians.append(case['median'])
        lows.append(case['median'] - case['min'])
        highs.append(case['max'] - case['median'])
    return labels, medians, [lows, highs]


def render(result, path):
    """Write the chart of ``result`` (engine/report dict) to ``path``."""
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib import pyplot

    panels = [w for w in result['workloads']
              if any(c.get('median') is not None for c in w['cases'])]
    if not panels:
        raise ValueError('nothing was measured: no chart to draw')
    figure, axes = pyplot.subplots(len(panels), 1,
                                   figsize=(11, 3.6 * len(panels)),
                                   squeeze=False)
    for axis, workload in zip(axes[:, 0], panels):
        labels, medians, errors = _bars(workload)
        colors = [{'raw': 'tab:gray', 'nova': 'tab:orange'}.get(
            label.split()[0], 'tab:blue') for label in labels]
        axis.bar(range(len(labels)), medians, yerr=errors, capsize=3,
                 color=colors)
        axis.set_xticks(range(len(labels)))
        axis.set_xticklabels(labels, fontsize=7, rotation=0)
        better = 'higher' if workload['higher_is_better'] else 'lower'
        axis.set_ylabel(workload['unit'])
        axis.set_title('%s (%s is better)' % (workload['title'], better),
                       fontsize=9)
        positive = [m for m in medians if m > 0]
        if positive and max(positive) / min(positive) > 50:
            axis.set_yscale('log')
    host = result['host']
    figure.suptitle('prealloc-backend bench, %s, %s (%s), %s' % (
        host['hostname'], host['filesystem'], result['run'],
        result['date']), fontsize=10)
    # Leave the top for the title.
    figure.tight_layout(rect=(0, 0, 1, 0.97))
    figure.savefig(path, format='png', dpi=100)
    pyplot.close(figure)
