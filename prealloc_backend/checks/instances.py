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

"""Check instances_path as the privileged daemon pins it; find the nova user.

The daemon refuses every call when it cannot pin ``[DEFAULT]
instances_path``. The check applies the daemon's own rules, by calling the
function the daemon calls (``prealloc_backend.privsep.fs.pin``, with root
never allowed to own it, as in the daemon): a relative path, '/', a symlink
in any component (the last included), something that is not a directory,
and a root-owned directory are each a Failure naming the path and the rule.
Nothing is followed: the directory is opened from '/' with no symlink
allowed anywhere, and its owner is read from that descriptor.

The check runs first among those that look at instances_path, and again
after every other check (``check_pin_again``): a nova user who swaps
instances_path for a symlink, a file or a root-owned directory while the
check runs turns the second one into a Failure, and the verdict is the one
the daemon reaches next with the same configuration.

The nova user, against whom the privsep check judges the boundary, is taken
from what that user cannot swap: ``--nova-user`` when given; else the owner
of the directory the daemon would pin (opened as above, so a symlink cannot
lend it another owner); else the owner of nova's ``state_path`` when it is
a real directory whose parents only root controls. When none says, the
check fails rather than skip the boundary.

Runs as root and only reads (O_PATH opens and fstat).
"""

import os
import pwd

from prealloc_backend.checks import owner
from prealloc_backend.checks import result
from prealloc_backend import exception
from prealloc_backend.privsep import beneath
import prealloc_backend.privsep.fs

# What to do about each refusal of the pin rules (fs.pin's reasons).
_FIXES = (
    ('absolute', 'Set [DEFAULT] instances_path to an absolute path.'),
    ('symlink', 'Set [DEFAULT] instances_path to the real directory (no '
                'symlink in any component: the daemon opens it without '
                'following one).'),
    ('root directory', 'Give nova a directory of its own.'),
    ('not a directory', 'Make instances_path a directory of the nova user '
                        '(install -d -o nova -g nova -m 0755 PATH).'),
    ('owned by root', 'Give the directory to the nova user (chown nova: '
                      'PATH), as nova-compute makes it; the daemon never '
                      'works on root\'s files.'),
    ('does not exist', 'Create it as the nova user (install -d -o nova -g '
                       'nova -m 0755 PATH); nova-compute makes it at the '
                       'first spawn otherwise.'),
)


class NovaUserUnknown(Exception):
    """Nothing the nova user cannot swap says who it is."""


def pin_state(configured):
    """What the daemon would make of ``configured`` now: ``(facts,
    None)`` when it pins it (facts: path, dev, ino, uid), ``(None,
    reason)`` when it refuses every call.
    """
    try:
        root = prealloc_backend.privsep.fs.pin(configured, root_may_own=False)
    except exception.InstancesPathUnusable as exc:
        return None, exc.kwargs['reason']
    try:
        return {'path': root.path, 'dev': root.dev, 'ino': root.ino,
                'uid': root.uid}, None
    finally:
        root.close()


def _fix(reason, path):
    for key, fix in _FIXES:
        if key in reason:
            return fix.replace('PATH', str(path))
    return 'Make [DEFAULT] instances_path a directory of the nova user.'


def _user_of(uid, gid):
    return uid, gid, owner.user_name(uid)


def _state_path_owner(state_path):
    """(uid, gid) of nova's state_path when it is a real directory whose
    parents only root controls, else None.
    """
    if not state_path or not os.path.isabs(state_path):
        return None
    try:
        fd = beneath.open_absolute_dir(os.path.normpath(state_path))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    try:
        above = owner.control(os.path.dirname(os.path.normpath(state_path)))
    except OSError:
        return None
    if st.st_uid == 0 or not above.root_only:
        return None
    return st.st_uid, st.st_gid


def nova_user(host, pinned=None, refusal=None):
    """(uid, gid, name) of the nova user and where it came from, or
    NovaUserUnknown. ``pinned``/``refusal``: pin_state of instances_path
    (computed when not given).
    """
    name = host.nova_user
    if name:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise NovaUserUnknown('--nova-user %s: no such user' % name)
        if entry.pw_uid == 0:
            raise NovaUserUnknown('--nova-user %s is root: nova-compute '
                                  'must not run as root' % name)
        return (entry.pw_uid, entry.pw_gid, entry.pw_name), '--nova-user'
    if pinned is None and refusal is None:
        pinned, refusal = pin_state(host.conf.instances_path)
    if pinned is not None and pinned['uid'] != 0:
        uid = pinned['uid']
        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            gid = uid
        return _user_of(uid, gid), ('the owner of instances_path %s (no '
                                    'symlink followed)' % pinned['path'])
    state_path = getattr(host.conf, 'state_path', None)
    found = _state_path_owner(state_path)
    if found is not None:
        return _user_of(*found), ('the owner of state_path %s (no symlink '
                                  'followed)' % state_path)
    raise NovaUserUnknown(
        'cannot tell who the nova user is: instances_path %r %s, and '
        'state_path %r is not a directory of a user other than root '
        'beneath directories only root controls'
        % (host.conf.instances_path,
           'is refused (%s)' % refusal if refusal else 'is root\'s',
           state_path))


def _refused(configured, reason, changed=''):
    path = configured if configured else '(unset)'
    details = ('The privileged daemon refuses [DEFAULT] instances_path %r: '
               '%s. It refuses every call while it is so: raw disks are not '
               'allocated (modes space and full, a config drive included).'
               % (path, reason))
    facts = {'instances_path': configured, 'pinned': False,
             'refusal': reason}
    fix = _fix(reason, path)
    if 'does not exist' in reason:
        # nova-compute creates it (as the nova user) before its first
        # call to the daemon, which pins it then.
        return result.warning(details + changed + ' nova-compute creates '
                              'it at the first spawn.', fix, **facts)
    return result.failure(details + changed, fix, **facts)


def check_pin(host):
    """instances_path passes the daemon's pin rules; who the nova user
    is.
    """
    configured = host.conf.instances_path
    pinned, refusal = pin_state(configured)
    host.pin_seen = (pinned, refusal)
    try:
        (uid, _gid, name), source = nova_user(host, pinned, refusal)
    except NovaUserUnknown as exc:
        host.nova_user_problem = str(exc)
        user_text = None
    else:
        host.nova_user_problem = None
        user_text = 'The nova user is %s, from %s.' % (
            name if name.startswith('uid ') else '%s (uid %d)' % (name, uid),
            source)
    if refusal is not None:
        res = _refused(configured, refusal)
        res.details += ' ' + (
            user_text or 'Nor does state_path %r tell who the nova user is '
                         '(not a directory of a user other than root beneath '
                         'directories only root controls).'
            % getattr(host.conf, 'state_path', None))
        return res
    facts = {'instances_path': configured, 'pinned': True,
             'owner_uid': pinned['uid']}
    if user_text is None:
        return result.failure(
            'instances_path %s passes the daemon\'s pin rules, but %s.'
            % (pinned['path'], host.nova_user_problem),
            'Pass --nova-user NAME (the user nova-compute runs as).',
            **facts)
    facts['nova_uid'] = uid
    if pinned['uid'] != uid:
        return result.failure(
            'instances_path %s is owned by %s, not by the nova user %s: '
            'the daemon accepts the disks of the owner of instances_path, '
            'and nova cannot create its instances there.'
            % (pinned['path'], owner.user_name(pinned['uid']), name),
            'chown %s: %s (or pass the right --nova-user).'
            % (name, pinned['path']), **facts)
    return result.success(
        'The privileged daemon pins instances_path %s (a directory of %s, no '
        'symlink in any component). %s' % (pinned['path'], name, user_text),
        **facts)


def _same(first, now):
    return (first is not None and now is not None and
            all(first[k] == now[k] for k in ('dev', 'ino', 'uid')))


def check_pin_again(host):
    """instances_path still passes the pin rules after the other checks,
    and names the same directory.
    """
    configured = host.conf.instances_path
    pinned, refusal = pin_state(configured)
    first_pinned, first_refusal = getattr(host, 'pin_seen', (None, None))
    changed = ''
    if (pinned, refusal) != (first_pinned, first_refusal) and not _same(
            first_pinned, pinned):
        changed = (' It changed while the check ran (at the start: %s): '
                   'someone is moving it.'
                   % ('refused, %s' % first_refusal if first_refusal else
                      'a directory of uid %d' % first_pinned['uid']
                      if first_pinned else 'not looked at'))
    if refusal is not None:
        return _refused(configured, refusal, changed)
    facts = {'instances_path': configured, 'pinned': True,
             'owner_uid': pinned['uid'], 'changed': bool(changed)}
    if changed:
        return result.warning(
            'The privileged daemon pins instances_path %s now.%s The checks '
            'in between may have measured another directory.'
            % (pinned['path'], changed),
            'Find who moves instances_path, then run the check again.',
            **facts)
    return result.success(
        'instances_path %s is the directory the first check pinned '
        '(device %d, inode %d, uid %d).'
        % (pinned['path'], pinned['dev'], pinned['ino'], pinned['uid']),
        **facts)
