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

"""Check how nova-compute will start the plugin's privileged daemon.

Either ``[prealloc_backend_privsep] helper_command`` is set, and the check
reads it: an executable, a configuration that gives the daemon the same
``instances_path`` as nova-compute (the daemon validates every disk path
against its own reading of it), privsep-helper named. Or nova-compute's root
helper starts it, and the check builds the exact command line oslo.privsep
will run and matches it against nova-rootwrap's filters the way
nova-rootwrap does (oslo.rootwrap's own ``match_filter``), reporting which
filter lets it through: the plugin's shipped filter file, or oslo.rootwrap's
built-in ``privsep-helper`` rule (which accepts any configuration file the
nova user chooses; doc/source/admin/security.rst says how to close that
door). Either way the
Python that runs privsep-helper must import the plugin.

A problem does not stop the check: one run names every problem.
"""

import configparser
import os
import shlex
import shutil
import tempfile

from oslo_config import cfg
from oslo_log import log as logging
from oslo_privsep import priv_context
from oslo_rootwrap import wrapper as rootwrap_wrapper

from prealloc_backend.checks import result
from prealloc_backend import exception
from prealloc_backend import modes
import prealloc_backend.privsep
from prealloc_backend import process

LOG = logging.getLogger(__name__)
Code = result.Code

# The nova-rootwrap filter file the plugin ships (etc/rootwrap.d/).
FILTER_FILE = 'prealloc_backend.filters'
# Seconds the helper's Python may take to import the plugin (and nova):
# about 2 s on an idle host, a minute on a loaded test machine.
IMPORT_TIMEOUT = 180


class Findings:
    """What the privsep check found: facts, sentences describing the setup,
    and (code, sentence, fix) of each problem.
    """

    def __init__(self):
        self.facts = {}
        self.notes = []
        self.problems = []

    def problem(self, code, sentence, fix):
        self.problems.append((code, sentence, fix))


def config_args(argv):
    """(--config-file values, --config-dir values) of a command line."""
    files, dirs = [], []
    for index, arg in enumerate(argv):
        for flag, found in (('--config-file', files), ('--config-dir', dirs)):
            if arg == flag and index + 1 < len(argv):
                found.append(argv[index + 1])
            elif arg.startswith(flag + '='):
                found.append(arg.split('=', 1)[1])
    return files, dirs


def script_interpreter(path):
    """argv of the interpreter of a '#!' script, or None."""
    try:
        with open(path, 'rb') as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b'#!'):
        return None
    return shlex.split(first[2:].decode(errors='replace')) or None


def helper_instances_path(files, dirs):
    """instances_path as a daemon started with these --config-file and
    --config-dir arguments reads it (None when unreadable).
    """
    import nova.conf.compute
    import nova.conf.paths

    scratch = cfg.ConfigOpts()
    opts = {opt.dest: opt for opt in nova.conf.paths.ALL_OPTS}
    for opt in nova.conf.compute.ALL_OPTS:
        if opt.dest == 'instances_path':
            opts['instances_path'] = opt
    scratch.register_opts(list(opts.values()))
    args = []
    for path in files:
        args += ['--config-file', path]
    for path in dirs:
        args += ['--config-dir', path]
    try:
        # privsep-helper parses its arguments with project 'privsep'.
        scratch(args, project='privsep', prog='privsep-helper',
                default_config_files=[])
        return scratch.instances_path
    except (cfg.Error, ValueError) as exc:
        LOG.warning("Cannot read the helper's configuration: %s", exc)
        return None


def via_helper_command(host, helper_command, found):
    """Check ``helper_command``; return the privsep-helper it runs, or
    None.
    """
    section = prealloc_backend.privsep.ctx.cfg_section
    argv = shlex.split(helper_command)
    found.facts.update(method='helper_command', command=argv)
    fix = 'Correct [%s] helper_command.' % section
    if not argv or not shutil.which(argv[0]):
        found.problem(Code.FAILURE, 'helper_command %r: %s is not an '
                      'executable in PATH.' % (helper_command, argv[:1]),
                      fix)
        return None
    files, dirs = config_args(argv)
    found.facts.update(helper_config_files=files, helper_config_dirs=dirs)
    ours = os.path.realpath(host.conf.instances_path)
    theirs = helper_instances_path(files, dirs)
    found.facts['helper_instances_path'] = theirs
    if theirs is None or os.path.realpath(theirs) != ours:
        found.problem(
            Code.FAILURE,
            'The daemon started by helper_command reads instances_path = %s '
            '(its configuration: %s), not %s: it refuses every disk under '
            'instances_path.'
            % (theirs, ', '.join(files + dirs) or 'no --config-file, so '
               'nova.conf is not read', ours),
            "Pass nova-compute's configuration files to the helper: "
            'helper_command = sudo privsep-helper --config-file '
            '/etc/nova/nova.conf (oslo.privsep adds --privsep_context and '
            '--privsep_sock_path).')
    helper = next((a for a in argv
                   if os.path.basename(a).startswith('privsep-helper')),
                  None)
    if helper is None:
        found.problem(
            Code.WARNING,
            'helper_command %r does not name privsep-helper: whether the '
            'daemon can import the plugin is not checked.' % helper_command,
            "Make sure the command runs oslo.privsep's privsep-helper from "
            "nova's Python environment.")
        return None
    path = shutil.which(helper)
    if not path:
        found.problem(Code.FAILURE, 'helper_command %r: %s not found.'
                      % (helper_command, helper), fix)
        return None
    found.notes.append('helper_command runs %s.' % path)
    return path


def via_root_helper(host, found):
    """Check the start through nova-compute's root helper (no
    helper_command); return the privsep-helper it runs, or None.
    """
    from nova import utils as nova_utils

    ctx = prealloc_backend.privsep.ctx
    root_helper = nova_utils.get_root_helper()
    root_argv = shlex.split(root_helper)
    # The command line nova-compute builds: nova.cmd.compute gives
    # oslo.privsep this root helper; the socket directory is random.
    priv_context.init(root_helper=root_argv)
    cmd = ctx.helper_command(os.path.join(
        tempfile.gettempdir(), 'tmpXXXXXXXX', 'privsep.sock'))
    found.facts.update(method='root_helper', root_helper=root_helper,
                       command=cmd)
    found.notes.append('nova-compute runs "%s".' % ' '.join(cmd))
    if not shutil.which(root_argv[0]):
        found.problem(
            Code.FAILURE, '%s is not installed.' % root_argv[0],
            'Install %s and let the nova user run "%s privsep-helper" '
            'without a password (distribution packages of nova do).'
            % (root_argv[0], root_helper))
    if host.conf.workarounds.disable_rootwrap:
        helper = shutil.which('privsep-helper')
        if not helper:
            found.problem(Code.FAILURE, 'privsep-helper is not in PATH.',
                          'Install oslo.privsep where nova runs.')
        return helper
    return via_rootwrap(host, root_argv, cmd[len(root_argv):], found)


def via_rootwrap(host, root_argv, userargs, found):
    """Match the helper's command line against nova-rootwrap's filters
    exactly as nova-rootwrap does; return the privsep-helper it runs.
    """
    rootwrap_conf = host.conf.rootwrap_config
    found.facts['rootwrap_config'] = rootwrap_conf
    if len(root_argv) < 2 or not shutil.which(root_argv[1]):
        found.problem(Code.FAILURE, '%s is not in PATH.'
                      % ' '.join(root_argv[1:2]),
                      'Install nova (nova-rootwrap) in PATH.')
    parser = configparser.RawConfigParser()
    try:
        if not parser.read(rootwrap_conf):
            raise OSError('not found or not readable')
        config = rootwrap_wrapper.RootwrapConfig(parser)
    except (OSError, configparser.Error, ValueError) as exc:
        found.problem(
            Code.FAILURE, 'The rootwrap configuration %s ([DEFAULT] '
            'rootwrap_config) cannot be read: %s.' % (rootwrap_conf, exc),
            "Install nova's rootwrap.conf there (distribution packages do).")
        return None
    filters = rootwrap_wrapper.load_filters(config.filters_path)
    ours = [os.path.join(d, FILTER_FILE) for d in config.filters_path
            if os.path.isfile(os.path.join(d, FILTER_FILE))]
    found.facts.update(filters_path=config.filters_path,
                       exec_dirs=config.exec_dirs, filter_files=ours)
    try:
        matched = rootwrap_wrapper.match_filter(filters, userargs,
                                                config.exec_dirs)
    except rootwrap_wrapper.FilterMatchNotExecutable:
        found.problem(
            Code.FAILURE, 'nova-rootwrap finds no privsep-helper in its '
            'exec_dirs (%s).' % ', '.join(config.exec_dirs),
            'Add the directory holding privsep-helper (%s) to exec_dirs in '
            '%s.' % (os.path.dirname(shutil.which('privsep-helper') or '') or
                     'not in PATH either', rootwrap_conf))
        return None
    except rootwrap_wrapper.NoFilterMatched:
        found.problem(
            Code.FAILURE, 'nova-rootwrap refuses it: no filter in %s '
            'matches.' % ', '.join(config.filters_path),
            'Copy etc/rootwrap.d/%s to one of those directories.'
            % FILTER_FILE)
        return None
    found.facts['filter'] = matched.name
    note = 'nova-rootwrap allows it by the filter %s' % matched.name
    if matched.name == rootwrap_wrapper.load_filters([])[-1].name:
        note += (" (oslo.rootwrap's built-in rule for privsep-helper; %s %s)"
                 % (FILTER_FILE, 'installed but not matching these '
                    'arguments' if ours else 'not installed'))
    found.notes.append(note + '.')
    return matched.get_exec(exec_dirs=config.exec_dirs)


def helper_imports(helper, found):
    """The Python running privsep-helper must import the plugin."""
    found.facts['privsep_helper'] = helper
    interpreter = script_interpreter(helper)
    if interpreter is None:
        found.notes.append('%s is not a Python script: its environment is '
                           'not checked.' % helper)
        return
    found.facts['python'] = interpreter
    try:
        process.execute(*interpreter, '-c',
                        'import prealloc_backend.privsep.fs',
                        timeout=IMPORT_TIMEOUT)
    except exception.ProcessTimeout as exc:
        found.problem(
            Code.WARNING, 'Whether the Python of %s (%s) imports the plugin '
            'is not known: %s.' % (helper, ' '.join(interpreter), exc),
            'Run the check again when the host is less busy.')
        return
    except exception.ProcessFailed as exc:
        found.problem(
            Code.FAILURE, 'The Python of %s (%s) cannot import the plugin: '
            '%s' % (helper, ' '.join(interpreter),
                    str(getattr(exc, 'stderr', '') or exc).strip()[-300:]),
            'Install prealloc_backend in the Python environment of %s (the '
            'one nova-compute runs in).' % helper)
        return
    found.notes.append('The Python of %s (%s) imports the plugin.'
                       % (helper, ' '.join(interpreter)))


def check_privsep(host):
    """nova-compute can start the daemon, and the daemon can import the
    plugin and sees the same instances_path.
    """
    ctx = prealloc_backend.privsep.ctx
    found = Findings()
    helper_command = host.conf[ctx.cfg_section].helper_command
    if helper_command:
        helper = via_helper_command(host, helper_command, found)
    else:
        helper = via_root_helper(host, found)
    if helper:
        helper_imports(helper, found)
    details = ' '.join(found.notes + [p[1] for p in found.problems])
    if not found.problems:
        return result.success(details, **found.facts)
    fix = ' '.join(dict.fromkeys(p[2] for p in found.problems))
    if found.facts.get('method') == 'root_helper':
        fix += (' Or set [%s] helper_command instead (for example "sudo '
                'privsep-helper --config-file /etc/nova/nova.conf").'
                % ctx.cfg_section)
    code = max(p[0] for p in found.problems)
    if code == Code.WARNING:
        return result.warning(details, fix, **found.facts)
    # Raw disks, the raw config drive included, are allocated through
    # the daemon in modes space and full; flavors may ask for them.
    mode = host.mode
    if mode in (modes.Mode.SPACE, modes.Mode.FULL):
        return result.failure(
            details + ' In mode %s spawns fail when the first raw disk (a '
            'config drive included) is allocated.' % mode.value,
            fix, **found.facts)
    return result.warning(
        details + ' Not needed in mode %s, but instances of flavors with '
        '%s=space or full will fail to spawn.'
        % (mode.value, modes.FLAVOR_MODE_KEY), fix, **found.facts)
