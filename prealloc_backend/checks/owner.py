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

"""Work in a directory another user controls, without lending it root.

``prealloc-backend check`` and ``bench`` run as root, and measure the
filesystem of a directory the nova user owns (instances_path): a name in it
can be swapped for a symlink or for another directory at any moment. The
rules here keep root's writes away from whatever the owner points them at:

- ``run_in(fd, step)`` runs ``step(fd, *args)`` in a forked child whose
  working directory is the directory held open as ``fd`` (opened once, never
  looked up by name again), as the credentials ``credentials_for`` chose:
  when the caller is root and another user controls the directory (the
  nova user), the child first drops to that user (uid, primary group and
  supplementary groups from the user database): whatever that user did or
  does to the directory, the step can only touch what the user could touch
  anyway. The step's return value (JSON) or error comes back through a
  pipe. Every step has a deadline (the user it runs as can stop it with
  SIGSTOP): past it, the child is killed by its PID and reaped, and
  StepTimedOut names the step.
- ``control(path)``: who besides root can change what a path names (the
  owners of every directory and symlink met while resolving it, and the
  directories a group or everyone may write to). The step's user is chosen
  from it: root only where nobody else can; the one other user who can
  (the nova user) otherwise; several users or a shared directory refuse.
- ``refusal_as_root(path, command)``: for code that works by path (the
  benchmark, which hands paths to nova's image backend): as root, only a
  path nobody else controls.

A step makes its files with ``O_CREAT | O_EXCL | O_NOFOLLOW`` relative to
the directory's descriptor, and the tools it runs (qemu-img) get names
relative to its working directory, which is that same directory.
"""

import errno
import os
import pwd
import stat

from prealloc_backend import exception
from prealloc_backend.system import process

# Most bytes a step's answer may take (a few facts, or an error message).
MAX_ANSWER = 1 << 20


class UnsafeDirectory(Exception):
    """A directory root must not write in, and cannot drop to its owner."""


class StepFailed(Exception):
    """The step raised in the child: ``kind`` (its class name), message,
    and ``user``: the name of the user the step ran as.
    """

    def __init__(self, kind, message, user):
        self.kind = kind
        self.message = message
        self.user = user
        super().__init__('%s: %s' % (kind, message))


def user_name(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return 'uid %d' % uid


def describe_owner(st):
    """'nova (uid 64060)'."""
    name = user_name(st.st_uid)
    if name.startswith('uid '):
        return name
    return '%s (uid %d)' % (name, st.st_uid)


def writable_by_others(st):
    """True when a user other than the owner may add, remove or rename
    entries of the directory of stat result ``st`` (group or other write
    permission without the sticky bit).
    """
    return bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and
                not st.st_mode & stat.S_ISVTX)


class Credentials:
    """uid, gid and supplementary groups of the user a step runs as."""

    def __init__(self, uid, gid, groups, name):
        self.uid = uid
        self.gid = gid
        self.groups = list(groups)
        self.name = name

    @classmethod
    def of_uid(cls, uid, fallback_gid):
        """The user ``uid`` as the user database describes it (a uid it
        does not know gets ``fallback_gid`` and no other group).
        """
        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            return cls(uid, fallback_gid, [fallback_gid], 'uid %d' % uid)
        return cls(uid, entry.pw_gid,
                   os.getgrouplist(entry.pw_name, entry.pw_gid),
                   entry.pw_name)

    def __repr__(self):
        return '%s (uid %d, gid %d, groups %s)' % (
            self.name, self.uid, self.gid, self.groups)


def open_directory(path):
    """A descriptor of the directory ``path`` (O_DIRECTORY, close-on-exec):
    the one name lookup; everything after goes through the descriptor.
    """
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _control_or_refuse(path):
    try:
        return control(path)
    except OSError as exc:
        # A name on the way vanished or changed while it was looked at:
        # someone is moving it.
        raise UnsafeDirectory('cannot tell who controls %s: %s'
                              % (path, exc))


def credentials_for(fd, path, euid=None):
    """Who a step in the directory ``fd`` (opened from ``path``) runs as:
    None to keep the caller's credentials, else a Credentials.

    An unprivileged caller keeps its own. Root keeps root only where no
    other user can change what ``path`` names or what is in it (its
    Control is root_only and the directory is root's, writable by nobody
    else). Where one user can (the nova user, who owns instances_path or a
    directory above it), the step runs as that user. Where several users
    or a group can, UnsafeDirectory is raised.
    """
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        return None
    st = os.fstat(fd)
    found = _control_or_refuse(path)
    found.add(path, st)
    if len(found.users) == 1:
        (uid, _where), = found.users.items()
        return Credentials.of_uid(uid, st.st_gid)
    if found.users:
        raise UnsafeDirectory(
            'several users can change what %s names or holds (%s): root '
            'will not write there, and cannot write as one of them alone. '
            'Make the path root\'s up to a directory of the nova user.'
            % (path, found.describe()))
    if found.shared:
        raise UnsafeDirectory(
            '%s: %s, who could swap what root writes there. Remove that '
            'write permission (chmod go-w) or give the directory to the '
            'nova user.' % (path, found.describe()))
    return None


def drop_to(creds):
    """Become ``creds`` for good (in a child): groups, gid, then uid."""
    os.setgroups(creds.groups)
    os.setgid(creds.gid)
    os.setuid(creds.uid)
    if os.getuid() != creds.uid or os.geteuid() != creds.uid:
        raise OSError(errno.EPERM, 'could not drop to %r' % creds)
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise OSError(errno.EPERM, 'root could be regained after dropping '
                               'to %r' % creds)


def _step_in_child(fd, creds, step, args):
    if creds is not None:
        drop_to(creds)
    os.fchdir(fd)
    return step(fd, *args)


class StepTimedOut(StepFailed):
    """The step did not end within its deadline; its child was killed."""


def run_in(fd, path, step, *args, creds=None, deadline, what,
           max_answer=MAX_ANSWER):
    """Run ``step(fd, *args)`` in a forked child (process.call_in_child)
    working in the directory ``fd`` (``path``: its name, for messages only)
    as ``creds`` (see credentials_for; None: as the caller). Returns what
    the step returned (anything JSON can carry); raises StepFailed when the
    step raised, StepTimedOut when it did not end within ``deadline``
    seconds (the user it runs as can stop it: it is then killed and
    reaped). ``what``: the step in words, for messages ('the fallocate(2)
    probe'). ``max_answer``: the most bytes its answer may take.
    """
    user = creds.name if creds is not None else user_name(os.geteuid())
    try:
        reply, status = process.call_in_child(
            _step_in_child, fd, creds, step, args, deadline=deadline,
            what=what, max_answer=max_answer)
    except exception.ProcessTimeout:
        raise StepTimedOut(
            'Timeout', '%s in %s, run as %s, did not end within its '
            'deadline of %s s: it was killed. A stopped (SIGSTOP) or hung '
            'step: %s can stop the processes that run as it'
            % (what, path, user, deadline, user), user)
    if reply is None:
        raise StepFailed('NoAnswer', '%s in %s ended (wait status %d) '
                                     'without an answer of at most %d bytes'
                         % (what, path, status, max_answer), user)
    if 'error' in reply:
        raise StepFailed(str(reply['error']), str(reply.get('message')),
                         user)
    return reply.get('result')


class Control:
    """Who, besides root, can change what a path names: ``users`` maps
    each such uid to the first directory or symlink of the path that uid
    owns; ``shared`` lists (path, why) of directories a group or everyone
    may write to (without the sticky bit).
    """

    def __init__(self):
        self.users = {}
        self.shared = []

    def add(self, path, st):
        if st.st_uid != 0:
            self.users.setdefault(st.st_uid, path)
        if stat.S_ISDIR(st.st_mode) and writable_by_others(st):
            self.shared.append((path, 'mode %04o' % stat.S_IMODE(st.st_mode)))

    @property
    def root_only(self):
        return not self.users and not self.shared

    def describe(self):
        """'/var/lib/nova is owned by nova (uid 64060)' and the like."""
        parts = ['%s is owned by %s' % (path, describe_owner(
            os.stat_result((0, 0, 0, 0, uid, 0, 0, 0, 0, 0))))
            for uid, path in sorted(self.users.items())]
        parts += ['%s may be written by its group or by others (%s)'
                  % item for item in self.shared]
        return '; '.join(parts)


# Most symlinks followed while resolving one path (the kernel's limit).
MAX_SYMLINKS = 40


def control(path):
    """The Control of ``path``: the owner of every directory and symlink
    looked up while resolving it (symlinks followed as the kernel follows
    them), and the directories others may write to. A path whose Control
    is ``root_only`` names the same object whatever other users do.
    """
    found = Control()
    pending = [p for p in os.path.abspath(path).split('/') if p]
    current = '/'
    found.add('/', os.lstat('/'))
    links = 0
    while pending:
        part = pending.pop(0)
        if part == '.':
            continue
        if part == '..':
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        st = os.lstat(candidate)
        found.add(candidate, st)
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_SYMLINKS:
                raise OSError(errno.ELOOP, 'too many symlinks', path)
            target = os.readlink(candidate)
            if target.startswith('/'):
                current = '/'
            pending[:0] = [p for p in target.split('/') if p]
            continue
        current = candidate
    return found


def refusal_as_root(directory, command):
    """None when the caller may work by path in ``directory`` (or create
    it), else why not and what to do. Only root is refused, where another
    user can change what the directory (its nearest existing parent when it
    does not exist yet) names or holds (``control``).
    ``command``: the command line to suggest, e.g. 'prealloc-bench'.
    """
    if os.geteuid() != 0:
        return None
    existing = os.path.abspath(directory)
    while not os.path.isdir(existing):
        existing = os.path.dirname(existing)
    try:
        found = _control_or_refuse(existing)
    except UnsafeDirectory as exc:
        return 'refusing to run as root in %s: %s' % (existing, exc)
    if found.root_only:
        return None
    st = os.stat(existing)
    if len(found.users) == 1:
        (uid, _where), = found.users.items()
        run_as = ('run it as that user (sudo -u %s %s --dir %s ...)'
                  % (user_name(uid), command, existing))
    else:
        run_as = 'run it as the user who owns that directory'
    return ('refusing to run as root in %s (owned by %s): %s, who could '
            'redirect what root writes there. Either %s, or give --dir a '
            'directory on the same filesystem that root owns, as it owns '
            'every directory above it, none writable by another user'
            % (existing, describe_owner(st), found.describe(), run_as))
