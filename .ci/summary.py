"""Print one 'N passed, N failed, N skipped' line for all stestr runs.

CI reads a plain closing line; stestr's own summary is not one it reads.
Every run in this clone's .stestr repository is counted (tools/run-tests
clears it first, so that is every tier of one run). Exits 1 when a test
failed or when no test passed besides the tiers' prerequisites checks
(a run that executed no test is a failure).

Each failed test is named, with its tier and the end of its traceback,
just before the closing line: CI may keep only the end of a run's output,
and a test that failed there must be found from it alone.
"""
import glob
import os
import re
import subprocess
import sys

PREREQ_TEST = r'\.Prerequisites\.test_prerequisites'
# Before the closing line: the last TRACEBACK_LINES lines of the traceback
# of each of the first SHOWN failed tests of a tier, each line cut to
# LINE_CHARS characters (an assertion on megabytes of data makes one line
# of megabytes), then the names of the others, up to NAMED in all.
TRACEBACK_LINES = 15
SHOWN = 10
NAMED = 50
LINE_CHARS = 300
# unittest's separators in subunit2pyunit's report.
SEPARATOR1 = '=' * 70
SEPARATOR2 = '-' * 70


def _tool(name):
    """``name`` from the first tox env that has it (stestr and
    subunit-stats come with the test requirements of every tier).
    """
    for env in ('py3', 'integration', 'functional', 'privileged',
                'functional-real'):
        path = os.path.join('.tox', env, 'bin', name)
        if os.access(path, os.X_OK):
            return path
    found = sorted(glob.glob(os.path.join('.tox', '*', 'bin', name)))
    return found[0] if found else None


def _count_runs(ids, totals, env_of, stestr, stats, filter_, to_text,
                failed_in):
    """Add each stestr run's counts to totals, print its failures, and
    return the number of tests that passed besides the prerequisites
    checks.
    """
    passed = 0
    for run_id in ids:
        stream = subprocess.run([stestr, 'history', 'show', str(run_id),
                                 '--subunit'], capture_output=True).stdout
        counts = _counts(stats, stream)
        for key in totals:
            totals[key] += counts[key]
        failed_in[run_id] = counts['failed']
        if counts['failed']:
            _print_failures(env_of.get(str(run_id), 'run %d' % run_id),
                            counts['failed'], filter_, to_text, stream)
        # Each tier's prerequisites test passes whenever the machine has
        # what the tier needs: it is no proof that a test ran.
        others = subprocess.run(
            [filter_, '--success', '--without', PREREQ_TEST,
             '--no-passthrough'],
            input=stream, capture_output=True).stdout
        passed += _counts(stats, others)['passed']
    return passed


def main(argv):
    """argv: ENV=EXIT_CODE:RUN_ID for each tox env run (tools/run-tests):
    an env that failed with no failing test in its stestr run (pep8, a
    virtualenv that could not be built, a timeout that killed stestr)
    counts as one failed test, so that the closing line agrees with the
    exit status.
    """
    # What a test printed may not be this locale's: never a reason to
    # lose the closing line.
    sys.stdout.reconfigure(errors='backslashreplace')
    totals = {'passed': 0, 'failed': 0, 'skipped': 0}
    stestr, stats = _tool('stestr'), _tool('subunit-stats')
    filter_ = _tool('subunit-filter')
    to_text = _tool('subunit2pyunit')
    # [(env, exit code, run id)], run id 'none' for a tier that made none.
    # A run counted elsewhere (the second platform's run-tests in its own
    # checkout, tools/run-tests' PREALLOC_PLATFORM2) comes as
    # ENV=EXIT_CODE:counts=PASSED,FAILED,SKIPPED, from its closing line.
    tiers = []
    counted = {}
    # Such a run judged its own prerequisites-only passes (it exits 1).
    passed_elsewhere = 0
    for arg in argv:
        env, _, rest = arg.partition('=')
        code, _, run_id = rest.partition(':')
        if run_id.startswith('counts='):
            passed, failed, skipped = (
                int(n) for n in run_id[len('counts='):].split(','))
            counted[env] = failed
            totals['passed'] += passed
            totals['failed'] += failed
            totals['skipped'] += skipped
            passed_elsewhere += passed
            run_id = 'none'
        tiers.append((env, code, run_id))
    env_of = {run_id: env for env, _, run_id in tiers}
    ids = []
    if os.path.isdir('.stestr'):
        ids = sorted(int(name) for name in os.listdir('.stestr')
                     if name.isdigit())
    if ids and not (stestr and stats and filter_):
        print('summary: no tox env with stestr and subunit tools in .tox',
              file=sys.stderr)
        ids = []
    real_passed = passed_elsewhere
    failed_in = {}
    try:
        real_passed += _count_runs(ids, totals, env_of, stestr, stats,
                                   filter_, to_text, failed_in)
    except OSError as err:
        # A tool of .tox that cannot be run (its interpreter gone) must
        # not cost the closing line: the runs are not counted, and that
        # is a failure.
        print('summary: cannot read the stestr runs: %s' % err,
              file=sys.stderr, flush=True)
        totals['failed'] += 1
    for env, code, run_id in tiers:
        if code == '0':
            continue
        if run_id.isdigit() and failed_in.get(int(run_id)):
            continue
        if counted.get(env):
            continue
        print('summary: tox env %s failed (exit code %s) with no failing '
              'test recorded: counted as 1 failed' % (env, code),
              file=sys.stderr, flush=True)
        totals['failed'] += 1
    if not real_passed:
        print('summary: no test passed besides the tiers\' prerequisites '
              'checks', file=sys.stderr, flush=True)
    print('%(passed)d passed, %(failed)d failed, %(skipped)d skipped'
          % totals, flush=True)
    return 1 if totals['failed'] or not real_passed else 0


def _print_failures(env, failed, filter_, to_text, stream):
    """Name the ``failed`` tests of a tier's subunit ``stream``, with
    ``env`` and the end of their tracebacks (subunit2pyunit's report).
    """
    reports = []
    if to_text:
        failures = subprocess.run(
            [filter_, '--only-genuine-failures', '--no-passthrough'],
            input=stream, capture_output=True).stdout
        reports = _reports(subprocess.run(
            [to_text, '--no-passthrough'], input=failures,
            capture_output=True).stderr.decode(errors='replace'))
    named = reports[:NAMED]
    for index, (test_id, body) in enumerate(named):
        print('summary: %s FAILED in tier %s%s' % (
            test_id[:LINE_CHARS], env, ':' if index < SHOWN else ''),
            flush=True)
        if index >= SHOWN:
            continue
        # The traceback: from its last 'Traceback' line (the test's log
        # and output come first), or the whole report without one (a
        # timeout, a crashed worker).
        tb = max((i for i, text in enumerate(body)
                  if 'Traceback (most recent call last)' in text), default=0)
        body = body[tb:]
        while body and not body[-1].strip():
            body.pop()
        for text in body[-TRACEBACK_LINES:]:
            if len(text) > LINE_CHARS:
                text = text[:LINE_CHARS] + ' [%d characters cut]' % (
                    len(text) - LINE_CHARS)
            print('    ' + text, flush=True)
    if failed > len(named):
        print('summary: %d more failed in tier %s: its log names them'
              % (failed - len(named), env), flush=True)


def _reports(text):
    """[(test id, report lines)] of unittest's error list in ``text``:
    each report is SEPARATOR1, 'FAIL: <id>' or 'ERROR: <id>' (an id may
    have spaces: 'setUpClass (module.Class)'), the description, SEPARATOR2,
    then the error up to the next report or to SEPARATOR2 and 'Ran N
    tests'.
    """
    lines = text.splitlines()
    starts = [i for i in range(len(lines) - 1)
              if lines[i] == SEPARATOR1 and
              re.match(r'(FAIL|ERROR): .', lines[i + 1])]
    reports = []
    for n, start in enumerate(starts):
        if n + 1 < len(starts):
            end = starts[n + 1]
        else:
            end = next((i for i in range(start + 2, len(lines) - 1)
                        if lines[i] == SEPARATOR2 and
                        lines[i + 1].startswith('Ran ')), len(lines))
        body_at = next((i + 1 for i in range(start + 2, end)
                        if lines[i] == SEPARATOR2), start + 2)
        reports.append((lines[start + 1].split(': ', 1)[1],
                        lines[body_at:end]))
    return reports


def _counts(stats, stream):
    out = subprocess.run([stats], input=stream,
                         capture_output=True).stdout.decode()
    counts = {}
    for key, pattern in (('passed', r'Passed tests:\s+(\d+)'),
                         ('failed', r'Failed tests:\s+(\d+)'),
                         ('skipped', r'Skipped tests:\s+(\d+)')):
        match = re.search(pattern, out)
        counts[key] = int(match.group(1)) if match else 0
    return counts


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
