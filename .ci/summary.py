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
# Lines of each failed test's traceback printed before the closing line.
TRACEBACK_LINES = 15


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


def main(argv):
    """argv: ENV=EXIT_CODE:RUN_ID for each tox env run (tools/run-tests):
    an env that failed with no failing test in its stestr run (pep8, a
    virtualenv that could not be built, a timeout that killed stestr)
    counts as one failed test, so that the closing line agrees with the
    exit status.
    """
    totals = {'passed': 0, 'failed': 0, 'skipped': 0}
    stestr, stats = _tool('stestr'), _tool('subunit-stats')
    filter_ = _tool('subunit-filter')
    to_text = _tool('subunit2pyunit')
    env_of = {}
    for arg in argv:
        env, _, rest = arg.partition('=')
        env_of[rest.partition(':')[2]] = env
    ids = []
    if os.path.isdir('.stestr'):
        ids = sorted(int(name) for name in os.listdir('.stestr')
                     if name.isdigit())
    if ids and not (stestr and stats and filter_ and to_text):
        print('summary: no tox env with stestr and subunit tools in .tox',
              file=sys.stderr)
        ids = []
    real_passed = 0
    failed_in = {}
    for run_id in ids:
        stream = subprocess.run([stestr, 'history', 'show', str(run_id),
                                 '--subunit'], capture_output=True).stdout
        counts = _counts(stats, stream)
        for key in totals:
            totals[key] += counts[key]
        failed_in[run_id] = counts['failed']
        if counts['failed']:
            failures = subprocess.run(
                [filter_, '--only-genuine-failures', '--no-passthrough'],
                input=stream, capture_output=True).stdout
            _print_failures(env_of.get(str(run_id), 'run %d' % run_id),
                            subprocess.run([to_text, '--no-passthrough'],
                                           input=failures,
                                           capture_output=True).stderr)
        # Each tier's prerequisites test passes whenever the machine has
        # what the tier needs: it is no proof that a test ran.
        others = subprocess.run(
            [filter_, '--success', '--without', PREREQ_TEST,
             '--no-passthrough'],
            input=stream, capture_output=True).stdout
        real_passed += _counts(stats, others)['passed']
    for arg in argv:
        env, _, rest = arg.partition('=')
        code, _, run_id = rest.partition(':')
        if code == '0':
            continue
        if run_id.isdigit() and failed_in.get(int(run_id)):
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


def _print_failures(env, text):
    """Name each failed test of ``text`` (subunit2pyunit's report) with
    ``env`` and the last TRACEBACK_LINES lines of its traceback.
    """
    lines = text.decode(errors='replace').splitlines()
    for start, line in enumerate(lines):
        match = re.match(r'(FAIL|ERROR): (\S+)$', line)
        if not match:
            continue
        print('summary: %s FAILED in tier %s:' % (match.group(2), env),
              flush=True)
        # The traceback: from its last 'Traceback' line before the next
        # test's report (log attachments come first) to the blank line
        # that ends it.
        end = next((i for i in range(start + 1, len(lines))
                    if re.match(r'(FAIL|ERROR): |={20,}$|-{20,}$', lines[i])
                    and i > start + 2), len(lines))
        body = lines[start + 1:end]
        tb = max((i for i, text in enumerate(body) if 'Traceback (most '
                  'recent call last)' in text), default=0)
        body = body[tb:]
        while body and not body[-1].strip():
            body.pop()
        for text in body[-TRACEBACK_LINES:]:
            print('    ' + text, flush=True)


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
