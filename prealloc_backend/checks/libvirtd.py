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

"""Checks of libvirt on this host: disk ownership, and the metadata cache.

Ownership. libvirt (``dynamic_ownership = 1``, its default) hands a disk to
the QEMU user while a guest runs, and gives it back when the guest stops: to
the owner it remembered (``remember_owner = 1``, the default since libvirt
5.6), or, with ``remember_owner = 0``, to root:root. The plugin's privileged
daemon allocates only disks owned by the nova user or the QEMU user, so
with ``remember_owner = 0`` every disk of a stopped guest is refused. The
check reads libvirt's qemu.conf (``--qemu-conf``, /etc/libvirt/qemu.conf by
default) with the syntax libvirt's own parser (virconf.c) accepts, and
reports ``dynamic_ownership``, ``remember_owner`` and the QEMU ``user``.

Metadata cache. With ``[prealloc_backend] qcow2_l2_cache = full-coverage``
the guest XML of a qcow2 disk carries ``<metadata_cache>``, which libvirt
7.0 and later turn into the qcow2 node's cache-size (older ones ignore the
element: the disk then gets QEMU's default cache). The check runs the
daemon's ``--version`` (virtqemud, else libvirtd) and reports the cache the
plan (``diskplan.make_plan``) gives a disk of ``--disk-size``.

Both run as the command's user (root) and write nothing: they read
qemu.conf and run the daemon's ``--version`` from the system's sbin
directories.
"""

import pwd
import re
import shutil

from prealloc_backend.checks import result
from prealloc_backend import exception
from prealloc_backend.planner import diskplan
from prealloc_backend.planner import modes
from prealloc_backend.planner import qcow2_layout
from prealloc_backend import sizes
from prealloc_backend.system import process

# libvirt's defaults when qemu.conf does not set them.
DEFAULTS = {'dynamic_ownership': 1, 'remember_owner': 1}
# The QEMU user of distribution builds of libvirt, when user is not set.
BUILD_DEFAULT_USERS = ('libvirt-qemu', 'qemu')
# <metadata_cache> in the domain XML is honoured from libvirt 7.0.
METADATA_CACHE_LIBVIRT = (7, 0, 0)
# The daemons that run the QEMU driver: modular, then monolithic.
DAEMONS = ('virtqemud', 'libvirtd')
SBIN = '/usr/sbin:/usr/local/sbin:/sbin'
# Seconds ``<daemon> --version`` may take.
TIMEOUT = 30

_TOKEN = re.compile(r'''
    (?P<space>[ \t\r\n]+) | (?P<comment>\#[^\n]*)
  | """(?P<triple>.*?)""" | "(?P<dquote>[^"\n]*)" | '(?P<squote>[^'\n]*)'
  | (?P<int>[+-]?[0-9]+) | (?P<name>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<punct>[=\[\],;])
''', re.VERBOSE | re.DOTALL)


class ConfSyntaxError(ValueError):
    """A libvirt configuration file libvirt itself would refuse."""


def _tokens(text):
    """(kind, value, line) of each token of a libvirt configuration file."""
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        line = text.count('\n', 0, pos) + 1
        if not match:
            raise ConfSyntaxError('line %d: unexpected %r'
                                  % (line, text[pos:pos + 20]))
        pos = match.end()
        kind = match.lastgroup
        if kind in ('space', 'comment'):
            continue
        value = match.group(kind)
        if kind in ('triple', 'dquote', 'squote'):
            kind = 'str'
        elif kind == 'int':
            value = int(value)
        yield kind, value, line


def parse_conf(text):
    """{name: int, str or list} of a libvirt configuration file (qemu.conf,
    libvirtd.conf); ConfSyntaxError naming the line when libvirt would
    refuse the file. A later setting of a name wins, as in libvirt.
    """
    tokens = list(_tokens(text))
    values = {}
    index = 0

    def take(line):
        nonlocal index
        if index >= len(tokens):
            raise ConfSyntaxError('line %d: a value is missing' % line)
        token = tokens[index]
        index += 1
        return token

    while index < len(tokens):
        kind, name, line = take(0)
        if kind == 'punct' and name == ';':
            continue
        if kind != 'name':
            raise ConfSyntaxError('line %d: expected a name, found %r'
                                  % (line, name))
        kind, value, line = take(line)
        if (kind, value) != ('punct', '='):
            raise ConfSyntaxError('line %d: expected "=" after %s'
                                  % (line, name))
        kind, value, line = take(line)
        if kind in ('str', 'int'):
            values[name] = value
            continue
        if (kind, value) != ('punct', '['):
            raise ConfSyntaxError('line %d: %s = %r is not a number, a '
                                  'quoted string or a list'
                                  % (line, name, value))
        items = []
        while True:
            kind, value, line = take(line)
            if (kind, value) == ('punct', ']'):
                break
            if (kind, value) == ('punct', ',') and items:
                continue
            if kind not in ('str', 'int'):
                raise ConfSyntaxError('line %d: unexpected %r in the list '
                                      '%s' % (line, value, name))
            items.append(value)
        values[name] = items
    return values


def read_conf(path):
    """parse_conf of the file at ``path``; OSError when it cannot be read.
    """
    with open(path, encoding='utf-8', errors='replace') as f:
        return parse_conf(f.read())


def _user_facts(value):
    """Facts about qemu.conf's ``user`` (None: not set)."""
    if value is None:
        present = []
        for name in BUILD_DEFAULT_USERS:
            try:
                pwd.getpwnam(name)
                present.append(name)
            except KeyError:
                pass
        return {'qemu_user': None, 'qemu_user_candidates': present}
    value = str(value)
    try:
        if value.startswith('+'):
            entry = pwd.getpwuid(int(value[1:]))
        else:
            try:
                entry = pwd.getpwnam(value)
            except KeyError:
                entry = pwd.getpwuid(int(value))
        return {'qemu_user': value, 'qemu_user_uid': entry.pw_uid,
                'qemu_user_name': entry.pw_name}
    except (KeyError, ValueError):
        return {'qemu_user': value, 'qemu_user_uid': None}


def _describe_user(facts):
    if facts['qemu_user'] is None:
        return ('user not set: the QEMU user is the build default '
                '(libvirt-qemu on Debian and Ubuntu, qemu on RHEL and '
                'Fedora; present here: %s)'
                % (', '.join(facts['qemu_user_candidates']) or 'neither'))
    if facts.get('qemu_user_uid') is None:
        return 'user = "%s", which is no user of this host' % (
            facts['qemu_user'])
    return 'user = "%s" (uid %d)' % (facts['qemu_user'],
                                     facts['qemu_user_uid'])


def check_ownership(host):
    """libvirt gives a stopped guest's disk back to its owner: the daemon
    refuses root-owned disks, so ``remember_owner = 0`` breaks it.
    """
    path = host.qemu_conf
    facts = {'qemu_conf': path}
    try:
        values = read_conf(path)
    except FileNotFoundError:
        return result.warning(
            "%s not found: libvirt's disk ownership settings are not "
            'checked.' % path,
            'Pass the qemu.conf the libvirt of this host reads with '
            "--qemu-conf PATH (a containerised libvirt keeps it in its "
            'own configuration directory).', **facts)
    except OSError as exc:
        return result.warning(
            'Cannot read %s: %s.' % (path, exc),
            'Run the check as root, or pass a readable copy with '
            '--qemu-conf PATH.', **facts)
    except ConfSyntaxError as exc:
        return result.failure(
            '%s: %s; libvirt refuses to start with this file.' % (path, exc),
            'Correct %s.' % path, **facts)
    settings = {}
    for name, default in DEFAULTS.items():
        value = values.get(name, default)
        if not isinstance(value, int) or value not in (0, 1):
            return result.failure(
                '%s: %s = %r is not 0 or 1; libvirt refuses to start with '
                'this file.' % (path, name, value),
                'Set %s = 1 (the default) in %s.' % (name, path), **facts)
        settings[name] = value
        facts[name] = value
        facts['%s_set' % name] = name in values
    facts.update(_user_facts(values.get('user')))
    said = ('%s: dynamic_ownership = %d%s, remember_owner = %d%s, %s.'
            % (path, settings['dynamic_ownership'],
               '' if facts['dynamic_ownership_set'] else ' (default)',
               settings['remember_owner'],
               '' if facts['remember_owner_set'] else ' (default)',
               _describe_user(facts)))
    if not settings['dynamic_ownership']:
        return result.success(
            said + ' libvirt never changes the owner of a disk: disks stay '
            "the nova user's, which the plugin's daemon accepts.", **facts)
    if settings['remember_owner']:
        return result.success(
            said + ' libvirt gives a stopped guest\'s disk back to the owner '
            'it had (the nova user); the plugin\'s daemon accepts disks '
            'owned by the nova user or the QEMU user.', **facts)
    details = (said + ' With remember_owner = 0 libvirt hands the disk of '
               'every stopped guest back to root:root, and the plugin\'s '
               'daemon refuses root-owned disks: allocating such a disk '
               '(growing it on a resize, re-allocating it) fails.')
    fix = ('Keep libvirt\'s default: set remember_owner = 1 (or delete the '
           'line) in %s and restart libvirt (virtqemud or libvirtd).' % path)
    mode = host.mode
    if mode in (modes.Mode.SPACE, modes.Mode.FULL):
        return result.failure(details + ' Mode %s allocates disks through '
                              'the daemon.' % mode.value, fix, **facts)
    return result.warning(
        details + ' Not used in mode %s, but instances of flavors with '
        '%s=space or full are allocated through the daemon.'
        % (mode.value, modes.FLAVOR_MODE_KEY), fix, **facts)


def libvirt_version():
    """(daemon path, its version tuple) of the first libvirt daemon found,
    or (None, None).
    """
    for name in DAEMONS:
        path = shutil.which(name) or shutil.which(name, path=SBIN)
        if not path:
            continue
        out = process.execute(path, '--version', timeout=TIMEOUT)
        match = re.search(r'(\d+)\.(\d+)\.(\d+)', out)
        if match:
            return path, tuple(int(g) for g in match.groups())
    return None, None


def check_metadata_cache(host):
    """libvirt honours the <metadata_cache> the plan gives qcow2 disks."""
    opts = host.conf.prealloc_backend
    facts = {'qcow2_l2_cache': opts.qcow2_l2_cache}
    if host.disk_format is not diskplan.DiskFormat.QCOW2:
        return result.success('Instance disks are not qcow2: no metadata '
                              'cache in the guest XML.', **facts)
    size = sizes.human(host.disk_size)
    plan = host.plan(host.disk_size)
    who = 'A %s qcow2 disk' % size
    if plan.mode is modes.Mode.NONE:
        # nova's own overlays; flavors asking for a mode get the plan's.
        plan = host.plan(host.disk_size, mode=modes.Mode.METADATA)
        who = ('In mode none disks get no <metadata_cache>; a %s qcow2 disk '
               'of a flavor asking %s=metadata, space or full'
               % (size, modes.FLAVOR_MODE_KEY))
    cache = plan.metadata_cache_bytes
    facts['metadata_cache_bytes'] = cache
    if cache is None:
        if opts.qcow2_l2_cache != 'full-coverage':
            return result.success(
                "qcow2_l2_cache = %s: disks get QEMU's default metadata "
                'cache.' % opts.qcow2_l2_cache, **facts)
        if qcow2_layout.l2_cache_bytes(plan.virtual_size, plan.cluster_size,
                                 plan.extended_l2) <= (
                qcow2_layout.QEMU_DEFAULT_L2_CACHE):
            return result.success(
                "%s gets no <metadata_cache>: QEMU's default L2 cache "
                '(%s) covers it. Check a larger disk with --disk-size.'
                % (who, sizes.human(qcow2_layout.QEMU_DEFAULT_L2_CACHE)),
                **facts)
        return result.warning(
            "%s gets no <metadata_cache>: the cache covering it would "
            'exceed [prealloc_backend] qcow2_metadata_cache_max_mb = %d, so '
            "QEMU's default cache serves only part of it (random reads over "
            'the whole disk are slower).'
            % (who, opts.qcow2_metadata_cache_max_mb),
            'Raise qcow2_metadata_cache_max_mb, or give flavors of such '
            'disks larger clusters (qcow2_cluster_size or the '
            'prealloc:cluster_size extra spec).', **facts)
    try:
        daemon, version = libvirt_version()
    except (exception.ProcessFailed, exception.ProcessTimeout) as exc:
        return result.warning(
            'Cannot run the libvirt daemon to read its version: %s' % exc,
            'Make sure libvirt runs on this host.', **facts)
    facts.update(libvirt_daemon=daemon,
                 libvirt_version='.'.join(map(str, version or ())) or None)
    said = '%s gets <metadata_cache> of %s' % (who, sizes.human(cache))
    if daemon is None:
        return result.warning(
            said + '; no libvirt daemon (%s) found to tell whether libvirt '
            'honours it (7.0 and later do).' % ', '.join(DAEMONS),
            'Run the check where libvirt runs, or make sure its version is '
            '7.0 or later.', **facts)
    if version < METADATA_CACHE_LIBVIRT:
        return result.warning(
            said + ", but %s is libvirt %s, which ignores the element: the "
            "disks get QEMU's default cache."
            % (daemon, facts['libvirt_version']),
            'Upgrade libvirt to 7.0 or later (nova 34 needs 8.0).', **facts)
    return result.success(said + '; %s (libvirt %s) honours it.'
                          % (daemon, facts['libvirt_version']), **facts)
