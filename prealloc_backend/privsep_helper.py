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

"""prealloc-privsep-helper: start the plugin's privileged daemon as root from
a command line the nova user cannot steer.

Runs as root, started by sudo for the nova user (etc/prealloc_backend.sudoers
allows exactly the command line nova-compute builds from ``helper_command``
and makes sudo reset the environment and HOME). It distrusts everything the
calling user (sudo's ``SUDO_UID``) passes or prepared, then calls
oslo.privsep's ``helper_main``, which connects to nova-compute and drops to
the context's capabilities:

- Environment: emptied before oslo.config reads anything (HOME is root's,
  PATH fixed, the working directory ``/``): no ``~/.privsep/`` of the caller,
  no ``OS_<GROUP>__<OPT>`` variable. A ``PYTHON*`` variable, or a
  ``sys.path`` entry, interpreter or script the caller can change, means
  Python already ran the caller's code: it refuses to go on.
- Arguments: only ``--config-file``/``--config-dir`` (none of them, nor a
  directory above them, changeable by the caller), ``--privsep_context
  prealloc_backend.privsep.ctx`` and ``--privsep_sock_path DIR/privsep.sock``.
- Logging: ``log_config_append``, ``log_file`` and ``log_dir`` of root's
  configuration are overridden; helper_main logs to stderr, which
  oslo.privsep's client copies into nova-compute's log, until the daemon
  moves to logging over its channel. (oslo.privsep's ``helper_main`` sets up
  logging as full root before it connects: a log file in a directory the
  nova user can write is a symlink away from any file.)
- Socket: DIR must be a directory of the caller, mode 0700, not a symlink,
  holding only ``privsep.sock``, a socket the caller bound. Both are opened
  without following symlinks and the daemon connects through
  ``/proc/self/fd/N``: no name is resolved again after the checks.

A refusal prints one line to stderr and exits with status 2. This module
imports only the standard library until the environment is clean: it lives
outside the ``prealloc_backend.privsep`` package (whose ``__init__`` imports
oslo.privsep, oslo.log and nova's configuration), and ``prealloc_backend``'s
own ``__init__`` is empty (tests/unit/test_privsep_helper.py checks both in a
fresh interpreter).
"""

import errno
import grp
import os
import pwd
import stat
import struct
import sys

CONTEXT = 'prealloc_backend.privsep.ctx'
SOCKET_NAME = 'privsep.sock'
PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
# Options of root's configuration overridden before helper_main reads it.
LOG_OVERRIDES = {'log_config_append': None, 'log_file': None,
                 'log_dir': None, 'use_stderr': True}
EXIT_REFUSED = 2

# POSIX ACL xattr (linux/posix_acl_xattr.h)
_ACL_USER, _ACL_GROUP_OBJ, _ACL_GROUP, _ACL_MASK = 0x02, 0x04, 0x08, 0x10
_ACL_WRITE = 0x02


class Refused(Exception):
    """The helper will not start the daemon: the message says why."""


def user_ids(uid, gid=None):
    """(uid, frozenset of gids) of a user, from the password database
    (gid: the primary group when the user has no entry).
    """
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return uid, frozenset(() if gid is None else (gid,))
    return uid, frozenset(os.getgrouplist(entry.pw_name, entry.pw_gid))


def describe_user(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return 'uid %d' % uid


def _describe_group(gid):
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return 'gid %d' % gid


def _acl_writers(path, st, uid, gids):
    """Why the POSIX access ACL of ``path`` lets uid/gids write, or None."""
    try:
        acl = os.getxattr(path, 'system.posix_acl_access',
                          follow_symlinks=False)
    except OSError:
        return None
    entries = [struct.unpack_from('<HHI', acl, offset)
               for offset in range(4, len(acl) - 7, 8)]
    mask = next((perm for tag, perm, _id in entries if tag == _ACL_MASK),
                _ACL_WRITE)
    for tag, perm, ident in entries:
        if not perm & mask & _ACL_WRITE:
            continue
        if tag == _ACL_USER and ident == uid:
            return 'an ACL lets %s write it' % describe_user(uid)
        if (tag == _ACL_GROUP and ident in gids or
                tag == _ACL_GROUP_OBJ and st.st_gid in gids):
            return ('an ACL lets group %s write it'
                    % _describe_group(ident if tag == _ACL_GROUP
                                      else st.st_gid))
    return None


def writable_by(path, st, uid, gids):
    """Why uid/gids may change the inode ``path`` (lstat ``st``), or None."""
    if st.st_uid == uid:
        return 'owned by %s' % describe_user(uid)
    if stat.S_ISLNK(st.st_mode):
        return None
    if st.st_mode & stat.S_IWOTH:
        return 'writable by everyone'
    acl = _acl_writers(path, st, uid, gids)
    if acl:
        return acl
    if st.st_mode & stat.S_IWGRP and st.st_gid in gids:
        return 'writable by group %s' % _describe_group(st.st_gid)
    return None


def _chain(path):
    """``path`` and each directory above it, top first."""
    path = os.path.normpath(os.path.abspath(path))
    parts = []
    while True:
        parts.append(path)
        if path == '/':
            return parts[::-1]
        path = os.path.dirname(path)


def changeable_by(path, uid, gids):
    """The first way a user may change what ``path`` names, or None.

    A user changes what a path names if it owns or may write the file or
    directory itself, or may rename or create entries in a directory on the
    way to it (a sticky directory only for entries it owns). Symlinks are
    followed: the directories holding each link and those of its target
    count too. A missing path counts its nearest existing directory. POSIX
    access ACLs are read. Returns "<path> is <why>"; root (uid 0) is never
    reported.
    """
    if uid == 0:
        return None
    seen = set()
    for candidate in (path, os.path.realpath(path)):
        chain = _chain(candidate)
        for index, component in enumerate(chain):
            if component in seen:
                continue
            seen.add(component)
            try:
                st = os.lstat(component)
            except FileNotFoundError:
                break
            except OSError as exc:
                return '%s cannot be examined (%s)' % (component, exc)
            why = writable_by(component, st, uid, gids)
            if why and (index == len(chain) - 1 or
                        not stat.S_ISDIR(st.st_mode)):
                return '%s is %s' % (component, why)
            if why and stat.S_ISDIR(st.st_mode):
                # A writable directory: the user may rename or create
                # the next entry (in a sticky one only if it owns it).
                if not st.st_mode & stat.S_ISVTX or st.st_uid == uid:
                    return '%s is %s' % (component, why)
                try:
                    child = os.lstat(chain[index + 1])
                except FileNotFoundError:
                    return '%s is %s: %s may be created there' % (
                        component, why, chain[index + 1])
                except OSError as exc:
                    return '%s cannot be examined (%s)' % (
                        chain[index + 1], exc)
                if child.st_uid == uid:
                    return '%s is owned by %s' % (chain[index + 1],
                                                  describe_user(uid))
            if stat.S_ISLNK(st.st_mode):
                # the rest of the path is checked through realpath()
                break
    return None


def parse_args(argv):
    """(config files, config dirs, socket path) of the helper's argv."""
    files, dirs, context, sock = [], [], [], []
    flags = {'--config-file': files, '--config-dir': dirs,
             '--privsep_context': context, '--privsep_sock_path': sock}
    args = list(argv)
    while args:
        arg = args.pop(0)
        flag, sep, value = arg.partition('=')
        if flag not in flags:
            raise Refused('argument %r is not allowed (only %s)'
                          % (arg, ', '.join(flags)))
        if not sep:
            if not args:
                raise Refused('%s needs a value' % flag)
            value = args.pop(0)
        flags[flag].append(value)
    if context != [CONTEXT]:
        raise Refused('--privsep_context must be given once, as %s (got %s)'
                      % (CONTEXT, context or 'none'))
    if len(sock) != 1:
        raise Refused('--privsep_sock_path must be given once (got %s)'
                      % (sock or 'none'))
    if not files:
        raise Refused('at least one --config-file is needed (root\'s '
                      'nova.conf: the daemon reads instances_path there)')
    for path in files + dirs + sock:
        if not os.path.isabs(path):
            raise Refused('%r is not an absolute path' % path)
    return files, dirs, sock[0]


def check_config(files, dirs, uid, gids):
    """Refuse configuration the caller can change (it would choose the
    daemon's instances_path, capabilities or user).
    """
    paths = list(files)
    for directory in dirs:
        paths.append(directory)
        try:
            names = sorted(os.listdir(directory))
        except OSError as exc:
            raise Refused('--config-dir %s: %s' % (directory, exc))
        paths += [os.path.join(directory, name) for name in names
                  if name.endswith('.conf')]
    for path in paths:
        if not os.path.exists(path):
            raise Refused('configuration %s does not exist' % path)
        why = changeable_by(path, uid, gids)
        if why:
            raise Refused('configuration %s can be changed by the caller: '
                          '%s' % (path, why))


def _is_link(path):
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def pin_socket(sock_path, uid):
    """Check the socket nova-compute listens on; return a path naming it
    that no one can redirect (/proc/self/fd/N of an O_PATH descriptor).
    """
    directory, name = os.path.split(sock_path)
    if name != SOCKET_NAME:
        raise Refused('--privsep_sock_path %s: the socket must be named %s'
                      % (sock_path, SOCKET_NAME))
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY |
                         os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        why = {errno.ENOTDIR: 'is not a directory',
               errno.ENOENT: 'does not exist'}.get(exc.errno,
                                                  'cannot be opened')
        # O_NOFOLLOW | O_DIRECTORY answers ENOTDIR for a symlink: lstat
        # only to name it (the open above already refused it).
        if exc.errno in (errno.ENOTDIR, errno.ELOOP) and _is_link(directory):
            why = 'is a symlink'
        raise Refused('--privsep_sock_path %s: its directory %s: %s'
                      % (sock_path, why, exc))
    try:
        st = os.fstat(dir_fd)
        if st.st_uid != uid or stat.S_IMODE(st.st_mode) != 0o700:
            raise Refused(
                '--privsep_sock_path %s: its directory must be owned by '
                'the caller (%s) with mode 0700, not by %s with mode %04o'
                % (sock_path, describe_user(uid), describe_user(st.st_uid),
                   stat.S_IMODE(st.st_mode)))
        entries = os.listdir(dir_fd)
        if entries != [SOCKET_NAME]:
            raise Refused('--privsep_sock_path %s: its directory must hold '
                          'only %s (a fresh one from mkdtemp), not %s'
                          % (sock_path, SOCKET_NAME, sorted(entries)))
        sock_fd = os.open(SOCKET_NAME, os.O_PATH | os.O_NOFOLLOW |
                          os.O_CLOEXEC, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    st = os.fstat(sock_fd)
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != uid:
        os.close(sock_fd)
        raise Refused('--privsep_sock_path %s must be a socket bound by the '
                      'caller (%s), not a %s of %s'
                      % (sock_path, describe_user(uid),
                         'symlink' if stat.S_ISLNK(st.st_mode) else
                         'socket' if stat.S_ISSOCK(st.st_mode) else
                         'file', describe_user(st.st_uid)))
    return '/proc/self/fd/%d' % sock_fd


def check_interpreter(environ, uid, gids):
    """Refuse to go on where the caller already steered this Python
    (root, started without sudo, is trusted with its own environment).
    """
    if uid == 0:
        return
    tainted = sorted(k for k in environ if k.startswith('PYTHON'))
    if tainted:
        raise Refused('sudo passed %s: Python honoured it before this '
                      'helper ran; make sudo reset the environment '
                      '(env_reset, no env_keep of it)' % ', '.join(tainted))
    paths = [sys.executable, os.path.abspath(sys.argv[0])]
    paths += [entry for entry in sys.path if entry]
    for path in paths:
        why = changeable_by(path, uid, gids)
        if why:
            raise Refused('%s (interpreter, script or sys.path) can be '
                          'changed by the caller: %s' % (path, why))


def prepare(argv, environ):
    """Validate and clean up; return helper_main's argv. Empties
    ``environ`` (the process's os.environ) and sets root's own.
    """
    caller = int(environ.get('SUDO_UID', os.getuid()))
    caller_gid = environ.get('SUDO_GID')
    original = dict(environ)
    environ.clear()
    root = pwd.getpwuid(os.geteuid())
    environ.update(PATH=PATH, HOME=root.pw_dir, LC_ALL='C.UTF-8',
                   USER=root.pw_name, LOGNAME=root.pw_name)
    uid, gids = user_ids(caller, None if caller_gid is None
                         else int(caller_gid))
    check_interpreter(original, uid, gids)
    os.chdir('/')
    files, dirs, sock_path = parse_args(argv)
    check_config(files, dirs, uid, gids)
    pinned = pin_socket(sock_path, caller)
    args = []
    for path in files:
        args += ['--config-file', path]
    for path in dirs:
        args += ['--config-dir', path]
    return args + ['--privsep_context', CONTEXT,
                   '--privsep_sock_path', pinned]


def log_overrides(conf):
    """Make oslo.log ignore root's log_config_append, log_file and
    log_dir (overrides survive helper_main's parsing of its arguments and
    configuration files).
    """
    from oslo_log import log as logging

    logging.register_options(conf)
    for name, value in LOG_OVERRIDES.items():
        conf.set_override(name, value)


def main():
    try:
        args = prepare(sys.argv[1:], os.environ)
    except Refused as exc:
        sys.stderr.write('prealloc-privsep-helper: refused: %s\n' % exc)
        sys.exit(EXIT_REFUSED)
    # Only now: oslo.config, oslo.log and oslo.privsep, in a clean
    # environment.
    from oslo_config import cfg
    from oslo_privsep import daemon

    log_overrides(cfg.CONF)
    sys.argv[1:] = args
    daemon.helper_main()
