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

"""What a run found: paired ratios, the targets, the tables, JSON.

Pure functions of the result dict built by engine.Bench.run(), so the
arithmetic and the formatting are testable without running anything.

Ratios are paired: in each repetition every variant of a workload was
measured (interleaved), so a row's figure of repetition r is divided by its
reference's figure of the same repetition, and the table shows the median
and [min-max] of those ratios. References are rows of the same workload and
group (raw fallocated, raw zero-written, nova none, ...). For throughputs a
ratio above 1 is faster than the reference; for times and extent counts,
above 1 is more.

The report starts with a summary (summary_rows: per plugin mode, the 4
KiB new-cluster writes' ratios to nova's overlay and to raw fallocated,
creation time and bytes reserved: figures of that workload's table), then
the tables.

Targets (doc/source/cli/prealloc-bench.rst) are judged on the
median of the paired ratios, or on the median figure for an absolute
bound; one that cannot be measured here is ``met: null`` with the reason.
A verdict whose median's confidence interval (median_interval) spans the
bound is marked undecided (``decided: false``). A quick run judges none.

Runs as the command's user; it writes only the --json file the operator
named.
"""

import json
import math

from oslo_utils import units

from prealloc_backend import sizes
from prealloc_bench import engine

DEFAULT_GROUP = engine.DEFAULT_GROUP
BEYOND_GROUP = engine.BEYOND_GROUP

# Headers of the reference columns.
REFERENCE_HEADERS = {
    'raw-fallocated': 'x raw fallocated',
    'raw-zero-written': 'x raw zero-written',
    'raw-sparse': 'x raw sparse',
    'nova-none': 'x nova none',
    'nova-space': 'x nova space',
}

# Bounds of the targets (doc/source/cli/prealloc-bench.rst).
NEW_CLUSTER_MIN = 0.9
SEQ_WRITE_MIN = 0.95
FULL_MIN = 0.95
NONE_MIN = 0.95
READ_MIN = 0.9
CREATE_1TIB_MAX = 2.0
# How sure the interval a target is decided on must be of the median.
DECIDE_CONFIDENCE = 0.75

# The seeds' rows (the two measurements that motivated the plugin, seed
# 003 and seed 004 in the report) and the variants that play them:
# (variant, seed 003 row, seed 004 row).
SEED_ROWS = (
    ('raw-sparse', 'sparse raw', ''),
    ('raw-fallocated', 'preallocated raw', ''),
    ('raw-zero-written', '', ''),
    ('nova-none', 'sparse qcow2', 'off'),
    ('nova-space', '', ''),
    ('plugin-none', '', 'off'),
    ('plugin-metadata', 'metadata qcow2', 'metadata'),
    ('plugin-space', '', 'falloc'),
    ('plugin-full', '', 'full'),
)


def ratio(value, reference):
    """value / reference, or None when either is missing or zero."""
    if value is None or not reference:
        return None
    return value / reference


def find(workload, variant, group=None):
    for case in workload['cases']:
        if case['variant'] == variant and (group is None or
                                           case['group'] == group):
            return case
    return None


def add_ratios(workload):
    """Set case['ratios'] = {reference key: summary of the paired ratios
    (median, min, max, n, samples)} against each reference row of the same
    group that has samples.
    """
    for case in workload['cases']:
        case['ratios'] = {}
        for key in workload.get('references', ()):
            ref = find(workload, key, case['group'])
            if ref is None or ref is case:
                continue
            ratios = engine.paired_ratios(case.get('samples', []),
                                          ref.get('samples', []))
            if ratios:
                case['ratios'][key] = dict(engine.summary(ratios),
                                           samples=ratios)


def _why_missing(case, name):
    if case is None:
        return '%s not in this run' % name
    if case.get('skip'):
        return '%s skipped: %s' % (name, case['skip'])
    if case.get('error'):
        return '%s failed: %s' % (name, case['error'])
    return '%s has no sample' % name


def _meets(value, op, bound):
    return value >= bound if op == '>=' else value <= bound


def median_interval(samples, confidence=DECIDE_CONFIDENCE):
    """(low, high): the narrowest interval between order statistics of
    ``samples`` (None left out) that holds their distribution's median
    with at least ``confidence``, whatever that distribution: (x(k),
    x(n+1-k)) holds it with probability 1 - 2 P(Binomial(n, 1/2) < k).
    None where even (min, max) is not that sure (fewer than 3 samples at
    0.75). At 0.75 it is (min, max) up to 6 samples, then it narrows: (x2,
    x6) of 7, (x3, x8) of 10.
    """
    values = sorted(v for v in samples if v is not None)
    n = len(values)
    interval = None
    for k in range(1, n // 2 + 1):
        outside = 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n
        if 1 - outside < confidence:
            break
        interval = (values[k - 1], values[n - k])
    return interval


def _target(name, op, bound, value=None, why=None, spread=None):
    """A judged target. ``decided``: True when the median's confidence
    interval (median_interval of the repetitions' figures) lies on one
    side of the bound, False when it spans the bound (this run does not
    decide it), None where there is no value or too few repetitions.
    """
    out = {'name': name, 'value': value, 'target': bound, 'op': op,
           'met': None, 'why': why, 'decided': None}
    if spread:
        out.update(min=spread.get('min'), max=spread.get('max'),
                   n=spread.get('n'))
    if value is not None:
        out['met'] = _meets(value, op, bound)
        interval = median_interval((spread or {}).get('samples') or [])
        if interval:
            out['decided'] = (_meets(interval[0], op, bound) ==
                              _meets(interval[1], op, bound))
    return out


def ratio_target(workloads, workload_name, group, variant, reference, bound,
                 name):
    """Median of the paired ratios variant / reference >= bound."""
    workload = workloads.get(workload_name)
    if workload is None:
        return _target(name, '>=', bound,
                       why='workload %s not run' % workload_name)
    case = find(workload, variant, group)
    ref = find(workload, reference, group)
    for row, key in ((case, variant), (ref, reference)):
        if row is None or row.get('median') is None:
            return _target(name, '>=', bound, why=_why_missing(row, key))
    paired = case.get('ratios', {}).get(reference)
    if not paired:
        return _target(name, '>=', bound,
                       why='no repetition measured both %s and %s'
                       % (variant, reference))
    return _target(name, '>=', bound, value=paired['median'], spread=paired)


def _sweep_key(variant, group):
    """The variant key of ``variant`` in a workload group: in an opt-in
    group ('256K asked') the plugin's rows carry the size asked.
    """
    if group == DEFAULT_GROUP or not group.endswith(' asked'):
        return variant
    return '%s@%s' % (variant, group.split()[0])


def _layout_groups(workload):
    """The default-layout groups of a workload: over the backing data,
    and beyond it when the run measured that.
    """
    groups = [DEFAULT_GROUP]
    if workload and any(c['group'] == BEYOND_GROUP
                        for c in workload['cases']):
        groups.append(BEYOND_GROUP)
    return groups


def _where(group):
    """', beyond the backing file' for that group's targets, else ''."""
    return ', beyond the backing file' if group == BEYOND_GROUP else ''


def targets(workloads):
    """Every target judged on this run: a list of
    {name, value, target, op, met, decided, why, min, max, n}.
    """
    out = []
    new_cluster = workloads.get('new-cluster-write')
    groups = (new_cluster or {}).get('default_groups') or [DEFAULT_GROUP]
    for group in groups:
        for mode in ('metadata', 'space'):
            variant = _sweep_key('plugin-' + mode, group)
            out.append(ratio_target(
                workloads, 'new-cluster-write', group, variant,
                'raw-fallocated', NEW_CLUSTER_MIN,
                '4K new-cluster writes (%s): plugin %s / raw fallocated'
                % (group, mode)))
    for group in _layout_groups(workloads.get('seq-write')):
        for mode in ('metadata', 'space'):
            out.append(ratio_target(
                workloads, 'seq-write', group, 'plugin-' + mode,
                'raw-fallocated', SEQ_WRITE_MIN,
                '64K sequential first writes%s: plugin %s / raw fallocated'
                % (_where(group), mode)))
    writes = [w for w in workloads.values() if w.get('kind') == 'write']
    for w in writes:
        for group in _layout_groups(w):
            out.append(ratio_target(
                workloads, w['name'], group, 'plugin-full',
                'raw-zero-written', FULL_MIN,
                '%s%s: plugin full / raw zero-written'
                % (w['name'], _where(group))))
    for w in writes:
        for group in _layout_groups(w):
            out.append(ratio_target(
                workloads, w['name'], group, 'plugin-none', 'nova-none',
                NONE_MIN, '%s%s: plugin none / stock nova (none)'
                % (w['name'], _where(group))))
    out.extend(read_targets(workloads.get('random-read')))
    out.append(creation_target(workloads))
    return out


def read_targets(reads):
    """The 1 TiB random reads, judged on the warm pass (the steady state a
    guest lives in); the cold pass is shown, not judged.
    """
    out = []
    for mode in ('metadata', 'space'):
        name = ('random 4K reads over written data, 1 TiB, warm metadata '
                'cache: plugin %s / raw' % mode)
        if reads is None:
            out.append(_target(name, '>=', READ_MIN,
                               why='workload random-read not run'))
        elif reads.get('disk_size') != units.Ti:
            out.append(_target(name, '>=', READ_MIN,
                               why='the read disks are %s, not 1 TiB'
                               % sizes.human(reads.get('disk_size'))))
        else:
            out.append(ratio_target({'random-read': reads}, 'random-read',
                                    reads['warm_group'], 'plugin-' + mode,
                                    'raw-sparse', READ_MIN, name))
    return out


def creation_target(workloads):
    name = 'creating a 1 TiB metadata disk: seconds (median)'
    workload = workloads.get('create')
    if workload is None:
        return _target(name, '<=', CREATE_1TIB_MAX,
                       why='workload create not run')
    case = find(workload, 'plugin-metadata', '1 TiB')
    if case is None or case.get('median') is None:
        return _target(name, '<=', CREATE_1TIB_MAX,
                       why=_why_missing(case, 'plugin-metadata at 1 TiB'))
    return _target(name, '<=', CREATE_1TIB_MAX, value=case['median'],
                   spread=case)


def finalize(result):
    """Add paired ratios and judged targets to a run's result. A quick
    run judges none (``targets`` is empty): one repetition on small disks
    is indicative only.
    """
    by_name = {}
    for workload in result['workloads']:
        add_ratios(workload)
        by_name[workload['name']] = workload
    result['targets'] = ([] if result.get('run') == 'quick' else
                         targets(by_name))
    return result


# -- summary --------------------------------------------------------------

SUMMARY_MODES = ('none', 'metadata', 'space', 'full')
# The references of the summary's two ratios.
SUMMARY_NOVA = 'nova-none'
SUMMARY_RAW = 'raw-fallocated'


def summary_rows(result):
    """The headline, per plugin mode, from the 4 KiB new-cluster writes
    over the backing data (default layout): the median paired ratios of
    its IOPS against nova's overlay (nova none) and raw fallocated, its
    creation time and the bytes allocated before the writes (medians).
    None where this run has no such figure; [] without that workload.
    """
    workload = next((w for w in result['workloads']
                     if w.get('name') == 'new-cluster-write'), None)
    if workload is None:
        return []
    rows = []
    for mode in SUMMARY_MODES:
        case = find(workload, 'plugin-' + mode, DEFAULT_GROUP) or {}
        measured = case.get('median') is not None
        ratios = case.get('ratios', {}) if measured else {}
        extra = case.get('extra', {}) if measured else {}
        rows.append({
            'mode': mode,
            'x_nova': ratios.get(SUMMARY_NOVA, {}).get('median'),
            'x_raw': ratios.get(SUMMARY_RAW, {}).get('median'),
            'created': extra.get('create_seconds', {}).get('median'),
            'reserved': extra.get('allocated', {}).get('median')})
    return rows


def summary_disk(result):
    """Virtual size of the summary's disks (engine.Config.new_cluster_disk
    or write_disk).
    """
    config = result['config']
    return config.get('new_cluster_disk') or config.get('write_disk')


def summary_lines(result):
    rows = summary_rows(result)
    if not rows:
        return []
    lines = ['Summary: 4 KiB first writes, each into a new cluster, of %s '
             'disks (the plugin\'s modes):'
             % sizes.human(summary_disk(result))]
    lines.extend(table(
        ['mode', 'x nova overlay', 'x raw fallocated', 'created in',
         'reserved'],
        [[r['mode'], fmt_ratio(r['x_nova']), fmt_ratio(r['x_raw']),
          fmt_kind(r['created'], 'seconds'),
          sizes.human(r['reserved']) if r['reserved'] is not None
          else '-'] for r in rows]))
    lines.append('  x: its writes per second over those into nova\'s own '
                 'overlay (preallocate_images=none) and into a fallocated '
                 'raw file (the limit), paired by repetition, median; above '
                 '1 is faster')
    lines.extend('  -: %s' % note for note in summary_gaps(result))
    return lines


def summary_gaps(result):
    """Why a figure of the summary is missing: '<row>: <reason>' for
    each row of the summary's workload that has no median.
    """
    workload = next((w for w in result['workloads']
                     if w.get('name') == 'new-cluster-write'), None)
    notes = []
    keys = ['plugin-' + mode for mode in SUMMARY_MODES]
    for key in keys + [SUMMARY_NOVA, SUMMARY_RAW]:
        case = find(workload, key, DEFAULT_GROUP) if workload else None
        if case is None or case.get('median') is None:
            notes.append(_why_missing(case, case['label'] if case else key))
    return notes


# -- text ---------------------------------------------------------------


def fmt_number(value):
    """Three significant figures or so, never an exponent; whole numbers
    (extent counts) without decimals.
    """
    if value is None:
        return '-'
    value = float(value)
    magnitude = abs(value)
    if value.is_integer() or magnitude >= 100:
        return '%.0f' % value
    if magnitude >= 10:
        return '%.1f' % value
    if magnitude >= 1:
        return '%.2f' % value
    if magnitude >= 0.001:
        return '%.3f' % value
    return '%.5f' % value


def fmt_kind(value, kind):
    if kind == 'bytes':
        return sizes.human(value)
    if kind == 'micros':
        # Seconds, shown in microseconds: CPU time per request.
        return '-' if value is None else '%s us' % fmt_number(value * 1e6)
    if kind == 'seconds':
        return '-' if value is None else '%s s' % fmt_number(value)
    return fmt_number(value)


def fmt_spread(stats, fmt=fmt_number):
    """'745 [712-760]': median, then [min-max] when there are several."""
    if not stats or stats.get('median') is None:
        return '-'
    text = fmt(stats['median'])
    if stats.get('n', 0) > 1:
        text += ' [%s-%s]' % (fmt(stats['min']), fmt(stats['max']))
    return text


def fmt_ratio(value):
    return '-' if value is None else '%.2f' % value


def table(headers, rows, indent='  '):
    """Columns padded to their widest cell; first column left-aligned,
    others right-aligned (they hold numbers).
    """
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells):
        parts = []
        for i, cell in enumerate(cells):
            parts.append(cell.ljust(widths[i]) if i == 0 else
                         cell.rjust(widths[i]))
        return (indent + '  '.join(parts)).rstrip()

    out = [line(headers), indent + '  '.join('-' * w for w in widths)]
    out.extend(line(row) for row in rows)
    return out


def _groups(workload):
    groups = []
    for case in workload['cases']:
        if case['group'] not in groups:
            groups.append(case['group'])
    return groups


def _references_present(workload, cases):
    keys = {case['variant'] for case in cases
            if case.get('median') is not None}
    return [key for key in workload.get('references', ()) if key in keys]


def group_lines(workload, group, cases):
    unit = {'s': 'seconds'}.get(workload['unit'], workload['unit'])
    refs = _references_present(workload, cases)
    headers = ['variant']
    headers += [h for _k, h in workload['fact_columns']]
    headers += [h for _k, h, _kind in workload['extra_columns']]
    headers.append('%s median [min-max]' % unit)
    headers += [REFERENCE_HEADERS.get(k, 'x ' + k) for k in refs]
    rows, notes = [], []
    for case in cases:
        name = case['label']
        if case.get('skip'):
            notes.append('   not shown: %s: %s' % (name, case['skip']))
            continue
        if case.get('error'):
            notes.append('   failed: %s: %s' % (name, case['error']))
            if case.get('median') is None:
                continue
        row = [case['label']]
        row += [str(case['facts'].get(k, '-'))
                for k, _h in workload['fact_columns']]
        for key, _header, extra_kind in workload['extra_columns']:
            extra = case['extra'].get(key)
            row.append(fmt_kind(extra['median'], extra_kind) if extra else
                       '-')
        row.append(fmt_spread(case))
        row += [fmt_spread(case.get('ratios', {}).get(k), fmt_ratio)
                for k in refs]
        rows.append(row)
    lines = []
    if group:
        lines.append('   %s:' % group)
    if rows:
        lines.extend(table(headers, rows, indent='   '))
    lines.extend(notes)
    return lines


def workload_lines(workload, number):
    lines = ['%d. %s [%s]' % (number, workload['title'], workload['name']),
             '   %s' % workload['setup'],
             '   engine: %s' % workload['engine']]
    if workload.get('error'):
        lines.append('   FAILED: %s' % workload['error'])
    groups = _groups(workload)
    for group in groups:
        cases = [c for c in workload['cases'] if c['group'] == group]
        lines.extend(group_lines(workload, group, cases))
    return lines


def seed_lines(result):
    """The seeds' tables (seed 003 and seed 004) from this run: per
    variant, the time to create a disk, its physical size, and the time and
    speed of the sequential first writes, default layout.
    """
    workload = next((w for w in result['workloads']
                     if w['name'] == 'seq-write'), None)
    if workload is None:
        return []
    written = result['config'].get('seq_bytes')
    rows = []
    for key, seed3, seed4 in SEED_ROWS:
        case = find(workload, key, DEFAULT_GROUP)
        if case is None or case.get('median') is None:
            continue
        created = case['extra'].get('create_seconds', {})
        allocated = case['extra'].get('allocated', {})
        rows.append([case['label'], seed3 or '-', seed4 or '-',
                     fmt_kind(created.get('median'), 'seconds'),
                     sizes.human(allocated.get('median')),
                     fmt_kind(written / case['median'] / 2 ** 20
                              if written else None, 'seconds'),
                     fmt_spread(case)])
    if not rows:
        return []
    lines = ['The seeds\' tables (seed 003: time to write; seed 004: time '
             'to create, physical size, write speed per mode), from the '
             'sequential first writes of %s into %s disks:' % (
                 sizes.human(written),
                 sizes.human(result['config'].get('write_disk')))]
    lines.extend(table(['variant', 'seed 003 row', 'seed 004 row',
                        'time to create', 'physical size', 'time to write',
                        'MiB/s median [min-max]'], rows))
    return lines


# How long the default run takes (doc/source/cli/prealloc-bench.rst).
DEFAULT_RUN_TIME = 'about 17 minutes on a 2-vCPU machine, 5 GiB free'

QUICK_TARGETS = [
    'Targets: not judged: a --quick run is indicative only (one repetition, '
    'small disks).',
    '  The default run judges them: prealloc-bench --dir DIR (%s).'
    % DEFAULT_RUN_TIME]


def target_lines(targets):
    lines = ['Targets (median of the paired ratios [min-max])']
    counts = {}
    for target in targets:
        if target['met'] is None:
            status, figure = 'n/a', target['why']
        else:
            status = 'met' if target['met'] else 'MISSED'
            if target.get('decided') is False:
                status += '?'
            # Three decimals: 0.949 must not read as a missed 0.95.
            figure = '%.3f' % target['value']
            if target.get('n', 0) > 1:
                figure += ' [%.3f-%.3f]' % (target['min'], target['max'])
            figure += ' (%s %s)' % (target['op'], target['target'])
        counts[status] = counts.get(status, 0) + 1
        lines.append('  [%s] %s: %s' % (status.ljust(7), target['name'],
                                        figure))
    lines.append('  %s' % ', '.join(
        '%d %s' % (counts[status], status)
        for status in ('met', 'met?', 'MISSED', 'MISSED?', 'n/a')
        if counts.get(status)))
    if counts.get('met?') or counts.get('MISSED?'):
        lines.append('  ?: the %d%% confidence interval of the median spans '
                     'the bound: this run does not decide it (from 7 --reps '
                     'on, the interval narrows)'
                     % round(100 * DECIDE_CONFIDENCE))
    return lines


def _reps_text(reps):
    if reps == 1:
        return '1 repetition'
    return '%d repetitions, variants interleaved' % reps


def render(result):
    """The human report, as one string."""
    host = result['host']
    lines = [
        'prealloc-bench (%s run, %s), %s' % (
            result['run'], _reps_text(result['config']['reps']),
            result['date']),
        'command: %s' % ' '.join(['prealloc-bench'] +
                                 list(result.get('argv', []))),
        'host %s: Linux %s, %s CPUs; nova %s, prealloc-backend %s, '
        'qemu-img %s' % (host['hostname'], host['kernel'], host['cpus'],
                         host['nova'], host['prealloc_backend'],
                         host['qemu_img']),
        'directory %s on %s, %s free' % (
            host['directory'], host['filesystem'],
            sizes.human(host['free_bytes'])),
        'every disk opened with cache=%s (cache.direct=on) and aio=%s, '
        'whatever its variant' % (host.get('cache', '-'),
                                  host.get('aio', '-')),
        'disks made by: the plugin\'s Backend(...).by_name().cache(), '
        'layout from diskplan.make_plan (plugin <mode>); nova\'s in-tree '
        'imagebackend.Backend with preallocate_images none/space (nova '
        '<mode>); fallocate(2), zero write(2)s or truncate (raw)',
        'privsep: %s' % result['privsep'],
        '',
    ]
    if result.get('interrupted'):
        lines.extend(['INTERRUPTED: %s' % result['interrupted'], ''])
    summary = summary_lines(result)
    if summary:
        lines.extend(summary)
        lines.append('')
    for number, workload in enumerate(result['workloads'], 1):
        lines.extend(workload_lines(workload, number))
        lines.append('')
    seeds = seed_lines(result)
    if seeds:
        lines.extend(seeds)
        lines.append('')
    if result['run'] == 'quick':
        lines.extend(QUICK_TARGETS)
        lines.append('')
    elif result.get('targets'):
        lines.extend(target_lines(result['targets']))
        lines.append('')
    lines.append('ratios: paired by repetition (a row\'s figure over its '
                 'reference\'s of the same repetition), median [min-max]; '
                 'run took %.0f s' % result.get('seconds', 0))
    return '\n'.join(lines) + '\n'


def has_errors(result):
    if result.get('interrupted'):
        return True
    return any(w.get('error') or any(c.get('error') for c in w['cases'])
               for w in result['workloads'])


def write_json(result, path):
    with open(path, 'w') as f:
        json.dump(result, f, indent=2)
        f.write('\n')
