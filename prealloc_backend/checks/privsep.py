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

Then the boundary: the check runs as root and judges what the nova user
(the owner of ``instances_path``) can change of what root runs. Whichever
route: privsep-helper (or prealloc-privsep-helper), its interpreter, every
``sys.path`` entry (and every file beneath) and the helper's configuration
(nova.conf, /etc/nova, oslo.config's default privsep.conf locations) must
not be changeable by the nova user. Through sudo (``helper_command = sudo
...``): sudo must let the nova user run exactly that command, reset the
environment and HOME for it and allow no SETENV (read from ``sudo -l -U``,
as root); the helper must be prealloc-privsep-helper (privsep-helper
connects to the socket path the nova user names, symlinks followed), and
with privsep-helper itself its log file, log directory and
log_config_append must not be changeable by the nova user (it logs as root
before it connects). Through nova-rootwrap, oslo.rootwrap's built-in rule
lets the nova user run privsep-helper with any arguments: a warning.
Security problems fail the check whatever the mode: the nova user can run
the helper through sudo itself.

A problem does not stop the check: one run names every problem.
"""

import configparser
import json
import os
import pwd
import re
import shlex
import shutil
import stat
import tempfile

from oslo_config import cfg
from oslo_log import log as logging
from oslo_privsep import priv_context
from oslo_rootwrap import wrapper as rootwrap_wrapper

from prealloc_backend.checks import instances
from prealloc_backend.checks import result
from prealloc_backend import exception
from prealloc_backend.planner import modes
import prealloc_backend.privsep
from prealloc_backend import privsep_helper
from prealloc_backend.system import process

LOG = logging.getLogger(__name__)
Code = result.Code

# The nova-rootwrap filter file the plugin ships (etc/rootwrap.d/).
FILTER_FILE = 'prealloc_backend.filters'
# Seconds the helper's Python may take to import the plugin (and nova):
# about 2 s on an idle host, a minute on a loaded test machine.
IMPORT_TIMEOUT = 180
# The plugin's wrapper for privsep-helper (setup.cfg console script).
WRAPPER = 'prealloc-privsep-helper'
SUDOERS_FILE = 'etc/prealloc_backend.sudoers'
SAFE_COMMAND = ('sudo /usr/bin/%s --config-file /etc/nova/nova.conf'
                % WRAPPER)
# A socket path as nova-compute's tempfile.mkdtemp() names it.
SAMPLE_SOCKET = '/tmp/tmpabcd1234/privsep.sock'
# Environment variables that steer the helper (names, or prefixes ending
# in '_' or PYTHON): HOME (~/.privsep/, Python's user site), Python's own,
# oslo.config's OS_<GROUP>__<OPT>, the dynamic loader's.
STEERING = ('HOME', 'PYTHON', 'OS_', 'LD_')
# Files beneath sys.path entries examined at most (a venv: ~30,000).
WALK_LIMIT = 200000


class Findings:
    """What the privsep check found: facts, sentences describing the setup,
    and (code, sentence, fix) of each problem.
    """

    def __init__(self):
        self.facts = {}
        self.notes = []
        self.problems = []

    def problem(self, code, sentence, fix, security=False):
        """A problem; ``security``: the nova user could steer root (a
        failure whatever the mode).
        """
        self.problems.append((code, sentence, fix))
        if security:
            self.security = True

    security = False


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
    if not _read_as_helper(scratch, files, dirs, 'configuration'):
        return None
    return scratch.instances_path


def _read_as_helper(scratch, files, dirs, what):
    """Parse ``files``/``dirs`` into ``scratch`` as the helper does
    (project 'privsep'); False (and a warning naming ``what``) when they
    cannot be read.
    """
    args = []
    for path in files:
        args += ['--config-file', path]
    for path in dirs:
        args += ['--config-dir', path]
    try:
        scratch(args, project='privsep', prog='privsep-helper',
                default_config_files=[])
    except (cfg.Error, ValueError) as exc:
        LOG.warning("Cannot read the helper's %s: %s", what, exc)
        return False
    return True


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
            'helper_command = sudo prealloc-privsep-helper --config-file '
            '/etc/nova/nova.conf (oslo.privsep adds --privsep_context and '
            '--privsep_sock_path).')
    helper = next((a for a in argv
                   if os.path.basename(a).startswith('privsep-helper') or
                   os.path.basename(a) == WRAPPER), None)
    if helper is None:
        found.problem(
            Code.WARNING,
            'helper_command %r names neither privsep-helper nor %s: whether '
            'the daemon can import the plugin is not checked.'
            % (helper_command, WRAPPER),
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


# Run by the helper's interpreter: what it imports from where.
PROBE = ('import json, sys, oslo_privsep, prealloc_backend.privsep.fs; '
         'print(json.dumps([sys.executable, sys.path, '
         'oslo_privsep.__file__, prealloc_backend.__file__]))')


def helper_imports(helper, found):
    """The Python running privsep-helper must import the plugin; return
    the paths it runs code from (interpreter, sys.path, packages), or [].
    """
    found.facts['privsep_helper'] = helper
    interpreter = script_interpreter(helper)
    if interpreter is None:
        found.notes.append('%s is not a Python script: its environment is '
                           'not checked.' % helper)
        return []
    found.facts['python'] = interpreter
    try:
        # In the environment sudo gives it (env_reset, root's HOME).
        out = process.execute(
            'env', '-i', 'PATH=' + privsep_helper.PATH,
            'HOME=' + pwd.getpwuid(0).pw_dir, *interpreter, '-c', PROBE,
            timeout=IMPORT_TIMEOUT)
    except exception.ProcessTimeout as exc:
        found.problem(
            Code.WARNING, 'Whether the Python of %s (%s) imports the plugin '
            'is not known: %s.' % (helper, ' '.join(interpreter), exc),
            'Run the check again when the host is less busy.')
        return []
    except exception.ProcessFailed as exc:
        found.problem(
            Code.FAILURE, 'The Python of %s (%s) cannot import the plugin: '
            '%s' % (helper, ' '.join(interpreter),
                    str(getattr(exc, 'stderr', '') or exc).strip()[-300:]),
            'Install prealloc_backend in the Python environment of %s (the '
            'one nova-compute runs in).' % helper)
        return []
    found.notes.append('The Python of %s (%s) imports the plugin.'
                       % (helper, ' '.join(interpreter)))
    executable, sys_path, *packages = json.loads(out.strip().splitlines()[-1])
    found.facts['helper_sys_path'] = sys_path
    paths = [helper, os.path.realpath(helper), os.path.dirname(helper)]
    first = interpreter[0]
    if os.path.basename(first) == 'env' and len(interpreter) > 1:
        paths.append(shutil.which(interpreter[1], path=privsep_helper.PATH)
                     or interpreter[1])
    paths += [first, executable, os.path.realpath(executable)]
    paths += [os.path.dirname(path) for path in packages]
    return [path for path in dict.fromkeys(paths + sys_path) if path]


def nova_user(host):
    """(uid, gids) of the nova user, from what that user cannot swap
    (checks/instances.py: --nova-user, the owner of the directory the
    daemon pins, nova's state_path); raises instances.NovaUserUnknown.
    """
    (uid, gid, _name), _source = instances.nova_user(host)
    return privsep_helper.user_ids(uid, gid)


def _user(ids):
    return privsep_helper.describe_user(ids[0])


def check_code_paths(paths, user, found):
    """Root runs the helper's code: none of it may be the nova user's."""
    for path in paths:
        why = privsep_helper.changeable_by(path, *user)
        if why:
            found.problem(
                Code.FAILURE, 'Root runs code from %s (the helper, its '
                'interpreter or sys.path), which %s can change: %s.'
                % (path, _user(user), why),
                'Install nova and the plugin where only root can write (a '
                'root-owned virtualenv or the system Python).',
                security=True)
            return
    seen = 0
    for top in paths:
        if not os.path.isdir(top) or os.path.islink(top):
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            for name in dirnames + filenames:
                seen += 1
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                why = privsep_helper.writable_by(path, st, *user)
                if why and not stat.S_ISLNK(st.st_mode):
                    found.problem(
                        Code.FAILURE, 'Root imports code from beneath %s, '
                        'and %s there is %s.' % (top, path, why),
                        'Make everything beneath %s root\'s and not '
                        'writable by %s (chown -R root:root; chmod -R '
                        'go-w).' % (top, _user(user)), security=True)
                    return
            if seen > WALK_LIMIT:
                found.notes.append('Stopped looking beneath sys.path '
                                   'after %d files.' % seen)
                return
    found.notes.append('%s can change none of the code root runs (%d '
                       'files).' % (_user(user), seen))


def check_config_paths(files, dirs, user, found):
    """The helper's configuration: only root may change it."""
    root_home = pwd.getpwuid(0).pw_dir
    # oslo.config's default files for project 'privsep' (HOME is root's).
    defaults = []
    for base in (os.path.join(root_home, '.privsep'), root_home,
                 '/etc/privsep', '/etc'):
        defaults += [os.path.join(base, 'privsep.conf'),
                     os.path.join(base, 'privsep.conf.d')]
    paths = list(files) + list(dirs)
    paths += [os.path.dirname(path) for path in files]
    reported = set()
    for path in dict.fromkeys(paths + defaults):
        why = privsep_helper.changeable_by(path, *user)
        if why and why not in reported:
            reported.add(why)
            found.problem(
                Code.FAILURE, 'The daemon reads its configuration from %s, '
                'which %s can change (%s): it would choose the daemon\'s '
                'instances_path, user and capabilities.'
                % (path, _user(user), why),
                'Make %s and every directory above it root\'s and not '
                'writable by %s (for example chown root:nova, chmod 0640 '
                'nova.conf; chown root:root, chmod 0755 /etc/nova).'
                % (path, _user(user)), security=True)


def _log_options(files, dirs):
    """oslo.log's options as the helper reads them from files/dirs."""
    scratch = cfg.ConfigOpts()
    logging.register_options(scratch)
    if not _read_as_helper(scratch, files, dirs, 'log options'):
        return None
    return scratch


def check_logging(files, dirs, program, user, found):
    """privsep-helper sets up logging as root before it connects: its
    log file must not be a name the nova user can replace.
    """
    conf = _log_options(files, dirs)
    if conf is None:
        return
    # oslo_log.log._get_log_file_path
    log_file, log_dir = conf.log_file, conf.log_dir
    path = (os.path.join(log_dir, log_file) if log_file and log_dir else
            log_file or (log_dir and os.path.join(
                log_dir, os.path.basename(program) + '.log')))
    found.facts['helper_log_file'] = path
    named = ', '.join('%s = %s' % pair for pair in (
        ('log_dir', log_dir), ('log_file', log_file)) if pair[1])
    for option, target in (('log_config_append = %s'
                            % conf.log_config_append,
                            conf.log_config_append), (named, path)):
        if not target:
            continue
        why = privsep_helper.changeable_by(target, *user)
        if why:
            found.problem(
                Code.FAILURE, '%s opens %s as root before it drops '
                'privileges ([DEFAULT] %s), and %s can change it: %s. A '
                'symlink there has root write to any file%s.'
                % (os.path.basename(program), target, option, _user(user),
                   why, ' (and run code: logging.fileConfig)'
                   if target == conf.log_config_append else ''),
                'Make %s root\'s and not writable by %s, or log with '
                'use_journal or use_syslog and no log_file or log_dir ('
                '%s ignores them).'
                % (os.path.dirname(target), _user(user), WRAPPER),
                security=True)


def _defaults_entries(text):
    """Split a sudo -l list of Defaults entries (quotes respected)."""
    entries, current, quoted = [], '', False
    for char in text:
        if char == '"':
            quoted = not quoted
        if char == ',' and not quoted:
            entries.append(current.strip())
            current = ''
        else:
            current += char
    entries.append(current.strip())
    return [entry for entry in entries if entry]


def parse_sudo_listing(listing, program):
    """sudo's environment for ``program`` from ``sudo -l -U user``:
    {'env_reset', 'always_set_home', 'setenv': bool, 'env_keep': set,
    'setenv_tag': bool}. Generic, user and runas Defaults first, then
    Defaults!<program> (the order sudo applies them in).
    """
    state = {'env_reset': True, 'always_set_home': False, 'setenv': False,
             'env_keep': set(), 'setenv_tag': False}
    generic, command = [], []
    section = None
    for line in listing.splitlines():
        if line.startswith('Matching Defaults entries'):
            section = generic
        elif line.startswith('Runas and Command-specific defaults'):
            section = command
        elif line.startswith('User ') and 'may run' in line:
            section = 'rules'
        elif section == 'rules':
            if program in line.split() and 'SETENV:' in line:
                state['setenv_tag'] = True
        elif section is generic and line.strip():
            generic.append(line.strip())
        elif section is command and line.strip():
            command.append(line.strip())
    entries = _defaults_entries(' '.join(generic))
    for line in command:
        if line.startswith('Defaults>'):
            # runas defaults: "Defaults>root entries"
            entries += _defaults_entries(line.split(None, 1)[1]
                                         if ' ' in line else '')
        elif line.startswith('Defaults!%s' % program) and (
                line[len('Defaults!%s' % program):][:1] in (' ', '')):
            # "Defaults!<program> <args> entry, entry": the first entry
            # is the last word before the first comma.
            parts = _defaults_entries(line)
            parts[0] = shlex.split(parts[0], posix=True)[-1]
            entries += parts
    for entry in entries:
        match = re.match(r'^(!*)(\w+)\s*(\+=|-=|=)?\s*(.*)$', entry)
        if not match:
            continue
        negated, name, operator, value = match.groups()
        values = set(value.strip('"').split())
        if name == 'env_keep':
            if negated:
                state['env_keep'] = set()
            elif operator == '=':
                state['env_keep'] = values
            elif operator == '+=':
                state['env_keep'] |= values
            elif operator == '-=':
                state['env_keep'] -= values
        elif name in ('env_reset', 'always_set_home', 'setenv'):
            state[name] = not negated
    return state


def _steering(pattern, prefixes=STEERING):
    """Whether an env_keep entry (a name, or a prefix ending in '*')
    keeps a variable that steers the helper.
    """
    if not pattern.endswith('*'):
        return any(pattern == p or p.endswith('_') and pattern.startswith(p)
                   or p == 'PYTHON' and pattern.startswith(p)
                   for p in prefixes)
    stem = pattern[:-1]
    return any(p.startswith(stem) or stem.startswith(p) for p in prefixes)


def check_sudo(argv, helper, user, found):
    """sudo lets the nova user run exactly the helper, with a clean
    environment and root's HOME.
    """
    try:
        name = pwd.getpwuid(user[0]).pw_name
    except KeyError:
        name = None
    if os.geteuid() != 0 or name is None:
        found.problem(
            Code.WARNING, "sudo's rule and environment for the nova user are "
            'not verified (%s).' % ('run the check as root'
                                    if name else 'no nova user account'),
            'Run prealloc-backend check as root.')
        return
    ctx = prealloc_backend.privsep.ctx
    rest = argv[1:]
    while rest and rest[0].startswith('-'):
        rest = rest[1:]
    command = rest + ['--privsep_context', ctx.pypath,
                      '--privsep_sock_path', SAMPLE_SOCKET]
    allowed = subprocess_ok(['sudo', '-n', '-l', '-U', name] + command)
    if not allowed:
        found.problem(
            Code.FAILURE, 'sudo does not let %s run "%s" (sudo -l -U %s).'
            % (name, shlex.join(command), name),
            'Install %s as /etc/sudoers.d/prealloc_backend (its paths '
            'adjusted) and check it with visudo -cf.' % SUDOERS_FILE)
    try:
        listing = process.execute('sudo', '-n', '-l', '-U', name,
                                  timeout=60)
    except (exception.ProcessFailed, exception.ProcessTimeout) as exc:
        found.problem(Code.WARNING, 'sudo -l -U %s failed: %s' % (name, exc),
                      'Check sudo.')
        return
    judge_sudo_environment(parse_sudo_listing(listing, helper), name,
                           helper, found)


def judge_sudo_environment(state, name, helper, found):
    """The environment sudo gives ``helper`` run by user ``name`` (a
    parse_sudo_listing() state) must not steer it.
    """
    found.facts['sudo_environment'] = dict(
        state, env_keep=sorted(state['env_keep']))
    fix = ('Give the command sudo Defaults of its own, as %s does: '
           'Defaults!<command> env_reset, always_set_home, !setenv, '
           '!env_keep.' % SUDOERS_FILE)
    before = len(found.problems)
    if not state['env_reset']:
        found.problem(
            Code.FAILURE, 'sudo does not reset the environment for %s '
            '(!env_reset): %s passes PYTHONPATH, OS_<GROUP>__<OPT> and HOME '
            'to root.' % (helper, name), fix, security=True)
    elif state['setenv'] or state['setenv_tag']:
        found.problem(
            Code.FAILURE, 'sudo lets %s set environment variables for %s '
            '(setenv or SETENV:): %s passes PYTHONPATH, OS_<GROUP>__<OPT> '
            'and HOME to root.' % (name, helper, name), fix, security=True)
    kept = sorted(p for p in state['env_keep'] if _steering(p))
    if state['always_set_home']:
        kept = [p for p in kept if p != 'HOME']
    home_kept = any(_steering(p, ('HOME',)) for p in kept)
    if kept and state['env_reset']:
        found.problem(
            Code.FAILURE, 'sudo keeps %s of %s for %s (env_keep): %s.'
            % (', '.join(kept), name, helper,
               'oslo.config reads ~/.privsep/privsep.conf.d/*.conf and '
               'Python ~/.local site-packages of that HOME as root'
               if home_kept else 'Python or oslo.config read it as '
               'root'), fix, security=True)
    if len(found.problems) == before:
        found.notes.append('sudo resets the environment and HOME for %s.'
                           % helper)


def subprocess_ok(cmd):
    try:
        process.execute(*cmd, timeout=60)
    except (exception.ProcessFailed, exception.ProcessTimeout):
        return False
    return True


def check_boundary(host, helper_command, helper, code_paths, found):
    """What the nova user could steer of what root runs."""
    try:
        user = nova_user(host)
    except instances.NovaUserUnknown as exc:
        found.problem(
            Code.FAILURE, 'The boundary against the nova user is not '
            'checked: %s.' % exc,
            'Pass --nova-user NAME (the user nova-compute runs as).',
            security=True)
        return
    found.facts['nova_uid'] = user[0]
    check_code_paths(code_paths, user, found)
    argv = shlex.split(helper_command) if helper_command else []
    files, dirs = config_args(argv)
    if not helper_command:
        files, dirs = config_args(found.facts.get('command', []))
        found.problem(
            Code.WARNING, "nova-rootwrap lets %s run privsep-helper as root "
            "with any arguments (oslo.rootwrap's built-in rule): its own "
            'log file, socket and configuration. Not a boundary against '
            'the nova user.' % _user(user),
            'Set helper_command = %s and install %s.'
            % (SAFE_COMMAND, SUDOERS_FILE))
        check_config_paths(files + [host.conf.rootwrap_config], dirs, user,
                           found)
        return
    check_config_paths(files, dirs, user, found)
    if os.path.basename(argv[0]) != 'sudo':
        found.notes.append('helper_command does not start with sudo: no '
                           'sudo rule to check.')
        return
    if helper and os.path.basename(helper) == WRAPPER:
        found.notes.append('%s logs to stderr only and connects only to a '
                           'socket the nova user bound in a fresh 0700 '
                           'directory of its own. This closes the '
                           "plugin's route only: where %s may also run "
                           "nova-rootwrap through sudo (nova's own rule, "
                           'which distribution packages ship), '
                           "oslo.rootwrap's built-in rule still lets it run "
                           'privsep-helper as root with any arguments.'
                           % (WRAPPER, _user(user)))
    else:
        found.problem(
            Code.FAILURE, '%s run as root connects to the '
            '--privsep_sock_path %s names (a symlink to any socket '
            'included).' % (os.path.basename(helper or argv[1]),
                            _user(user)),
            'Use %s: helper_command = %s, with %s.'
            % (WRAPPER, SAFE_COMMAND, SUDOERS_FILE), security=True)
        check_logging(files, dirs, helper or argv[1], user, found)
    if helper:
        check_sudo(argv, helper, user, found)


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
    code_paths = helper_imports(helper, found) if helper else []
    check_boundary(host, helper_command, helper, code_paths, found)
    details = ' '.join(found.notes + [p[1] for p in found.problems])
    if not found.problems:
        return result.success(details, **found.facts)
    fix = ' '.join(dict.fromkeys(p[2] for p in found.problems))
    if found.facts.get('method') == 'root_helper':
        fix += (' Or set [%s] helper_command instead (for example "sudo '
                'prealloc-privsep-helper --config-file /etc/nova/nova.conf",'
                ' with etc/prealloc_backend.sudoers).' % ctx.cfg_section)
    code = max(p[0] for p in found.problems)
    if found.security:
        return result.failure(
            details + ' The nova user can steer what root runs, whatever '
            'the mode: it can start the helper through sudo itself.',
            fix, **found.facts)
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
