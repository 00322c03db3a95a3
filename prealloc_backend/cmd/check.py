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

"""``prealloc-backend check``: will this host do what nova.conf asks?

Run on a compute host, with the configuration files nova-compute reads,
before the first spawn::

    prealloc-backend check --config-file /etc/nova/nova.conf [--json]

It reads nova's configuration like nova-compute (oslo.config, the same
``--config-file`` / ``--config-dir`` conventions, /etc/nova/nova.conf when
none is given) and runs the checks of prealloc_backend.checks, one concern
each, in order. This module is the command line only: arguments, loading
the configuration, running the checks, printing the table or the JSON.

Run it as root. What it writes, it writes in instances_path as the owner of
that directory (the nova user), in a child process (see checks/owner.py,
checks/host.py, checks/qemu_img.py); everything else it only reads.

The checks run on oslo.upgradecheck, as ``nova-status upgrade check``
(nova/cmd/status.py) runs nova's: HostChecks is an
``upgradecheck.UpgradeCommands`` whose ``_upgrade_checks`` are the
(name, method) tuples of checks.CHECKS, each returning an
``upgradecheck.Result`` of Code SUCCESS, WARNING or FAILURE; its
``check()`` runs them in order, prints upgradecheck's table and returns
the highest Code, which is the exit status: 0 all good; 1 warnings, spawns
work but not everything is as nova.conf asks (say, disks left thin on a
filesystem without fallocate(2)); 2 a spawn would fail, or nova-compute
would not start the plugin. As nova-status, an error of the command itself
prints "Error:" and its traceback and exits 255.

Kept of our own, each because an operator needs it:

- The command line: ``prealloc-backend check`` beside ``bench``, with
  argparse, not upgradecheck's ``upgrade check`` subcommand (nova-status
  does not use ``upgradecheck.main`` either). nova's files are parsed as
  nova-compute parses them; --disk-size, --qemu-conf and --nova-user say
  what to judge this host against, --verbose shows the log lines.
- A ``Fix:`` line under the details of each warning and failure
  (``Report._get_details``, upgradecheck's hook for a row's text):
  upgradecheck's row has Details only, and nova-status runs its remedy
  into them.
- A check never raises (``HostChecks.run_one``): an invalid option value
  it needs, a PreallocError, a step in instances_path that failed or
  timed out is a Failure saying so. upgradecheck's ``check()`` lets an
  exception end the run with no table at all, and one invalid option
  would stop every check that reads it.
- The first SIGINT or SIGTERM stops the run (issue 36): the running
  check is a Failure "Not finished", the later ones Failures "Not run",
  and the table is still printed: a stopped check never reads as a
  Success.
- Configuration files that cannot be read are one Failure row,
  "Configuration", in the same table, instead of oslo.config's traceback.
- ``--json``: upgradecheck prints its JSON (``name``, ``checks`` with
  ``check``, ``result``, ``details``) only for its own ``upgrade check
  --json`` option, read from its module's global CONF, and without the
  fix. render_json prints the same object with, for each check, its
  ``status`` (the word the table shows), ``fix`` and ``facts`` (what it
  measured, which configuration management asserts on).
"""

import argparse
import json
import logging
import os
import re
import sys
import textwrap
import threading
import time
import traceback

from oslo_config import cfg
from oslo_upgradecheck import upgradecheck
from oslo_utils import units

from prealloc_backend import checks
from prealloc_backend.checks import host as check_host
from prealloc_backend.checks import owner
from prealloc_backend.checks import result
from prealloc_backend import conf as pb_conf
from prealloc_backend import exception
from prealloc_backend.system import stopping

TITLE = 'prealloc_backend host check'
# upgradecheck wraps a row's details at 60 columns; the fix likewise.
WIDTH = 60
# An error of the command itself, not a check's verdict (as
# upgradecheck.run and nova-status).
ERROR_EXIT = 255

DEFAULT_DISK_SIZE = '1G'
# Seconds the whole command may take, from its process's start: what an
# operator's health probe allows.
DEFAULT_TIMEOUT = 60
MIN_TIMEOUT = 5
MAX_TIMEOUT = 24 * 3600
# Seconds before the deadline at which the checks are stopped (their
# children killed), so that the table is printed by the deadline.
STOP_AHEAD = 3
# Seconds before the deadline at which, if the checks have not come back
# from a stopped step, the report of what finished is printed from
# another thread and the command exits.
BACKSTOP_AHEAD = 1


class ConfigLoadError(Exception):
    """The configuration files cannot be read at all."""


class SizeError(ValueError, argparse.ArgumentTypeError):
    """A --disk-size argparse reports with its own message."""


# A whole number of bytes, optionally with K, M, G or T (any case, an
# optional 'B' or 'iB' after it): what --disk-size accepts.
_SIZE = re.compile(r'\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*', re.IGNORECASE)
_FACTOR = {'': 1, 'K': units.Ki, 'M': units.Mi, 'G': units.Gi, 'T': units.Ti}


def parse_size(text):
    """'4M', '10G', '512K', '20GiB', '1T' or bytes -> bytes (powers of 1024).

    Not oslo_utils.strutils.string_to_bytes, whose accepted inputs and
    results differ: it wants a unit ('512' and '4M' fail), reads a
    lower-case 'b' as bits ('4Mb' would be 512 KiB, where it means 4 MiB
    here), refuses lower-case prefixes other than 'k', accepts fractions
    and signs ('1.5G', '-1G'), which a disk's size in bytes has no use for,
    and computes in floating point (9007199254740993 bytes would come back
    one byte short). Using it on a rewritten argument would leave only the
    multiplication to it.
    """
    match = _SIZE.fullmatch(str(text))
    if not match:
        raise SizeError(
            '%r is not a size: give a whole number of bytes, optionally '
            'followed by K, M, G or T (powers of 1024), e.g. 512M, 10G or '
            '1T' % (text,))
    return int(match.group(1)) * _FACTOR[match.group(2).upper()]


def oslo_args(config_files, config_dirs):
    args = []
    for path in config_files or ():
        args += ['--config-file', path]
    for path in config_dirs or ():
        args += ['--config-dir', path]
    return args


def load_config(conf, config_files, config_dirs):
    """Parse the configuration the way nova-compute does.

    Raises ConfigLoadError naming the file when it cannot be read.
    """
    try:
        conf(oslo_args(config_files, config_dirs), project='nova',
             prog='nova-compute')
    except cfg.ConfigFilesNotFoundError as exc:
        raise ConfigLoadError(
            'configuration file not found or not readable: %s'
            % ', '.join(exc.config_files))
    except cfg.ConfigDirNotFoundError as exc:
        raise ConfigLoadError('configuration directory not found: %s'
                              % exc.config_dir)
    except cfg.ConfigFileParseError as exc:
        raise ConfigLoadError('cannot parse %s: %s'
                              % (exc.config_file, exc.msg))
    except cfg.Error as exc:
        raise ConfigLoadError(str(exc))


def _guarded(name, func):
    """The ``_upgrade_checks`` method of the check ``func(host)``."""
    def method(self):
        return self.run_one(name, func)
    method.__name__ = func.__name__
    method.__doc__ = func.__doc__
    return method


class Report(upgradecheck.UpgradeCommands):
    """upgradecheck's report: its table with a Fix line, or --json's."""

    display_title = TITLE

    def _get_details(self, upgrade_check_result):
        details = super()._get_details(upgrade_check_result)
        fix = getattr(upgrade_check_result, 'fix', None)
        if not fix:
            return details
        return '%s\n%s' % (details, '\n'.join(textwrap.wrap(
            'Fix: ' + fix, WIDTH, subsequent_indent='  ',
            break_on_hyphens=False)))

    def results(self):
        """[(name, Result)] of every check in order, as check() runs them
        (for --json, which check() does not print with the fix and facts).
        """
        return [(name, func(self)) for name, func in self._upgrade_checks]


class ConfigUnread(Report):
    """The report when nova's configuration files cannot be read."""

    def __init__(self, error, files):
        super().__init__()
        self.error = error
        self.files = files

    def check_configuration(self):
        return result.failure(
            str(self.error),
            'Pass the files nova-compute reads: --config-file '
            '/etc/nova/nova.conf (repeatable) or --config-dir.',
            config_files=self.files)

    _upgrade_checks = (('Configuration', check_configuration),)


class HostChecks(Report):
    """The checks of one host (prealloc_backend.checks.CHECKS).

    ``stop`` (a stopping.Stop): once it is requested (SIGINT or SIGTERM;
    its watcher has killed the running check's children), the running
    check is a Failure "Not finished" and the checks after it Failures
    "Not run".
    """

    _upgrade_checks = tuple((name, _guarded(name, func))
                            for name, func in checks.CHECKS)

    def __init__(self, host, stop=None):
        super().__init__()
        self.host = host
        self.stop = stop
        # [(name, Result)] of the checks finished, and the one running:
        # what the backstop prints if a step never comes back.
        self.finished = []
        self.running = None

    def _stopped(self):
        return self.stop is not None and self.stop.requested

    def run_one(self, name, func):
        """The Result of ``func(self.host)``; never raises a check's
        errors (see the module's docstring).
        """
        if self._stopped():
            return self._done(name, _not_run(self.stop, 'Not run'))
        self.running = name
        stopping.pause_point('check ' + name)
        try:
            res = self._verdict(func)
        except BaseException:
            if not self._stopped():
                raise
            res = None
        if self._stopped():
            res = _not_run(self.stop, 'Not finished')
        return self._done(name, res)

    def _done(self, name, res):
        self.running = None
        self.finished.append((name, res))
        return res

    def so_far(self):
        """[(name, Result)] of every check: the finished ones, the one
        running as "Not finished", the others "Not run".
        """
        done = dict(self.finished)
        out = []
        for name, _func in self._upgrade_checks:
            if name in done:
                out.append((name, done[name]))
            elif name == self.running:
                out.append((name, _not_run(self.stop, 'Not finished')))
            else:
                out.append((name, _not_run(self.stop, 'Not run')))
        return out

    def _invalid_label(self, exc):
        match = re.match(r'Value for option (\S+)', str(exc))
        name = match.group(1) if match else None
        labels = [label for label in self.host.invalid_options
                  if label.endswith('] %s' % name)]
        return ' or '.join(labels) or 'an option (%s)' % exc

    def _verdict(self, func):
        try:
            res = func(self.host)
        except ValueError as exc:
            # An invalid option value this check needed: the
            # Configuration check names it and what is allowed.
            res = result.failure(
                'Not checked: it needs %s, whose value is invalid.'
                % self._invalid_label(exc),
                'See the Configuration check.')
        except exception.PreallocError as exc:
            res = result.failure(
                exc.format_message(),
                'See the message: spawns fail the same way.')
        except owner.UnsafeDirectory as exc:
            res = result.failure('Not checked: %s' % exc,
                                 'See the message.')
        except owner.StepTimedOut as exc:
            res = result.failure(
                'Not checked: %s.' % exc.message,
                'Run the check again; if it times out again, find what '
                'stops or slows processes of %s.' % exc.user)
        except owner.StepFailed as exc:
            res = result.failure(
                'Not checked: the probe in instances_path, run as %s, '
                'failed: %s' % (exc.user, exc.message),
                'See the message: whoever writes there as %s meets the '
                'same error.' % exc.user)
        except Exception as exc:
            # A check never ends the command (a bug, or what the nova user
            # put in instances_path): it is a Failure saying so.
            logging.getLogger(__name__).exception('check %s', func)
            res = result.failure(
                'Not checked: the check itself failed: %s: %s'
                % (type(exc).__name__, exc),
                'Run it again with --verbose and report the traceback.')
        return res


def _not_run(stop, what):
    if stop.timed_out:
        return result.failure(
            '%s: the command reached %s (--timeout) %s.' % (
                what, stop.cause,
                'with this check unfinished; the processes it ran were '
                'killed' if what == 'Not finished' else 'before it'),
            'Find what stops or slows it (the processes it runs in '
            'instances_path run as the nova user), or give --timeout '
            'more.')
    return result.failure(
        '%s: %s stopped the check.' % (what, stop.cause),
        'Run prealloc-backend check again.')


class Fixed(Report):
    """A report of results already known (the backstop's)."""

    def __init__(self, results):
        super().__init__()
        self._results = results
        self._upgrade_checks = tuple(
            (name, (lambda res: lambda self: res)(res))
            for name, res in results)


def render_json(results):
    """upgradecheck's JSON with each check's status, fix and facts."""
    return json.dumps({
        'name': TITLE,
        'checks': [{'check': name, 'result': int(r.code),
                    'status': str(upgradecheck.UPGRADE_CHECK_MSG_MAP[r.code]),
                    'details': r.details, 'fix': r.fix, 'facts': r.facts}
                   for name, r in results],
    }, indent=2, default=str)


def add_arguments(parser):
    parser.add_argument(
        '--config-file', action='append', default=[], metavar='PATH',
        help='A configuration file nova-compute reads (repeatable, later '
             'files override earlier ones). Default: nova.conf and '
             'nova-compute.conf in ~/.nova/, ~/, /etc/nova/, /etc/.')
    parser.add_argument(
        '--config-dir', action='append', default=[], metavar='DIR',
        help='A directory of *.conf files nova-compute reads, after the '
             '--config-file files (repeatable).')
    parser.add_argument(
        '--json', action='store_true',
        help='Print the results as JSON (with the measured facts).')
    parser.add_argument(
        '--disk-size', default=DEFAULT_DISK_SIZE, type=parse_size,
        metavar='SIZE',
        help='Size of the new disk the free space must fit, e.g. 20G '
             '(default %s).' % DEFAULT_DISK_SIZE)
    parser.add_argument(
        '--qemu-conf', default=check_host.QEMU_CONF, metavar='PATH',
        help="libvirt's qemu.conf on this host (default %s)."
             % check_host.QEMU_CONF)
    parser.add_argument(
        '--nova-user', metavar='NAME',
        help='The user nova-compute runs as, against whom the check judges '
             'what root runs. Default: the owner of instances_path (no '
             'symlink followed), else of [DEFAULT] state_path.')
    parser.add_argument(
        '--timeout', default=DEFAULT_TIMEOUT, type=_timeout,
        metavar='SECONDS',
        help='The most the whole command may take, from its start '
             '(default %d): the check running then, and what it runs, is '
             'stopped and reported "Not finished", the checks after it "Not '
             'run".' % DEFAULT_TIMEOUT)
    parser.add_argument(
        '--verbose', action='store_true',
        help='Print the log lines of the plugin and nova on stderr.')


def _timeout(text):
    try:
        value = float(text)
    except ValueError:
        value = -1
    if not MIN_TIMEOUT <= value <= MAX_TIMEOUT:
        raise SizeError('--timeout %r: a number of seconds from %d to %d'
                        % (text, MIN_TIMEOUT, MAX_TIMEOUT))
    return value


def report(checked, as_json, backstop=None):
    """Run ``checked``'s checks (a Report), print upgradecheck's table or
    the JSON (through ``backstop``, a Backstop, when given: one report,
    never two); the exit status.
    """
    results = checked.results()
    if backstop is not None:
        return backstop.show(results)
    return show(results, as_json)


def show(results, as_json):
    """Print the [(name, Result)] ``results`` as upgradecheck's table or
    the JSON; the exit status.
    """
    if not as_json:
        return int(Fixed(results).check())
    print(render_json(results))
    return int(max(r.code for _n, r in results))


def _run(args):
    conf = pb_conf.CONF
    try:
        load_config(conf, args.config_file, args.config_dir)
    except ConfigLoadError as exc:
        files = list(args.config_file) + list(args.config_dir)
        return report(ConfigUnread(exc, files), args.json)
    host = check_host.Host(
        conf, oslo_args(args.config_file, args.config_dir),
        args.disk_size, qemu_conf=args.qemu_conf, nova_user=args.nova_user)
    stopping.install_test_hooks()
    # From the command's start (cmd/main.py: its process's), else from now.
    started = getattr(args, 'started', None)
    if started is None:
        started = time.monotonic()
    left = args.timeout - (time.monotonic() - started)
    with stopping.on_signals(timeout=max(0, left - STOP_AHEAD)) as stop:
        stop.timeout = args.timeout
        checked = HostChecks(host, stop)
        backstop = Backstop(checked, args.json,
                            max(0, left - BACKSTOP_AHEAD))
        try:
            return report(checked, args.json, backstop)
        finally:
            backstop.cancel()


class Backstop:
    """The deadline's last resort: should the checks not come back from a
    stopped step (a system call that does not end when the children it
    waits for are killed), print the report of what finished, the running
    check "Not finished", and exit 2 (``exit``) from another thread, at
    ``after`` seconds. One report is printed, never two: the checks'
    (``show``) or the backstop's.
    """

    def __init__(self, checked, as_json, after, exit=os._exit):
        self.checked = checked
        self.as_json = as_json
        self.exit = exit
        self._lock = threading.Lock()
        self._printed = False
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(after,),
                                       name='check-backstop', daemon=True)
        self.thread.start()

    def _claim(self):
        with self._lock:
            first, self._printed = not self._printed, True
            return first

    def show(self, results):
        """Print the checks' report unless the backstop printed its own
        (then wait for its exit): the exit status.
        """
        if not self._claim():
            self.thread.join()
            return int(upgradecheck.Code.FAILURE)
        return show(results, self.as_json)

    def _run(self, after):
        if self.done.wait(after) or not self._claim():
            return
        try:
            stop = self.checked.stop
            stop.request_timeout()
            show(self.checked.so_far(), self.as_json)
            sys.stdout.flush()
        finally:
            self.exit(int(upgradecheck.Code.FAILURE))

    def cancel(self):
        self.done.set()


def setup_logging(verbose):
    """The commands' logging: errors only on stderr, everything with
    --verbose (what they say to the operator is their own output).
    """
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.ERROR,
        format='%(levelname)s %(name)s: %(message)s', stream=sys.stderr)


def run(args):
    setup_logging(args.verbose)
    try:
        return _run(args)
    except Exception:
        print('Error:\n%s' % traceback.format_exc())
        return ERROR_EXIT
