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

"""The doc pages' console sessions, run against the one-box cloud.

Each ``doc/source/_examples/cloud/NAME.console`` is a console session a page
shows with ``literalinclude`` (tests/unit/test_docs.py fails when one is
included by no page). ``tools/cloud-tempest`` runs every one of them, in
name order, with this script, after ``tools/cloud-up`` and before Tempest:

* ``$ COMMAND`` lines are commands, run one after the other by bash at the
  top of the clone, as root, with the environment the previous command
  left (so ``. /var/tmp/prealloc-cloud/openrc`` holds for the rest of the
  session; that path is replaced by the cloud's CLOUD_DIR). A session
  starts with the cloud's openrc sourced: an operator's page need not show
  this cloud's file;
* the lines after a command, up to the next one, are its output
  (stdout and stderr together), compared line by line with what it
  printed, trailing blanks and blank last lines aside. In them ``...``
  stands for any text and a word of capitals ending in ``_ID`` (``FLAVOR_ID``)
  for a UUID or a number. A command shown without output must exit 0; its
  output is not compared;
* ``# ...`` lines are comments;
* the commands ``tox -e cloud`` itself runs (``bash tools/cloud-up``,
  ``bash tools/cloud-tempest``, ``bash tools/cloud-down``: RUN_BY_TIER)
  are not run again.

``NAME.setup`` and ``NAME.cleanup``, when present, are bash scripts run
before and after the session (the cleanup also after a failure): what the
page takes for granted (a flavor it sets properties on) and what the
session leaves behind.

    python3 tools/doc_examples.py --cloud-dir DIR [NAME...]
    python3 tools/doc_examples.py --list
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(TOP, 'doc', 'source', '_examples', 'cloud')
DOC_CLOUD_DIR = '/var/tmp/prealloc-cloud'
RUN_BY_TIER = ('bash tools/cloud-up', 'bash tools/cloud-tempest',
               'bash tools/cloud-down')
PLACEHOLDER = re.compile(r'\b[A-Z][A-Z0-9_]*_ID\b')
COMMAND_TIMEOUT = 600


class Step(object):
    def __init__(self, command, expected):
        self.command = command
        self.expected = expected

    @property
    def run_by_tier(self):
        return strip_comment(self.command) in RUN_BY_TIER


def strip_comment(command):
    """The command without a trailing ``  # comment``."""
    return re.sub(r'\s+#\s.*$', '', command).strip()


def parse(text):
    """[Step] of a console session."""
    steps = []
    for line in text.splitlines():
        if line.startswith('$ '):
            steps.append(Step(line[2:].strip(), []))
        elif line.startswith('#') or (not steps and not line.strip()):
            continue
        elif not steps:
            raise ValueError('output before the first command: %r' % line)
        else:
            steps[-1].expected.append(line)
    for step in steps:
        trim(step.expected)
    return steps


def trim(lines):
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def line_pattern(expected):
    """A regular expression matching one expected output line."""
    out = []
    for i, part in enumerate(PLACEHOLDER.split(expected)):
        if i:
            out.append(r'[0-9a-f-]+')
        out.append('.*'.join(re.escape(bit) for bit in part.split('...')))
    return re.compile(''.join(out) + r'\Z')


def mismatch(expected, actual):
    """None when ``actual`` (lines) is what ``expected`` shows; else why."""
    actual = trim([line.rstrip() for line in actual])
    expected = [line.rstrip() for line in expected]
    for n, (want, got) in enumerate(zip(expected, actual), 1):
        if not line_pattern(want).match(got):
            return 'line %d: expected %r, got %r' % (n, want, got)
    if len(expected) != len(actual):
        return '%d lines expected, %d printed' % (len(expected), len(actual))
    return None


def sessions(names=None):
    found = sorted(name[:-len('.console')] for name in os.listdir(EXAMPLES)
                   if name.endswith('.console'))
    for name in names or found:
        if name not in found:
            raise SystemExit('no %s.console in %s' % (name, EXAMPLES))
    return names or found


def run_bash(script, env, cloud_dir):
    """(exit code, output, environment after) of ``script`` in bash."""
    with tempfile.NamedTemporaryFile(prefix='doc-examples-env.') as env_file:
        wrapped = '%s\nrc=$?\nenv -0 > %s\nexit $rc\n' % (
            script.replace(DOC_CLOUD_DIR, cloud_dir), env_file.name)
        proc = subprocess.run(['bash', '-c', wrapped], cwd=TOP, env=env,
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT,
                              timeout=COMMAND_TIMEOUT,
                              universal_newlines=True)
        raw = env_file.read().decode()
    new_env = dict(item.split('=', 1) for item in raw.split('\0')
                   if '=' in item)
    return proc.returncode, proc.stdout, new_env or env


def run_session(name, cloud_dir, env):
    """[failure message] of one session (empty: it passed)."""
    path = os.path.join(EXAMPLES, name)
    with open(path + '.console') as f:
        steps = parse(f.read())
    failures = []
    openrc = os.path.join(cloud_dir, 'openrc')
    if os.path.exists(openrc):
        _rc, _out, env = run_bash('. %s' % openrc, env, cloud_dir)
    try:
        if os.path.exists(path + '.setup'):
            with open(path + '.setup') as f:
                rc, out, _env = run_bash(f.read(), env, cloud_dir)
            if rc:
                return ['%s.setup exited %d:\n%s' % (name, rc, out)]
        for step in steps:
            if step.run_by_tier:
                print('%s: skipped (tox -e cloud runs it): %s'
                      % (name, step.command))
                continue
            print('%s: $ %s' % (name, step.command))
            rc, out, env = run_bash(step.command, env, cloud_dir)
            if step.expected:
                why = mismatch(step.expected, out.splitlines())
            else:
                why = rc and 'exit status %d' % rc
            if why:
                failures.append('%s: $ %s\n  %s\n  output:\n%s' % (
                    name, step.command, why,
                    ''.join('    %s\n' % line for line in out.splitlines())))
                break
    finally:
        if os.path.exists(path + '.cleanup'):
            with open(path + '.cleanup') as f:
                rc, out, _env = run_bash(f.read(), env, cloud_dir)
            if rc:
                failures.append('%s.cleanup exited %d:\n%s' % (name, rc, out))
    return failures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--cloud-dir', default=DOC_CLOUD_DIR)
    parser.add_argument('--list', action='store_true')
    parser.add_argument('names', nargs='*')
    args = parser.parse_args(argv)
    names = sessions(args.names)
    if args.list:
        print('\n'.join(names))
        return 0
    env = {'PATH': os.environ.get('PATH', '/usr/bin:/bin'),
           'HOME': os.environ.get('HOME', '/root'), 'LANG': 'C.UTF-8',
           'COLUMNS': '200'}
    failures = []
    for name in names:
        failures += run_session(name, args.cloud_dir, dict(env))
    for failure in failures:
        print('FAILED %s' % failure, file=sys.stderr)
    print('doc examples: %d sessions, %d failed' % (len(names),
                                                     len(failures)))
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
