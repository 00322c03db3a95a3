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

The checks follow oslo.upgradecheck (as ``nova-status upgrade check``):
each returns a Result of Code SUCCESS, WARNING or FAILURE, and the exit
status is the highest code: 0 all good; 1 warnings, spawns work but not
everything is as nova.conf asks (say, disks left thin on a filesystem
without fallocate(2)); 2 a spawn would fail, or nova-compute would not start
the plugin. Every warning and failure comes with its fix.
"""

import argparse
import json
import logging
import re
import sys
import textwrap

from oslo_config import cfg
from oslo_upgradecheck import upgradecheck
from oslo_utils import units
import prettytable

from prealloc_backend import checks
from prealloc_backend.checks import host as check_host
from prealloc_backend.checks import owner
from prealloc_backend.checks import result
from prealloc_backend import conf as pb_conf
from prealloc_backend import exception
from prealloc_backend.system import stopping

Code = result.Code

TITLE = 'prealloc_backend host check'
STATUS = {Code.SUCCESS: 'Success', Code.WARNING: 'Warning',
          Code.FAILURE: 'Failure'}

DEFAULT_DISK_SIZE = '1G'


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


def _method(func):
    """An oslo.upgradecheck check method running ``func(host)``."""
    def check(self):
        return func(self.host)
    check.__name__ = func.__name__
    check.__doc__ = func.__doc__
    return check


class HostChecks(upgradecheck.UpgradeCommands):
    """The checks of one host (prealloc_backend.checks.CHECKS)."""

    display_title = TITLE
    _upgrade_checks = tuple((name, _method(func))
                            for name, func in checks.CHECKS)

    def __init__(self, host):
        self.host = host

    def _invalid_label(self, exc):
        match = re.match(r'Value for option (\S+)', str(exc))
        name = match.group(1) if match else None
        labels = [label for label in self.host.invalid_options
                  if label.endswith('] %s' % name)]
        return ' or '.join(labels) or 'an option (%s)' % exc

    def run_checks(self, stop=None):
        """[(name, Result)] of every check; a check never raises.

        ``stop`` (a stopping.Stop): once it is requested (SIGINT or
        SIGTERM; its watcher has killed the running check's children), the
        running check is a Failure "Not finished" and the checks after it
        Failures "Not run": a stopped check never reads as a Success.
        """
        results = []
        for index, (name, func) in enumerate(self._upgrade_checks):
            if stop is not None and stop.requested:
                results.extend((later, _not_run(stop, 'Not run'))
                               for later, _f in self._upgrade_checks[index:])
                break
            stopping.pause_point('check ' + name)
            try:
                res = self._run_one(func)
            except BaseException:
                if stop is None or not stop.requested:
                    raise
                res = None
            if stop is not None and stop.requested:
                res = _not_run(stop, 'Not finished')
            results.append((name, res))
        return results

    def _run_one(self, func):
        try:
            res = func(self)
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
        return res


def _not_run(stop, what):
    return result.failure(
        '%s: %s stopped the check.' % (what,
                                       stopping.signal_name(stop.signum)),
        'Run prealloc-backend check again.')


def render_json(results, config_files):
    code = max((r.code for _n, r in results), default=Code.SUCCESS)
    return json.dumps({
        'name': TITLE,
        'result': int(code),
        'status': STATUS[code],
        'config_files': config_files,
        'checks': [{'check': name, 'result': int(r.code),
                    'status': STATUS[r.code], 'details': r.details,
                    'fix': r.fix, 'facts': r.facts}
                   for name, r in results],
    }, indent=2, sort_keys=False, default=str)


def _wrap(text, first):
    return '\n'.join(textwrap.wrap(text, 72, initial_indent=first,
                                   subsequent_indent='  ',
                                   break_on_hyphens=False))


def render_table(results):
    table = prettytable.PrettyTable([TITLE], hrules=prettytable.ALL)
    table.align = 'l'
    for name, res in results:
        lines = ['Check: %s' % name, 'Result: %s' % STATUS[res.code],
                 _wrap(res.details or '', 'Details: ')]
        if res.fix:
            lines.append(_wrap(res.fix, 'Fix: '))
        table.add_row(['\n'.join(lines)])
    code = max((r.code for _n, r in results), default=Code.SUCCESS)
    return '%s\nOverall: %s (exit status %d)' % (table, STATUS[code],
                                                  int(code))


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
        '--verbose', action='store_true',
        help='Print the log lines of the plugin and nova on stderr.')


def run(args):
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.ERROR,
        format='%(levelname)s %(name)s: %(message)s', stream=sys.stderr)
    conf = pb_conf.CONF
    try:
        load_config(conf, args.config_file, args.config_dir)
    except ConfigLoadError as exc:
        results = [('Configuration', result.failure(
            str(exc), 'Pass the files nova-compute reads: --config-file '
                      '/etc/nova/nova.conf (repeatable) or --config-dir.'))]
        files = list(args.config_file) + list(args.config_dir)
    else:
        host = check_host.Host(
            conf, oslo_args(args.config_file, args.config_dir),
            args.disk_size, qemu_conf=args.qemu_conf,
            nova_user=args.nova_user)
        stopping.install_test_hooks()
        with stopping.on_signals() as stop:
            results = HostChecks(host).run_checks(stop)
        files = list(conf.config_file or []) + list(conf.config_dir or [])
    if args.json:
        print(render_json(results, files))
    else:
        print(render_table(results))
    return int(max(r.code for _n, r in results))
