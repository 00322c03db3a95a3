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
none is given) and checks, for real: the option values; the effective mode
after merging ``[DEFAULT] preallocate_images`` and ``[prealloc_backend]``;
that ``compute_driver`` loads the plugin; the instances filesystem (type, a
real fallocate(2) probe, free space for a disk); qemu-img (version, and a
tiny overlay really created there with extended_l2 and the mode's
preallocation, then grown); the start-up of the privsep daemon (the exact
command line nova-compute would run, matched against the rootwrap filters,
or the helper_command, and the helper's Python able to import the plugin).

The checks follow oslo.upgradecheck (as ``nova-status upgrade check``):
each returns a Result of Code SUCCESS, WARNING or FAILURE, and the exit
status is the highest code: 0 all good; 1 warnings, spawns work but not
everything is as nova.conf asks (say, disks left thin on a filesystem
without fallocate(2)); 2 a spawn would fail, or nova-compute would not start
the plugin. Every warning and failure comes with its fix.
"""

import argparse
import configparser
import json
import logging
import os
import re
import shlex
import shutil
import sys
import tempfile
import textwrap

from oslo_concurrency import processutils
from oslo_config import cfg
from oslo_privsep import priv_context
from oslo_rootwrap import wrapper as rootwrap_wrapper
from oslo_upgradecheck import upgradecheck
from oslo_utils import importutils
from oslo_utils import units
import prettytable

from prealloc_backend import conf as pb_conf
from prealloc_backend import exception
from prealloc_backend import fsprobe
from prealloc_backend import modes
from prealloc_backend import policy
import prealloc_backend.privsep
from prealloc_backend import qemu

LOG = logging.getLogger(__name__)

Code = upgradecheck.Code

TITLE = 'prealloc_backend host check'
STATUS = {Code.SUCCESS: 'Success', Code.WARNING: 'Warning',
          Code.FAILURE: 'Failure'}

DEFAULT_DISK_SIZE = '1G'
# Even a thin disk needs room: a qcow2 overlay's header and tables, the
# journal file written beside each disk being made, the fallocate probe.
MIN_FREE_BYTES = units.Mi
# The overlay the qemu-img check creates, and what it grows it to.
PROBE_BASE_BYTES = units.Mi
PROBE_OVERLAY_BYTES = 4 * units.Mi
PROBE_GROWN_BYTES = 8 * units.Mi
# Below this much free space the qemu-img check does not write its overlay.
PROBE_MIN_FREE = 32 * units.Mi
# extended_l2 (QEMU 5.2) is what lets QEMU preallocate an overlay.
MIN_QEMU_VERSION = (5, 2)
# Filesystems where fallocate(2) reserves blocks without writing them.
EXTENT_FILESYSTEMS = 'ext4 (with extents), xfs'
# The nova-rootwrap filter file the plugin ships (etc/rootwrap.d/).
FILTER_FILE = 'prealloc_backend.filters'
DRIVER_FIX = ('set [DEFAULT] compute_driver = %s and start nova-compute '
              'with the prealloc-nova-compute command (same arguments)')

# nova's options this command (and the plugin) reads: checked for valid
# values beside all of [prealloc_backend] and [prealloc_backend_privsep].
NOVA_OPTIONS = [
    ('DEFAULT', 'compute_driver'),
    ('DEFAULT', 'instances_path'),
    ('DEFAULT', 'preallocate_images'),
    ('DEFAULT', 'use_cow_images'),
    ('DEFAULT', 'rootwrap_config'),
    ('libvirt', 'images_type'),
    ('libvirt', 'images_cpu_time_limit'),
    ('libvirt', 'images_address_space_limit'),
    ('workarounds', 'disable_rootwrap'),
]


class Result(upgradecheck.Result):
    """An oslo.upgradecheck Result with the fix and the facts measured."""

    def __init__(self, code, details, fix=None, facts=None):
        super().__init__(code, details)
        self.fix = fix
        self.facts = facts or {}


def success(details, **facts):
    return Result(Code.SUCCESS, details, facts=facts)


def warning(details, fix, **facts):
    return Result(Code.WARNING, details, fix=fix, facts=facts)


def failure(details, fix, **facts):
    return Result(Code.FAILURE, details, fix=fix, facts=facts)


class ConfigLoadError(Exception):
    """The configuration files cannot be read at all."""


class SizeError(ValueError, argparse.ArgumentTypeError):
    """A --disk-size argparse reports with its own message."""


def parse_size(text):
    """'4M', '10G', '512K', '1T' or bytes -> bytes."""
    match = re.fullmatch(r'\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*', str(text),
                         re.IGNORECASE)
    if not match:
        raise SizeError('%r is not a size such as 512M, 10G or 1T' % text)
    factor = {'': 1, 'K': units.Ki, 'M': units.Mi, 'G': units.Gi,
              'T': units.Ti}[match.group(2).upper()]
    return int(match.group(1)) * factor


def _human(nbytes):
    for unit, factor in (('TiB', units.Ti), ('GiB', units.Gi),
                         ('MiB', units.Mi), ('KiB', units.Ki)):
        if nbytes >= factor:
            return '%.1f %s' % (nbytes / factor, unit)
    return '%d bytes' % nbytes


def _oslo_args(config_files, config_dirs):
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
        conf(_oslo_args(config_files, config_dirs), project='nova',
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


def _known_opts():
    """{(group, name): Opt} of the options NOVA_OPTIONS and ours name."""
    import nova.conf.opts

    known = {}
    lists = (list(nova.conf.opts.list_opts()) + pb_conf.list_opts() +
             [(prealloc_backend.privsep.ctx.cfg_section,
               priv_context.OPTS)])
    for group, opts in lists:
        group_name = getattr(group, 'name', group) or 'DEFAULT'
        for opt in opts:
            known[(group_name, opt.dest)] = opt
    return known


def _allowed(opt):
    """What the option accepts, in words."""
    opt_type = opt.type
    choices = getattr(opt_type, 'choices', None)
    if choices:
        return 'allowed values are %s' % ', '.join(str(c) for c in choices)
    low, high = getattr(opt_type, 'min', None), getattr(opt_type, 'max', None)
    kind = getattr(opt_type, 'type_name', 'value')
    if low is not None and high is not None:
        return 'allowed values are from %g to %g (%s)' % (low, high, kind)
    if low is not None:
        return 'allowed values are %g or more (%s)' % (low, kind)
    if high is not None:
        return 'allowed values are %g or less (%s)' % (high, kind)
    if kind == 'boolean value':
        return 'allowed values are true or false'
    return 'allowed values are any %s' % kind


class HostChecks(upgradecheck.UpgradeCommands):
    """The checks of one host, on the parsed (global) nova configuration."""

    display_title = TITLE

    def __init__(self, conf, config_args, disk_size):
        self.conf = conf
        self.config_args = config_args
        self.disk_size = disk_size
        self._fs = None
        # '[group] name' of each option whose value is invalid.
        self.invalid_options = []

    # --- helpers -------------------------------------------------------

    def _raw_value(self, group, name):
        """(raw text, file) of an option as written, for error messages."""
        group = None if group == 'DEFAULT' else group
        scratch = cfg.ConfigOpts()
        scratch.register_opt(cfg.StrOpt(name), group=group)
        try:
            scratch(self.config_args, project='nova', prog='nova-compute')
            value = scratch[group][name] if group else scratch[name]
            location = scratch.get_location(name, group)
        except (cfg.Error, ValueError):
            return None, None
        detail = getattr(location, 'detail', None)
        return value, detail

    def _invalid(self, group, name, exc, opt=None):
        """One sentence naming the option, the value and what is allowed."""
        value, where = self._raw_value(group, name)
        reason = str(exc).split('is not valid: ', 1)[-1]
        text = '[%s] %s = %r' % (group, name, value)
        if where:
            text += ' (in %s)' % where
        text += ' is not valid: '
        text += _allowed(opt) if opt is not None else reason
        return text

    def _value(self, group, name):
        if group == 'DEFAULT':
            return self.conf[name]
        return self.conf[group][name]

    def _mode(self):
        return modes.host_mode(self.conf)

    def _disk_format(self):
        """'qcow2', 'raw', or None when the plugin does not apply."""
        images_type = self.conf.libvirt.images_type
        if images_type == 'qcow2' or (images_type == 'default' and
                                      self.conf.use_cow_images):
            return 'qcow2'
        if images_type in ('raw', 'flat', 'default'):
            return 'raw'
        return None

    def _filesystem(self):
        """Facts about the filesystem holding instances_path, measured once.
        """
        if self._fs is None:
            path = os.path.abspath(self.conf.instances_path)
            directory = path
            while not os.path.isdir(directory):
                directory = os.path.dirname(directory)
            self._fs = {
                'instances_path': path,
                'exists': directory == path,
                'directory': directory,
                'fs_type': fsprobe.fs_type(directory),
                'fallocate': fsprobe.supports_fallocate(directory),
                'free_bytes': fsprobe.free_bytes(directory),
            }
        return self._fs

    def _qcow2_layout(self, mode, size):
        """The overlay layout the backend would choose, and a note when the
        fallocate policy refuses (the layout then falls back to metadata).
        """
        opts = self.conf.prealloc_backend
        fs = self._filesystem()
        try:
            return policy.qcow2_overlay_layout(
                mode, size, opts.qcow2_extended_l2, opts.qcow2_cluster_size,
                fs['fallocate'], opts.fallocate_unsupported,
                fs['instances_path'], fs['fs_type']), None
        except exception.FallocateUnsupported as exc:
            return policy.qcow2_overlay_layout(
                modes.Mode.METADATA, size, opts.qcow2_extended_l2,
                opts.qcow2_cluster_size, fs['fallocate'], 'warn',
                fs['instances_path'], fs['fs_type']), exc.format_message()

    # --- checks --------------------------------------------------------

    def _check_configuration(self):
        known = _known_opts()
        names = list(NOVA_OPTIONS)
        names += [(pb_conf.GROUP_NAME, opt.dest)
                  for opt in pb_conf.prealloc_opts]
        section = prealloc_backend.privsep.ctx.cfg_section
        names += [(section, opt.dest) for opt in priv_context.OPTS]
        problems = []
        for group, name in names:
            try:
                self._value(group, name)
            except ValueError as exc:
                problems.append(self._invalid(group, name, exc,
                                              known.get((group, name))))
                self.invalid_options.append('[%s] %s' % (group, name))
        files = list(self.conf.config_file or [])
        for directory in self.conf.config_dir or []:
            files.append(directory + '/*.conf')
        if problems:
            return failure(
                '; '.join(problems),
                'Correct the value%s in the configuration file: nova-compute '
                'fails on the first use of an invalid value.'
                % ('s' if len(problems) > 1 else ''),
                config_files=files, invalid=len(problems))
        if not files:
            return warning(
                'No configuration file found (looked for nova.conf and '
                'nova-compute.conf in ~/.nova, ~, /etc/nova and /etc): '
                'every option has its default value.',
                'Pass the files nova-compute reads: --config-file '
                '/etc/nova/nova.conf (repeatable) or --config-dir.',
                config_files=files, invalid=0)
        return success('Values valid in %s.' % ', '.join(files),
                       config_files=files, invalid=0)

    def _check_mode(self):
        from prealloc_backend import driver

        mode = self._mode()
        own = self.conf.prealloc_backend.mode
        nova_value = self.conf.preallocate_images
        if own is None:
            source = '[DEFAULT] preallocate_images = %s' % nova_value
        elif own != nova_value:
            source = ('[prealloc_backend] mode = %s (overrides [DEFAULT] '
                      'preallocate_images = %s)' % (own, nova_value))
        else:
            source = '[prealloc_backend] mode = %s' % own
        disk_format = self._disk_format()
        facts = {'mode': mode.value, 'source': source,
                 'images_type': self.conf.libvirt.images_type,
                 'use_cow_images': self.conf.use_cow_images,
                 'disk_format': disk_format}
        try:
            driver.validate_config()
        except exception.ConflictingOptions as exc:
            return failure(
                exc.format_message(),
                'Change the options named above: nova-compute '
                '(prealloc_backend.LibvirtDriver) refuses to start with them.',
                **facts)
        if disk_format is None:
            return warning(
                'Mode %s from %s, but images_type = %s: the plugin only '
                'handles file disks (raw, flat, qcow2, default); these disks '
                "keep nova's own behaviour." % (mode.value, source,
                                                facts['images_type']),
                'Use [libvirt] images_type = qcow2, raw or default to have '
                'disks preallocated by the plugin, or do not install it on '
                'this host.', **facts)
        if disk_format == 'qcow2':
            opts = self.conf.prealloc_backend
            layout = policy.qcow2_overlay_layout(
                mode, self.disk_size, opts.qcow2_extended_l2,
                opts.qcow2_cluster_size, True, 'warn', '', '')
            facts['preallocation'] = layout.preallocation
            plan = ('qcow2 overlays created with extended_l2=%s, '
                    'preallocation=%s, cluster size %s (%s for a %s disk)'
                    % ('on' if layout.extended_l2 else 'off',
                       layout.preallocation, opts.qcow2_cluster_size,
                       _human(layout.cluster_size),
                       _human(self.disk_size)))
        else:
            action = policy.raw_plan(mode, True, 'warn', '').action
            facts['raw_action'] = action
            plan = {policy.RAW_NOTHING: 'raw disks left sparse',
                    policy.RAW_FALLOCATE: 'raw disks allocated with '
                                          'fallocate(2) over their size',
                    policy.RAW_ZERO_FILL: 'raw disk holes zero-filled'}[action]
            if mode is modes.Mode.METADATA:
                return warning(
                    'Mode metadata from %s, but the instance disks are raw '
                    '(images_type = %s, use_cow_images = %s): raw disks have '
                    'no metadata, so they stay sparse.'
                    % (source, facts['images_type'],
                       facts['use_cow_images']),
                    'Choose [prealloc_backend] mode = space or full for raw '
                    'disks, or qcow2 disks ([libvirt] images_type = qcow2).',
                    **facts)
        return success(
            'Mode %s from %s: %s. A flavor extra spec %s=none|metadata|'
            'space|full overrides it for its instances.'
            % (mode.value, source, plan, modes.FLAVOR_MODE_KEY), **facts)

    def _check_compute_driver(self):
        from nova.virt import driver as nova_driver

        from prealloc_backend import driver

        value = self.conf.compute_driver
        wrapper = (shutil.which('prealloc-nova-compute') or
                   shutil.which('prealloc-nova-compute',
                                path=os.path.dirname(sys.executable)))
        facts = {'compute_driver': value, 'wrapper': wrapper}
        if value != driver.COMPUTE_DRIVER:
            if value and value.split('.')[0] == driver.NOVA_VIRT_NAME:
                why = ('nova imports compute drivers only as nova.virt.'
                       '<compute_driver>: this name cannot be loaded')
            else:
                why = ('nova-compute will load nova.virt.%s, not the plugin: '
                       'instance disks will not be preallocated by it'
                       % value)
            return failure('compute_driver = %s: %s.' % (value, why),
                           DRIVER_FIX % driver.COMPUTE_DRIVER, **facts)
        # What nova-compute does (nova.virt.driver.load_compute_driver),
        # once prealloc-nova-compute has registered the module.
        driver.register()
        try:
            cls = importutils.import_class('nova.virt.%s' % value)
        except ImportError as exc:
            return failure('compute_driver = %s cannot be imported: %s'
                           % (value, exc),
                           'Install the plugin in nova-compute\'s Python '
                           'environment.', **facts)
        if not (isinstance(cls, type) and
                issubclass(cls, nova_driver.ComputeDriver)):
            return failure('nova.virt.%s is not a nova compute driver.'
                           % value, DRIVER_FIX % driver.COMPUTE_DRIVER,
                           **facts)
        facts['driver_class'] = '%s.%s' % (cls.__module__, cls.__name__)
        if not wrapper:
            return warning(
                'compute_driver = %s loads %s, but only when nova-compute is '
                'started by prealloc-nova-compute, which is not in PATH.'
                % (value, facts['driver_class']),
                'Install the plugin in nova-compute\'s environment and '
                'start nova-compute with prealloc-nova-compute.', **facts)
        return success(
            'compute_driver = %s loads %s when nova-compute is started by %s '
            '(plain nova-compute cannot import it and exits).'
            % (value, facts['driver_class'], wrapper), **facts)

    def _check_filesystem(self):
        fs = self._filesystem()
        mode = self._mode()
        fallocate_policy = self.conf.prealloc_backend.fallocate_unsupported
        facts = dict(fs)
        where = '%s (%s)' % (fs['instances_path'], fs['fs_type'])
        if not fs['exists']:
            where += (' - does not exist yet, nova creates it; measured on '
                      '%s' % fs['directory'])
        if fs['fallocate']:
            return success('%s: fallocate(2) supported (probed).' % where,
                           **facts)
        base = '%s: fallocate(2) NOT supported (probed).' % where
        move = ('move instances_path to a filesystem with fallocate(2) (%s)'
                % EXTENT_FILESYSTEMS)
        if fallocate_policy == 'fail':
            if mode is modes.Mode.SPACE:
                return failure(
                    base + ' Mode space with [prealloc_backend] '
                    'fallocate_unsupported = fail: every spawn fails with '
                    '"does not support fallocate(2)".',
                    'Set [prealloc_backend] fallocate_unsupported = '
                    'zero-fill (writes zeros, about 20 s per GiB) or warn '
                    '(disks stay thin), or %s.' % move, **facts)
            return warning(
                base + ' Instances of flavors with %s=space will fail to '
                'spawn here (fallocate_unsupported = fail).'
                % modes.FLAVOR_MODE_KEY,
                'Set [prealloc_backend] fallocate_unsupported = zero-fill or '
                'warn, or %s.' % move, **facts)
        if fallocate_policy == 'zero-fill' or mode is not modes.Mode.SPACE:
            return success(
                base + ' Mode %s with fallocate_unsupported = %s: %s.'
                % (mode.value, fallocate_policy,
                   'space is reached by writing zeros (slow: about 20 s per '
                   'GiB)' if fallocate_policy == 'zero-fill' else
                   'the mode does not need fallocate(2)'), **facts)
        return warning(
            base + ' Mode space with fallocate_unsupported = warn: raw disks '
            'stay sparse and qcow2 overlays only get their metadata '
            'preallocated (a warning is logged per disk).',
            'Set [prealloc_backend] fallocate_unsupported = zero-fill or '
            'mode = full (both write zeros, about 20 s per GiB), or %s.'
            % move, **facts)

    def _needed_bytes(self, mode, size):
        """(bytes one new disk of ``size`` needs, how it is made)."""
        disk_format = self._disk_format()
        fs = self._filesystem()
        if disk_format == 'qcow2':
            layout, _note = self._qcow2_layout(mode, size)
            needed = qemu.measure(size, layout.preallocation,
                                  layout.cluster_size, layout.extended_l2)
            how = 'qcow2 preallocation=%s' % layout.preallocation
        else:
            try:
                action = policy.raw_plan(
                    mode, fs['fallocate'],
                    self.conf.prealloc_backend.fallocate_unsupported,
                    fs['instances_path']).action
            except exception.FallocateUnsupported:
                action = policy.RAW_NOTHING
            needed = size if action != policy.RAW_NOTHING else 0
            how = 'raw, %s' % action
        return max(needed, MIN_FREE_BYTES), how

    def _check_free_space(self):
        fs = self._filesystem()
        mode = self._mode()
        if self._disk_format() is None:
            return success('images_type = %s: instance disks are not files '
                           'in instances_path (%s free there for the image '
                           'cache).' % (self.conf.libvirt.images_type,
                                        _human(fs['free_bytes'])),
                           free_bytes=fs['free_bytes'])
        free = fs['free_bytes']
        needed, how = self._needed_bytes(mode, self.disk_size)
        facts = {'directory': fs['directory'], 'free_bytes': free,
                 'disk_bytes': self.disk_size, 'needed_bytes': needed,
                 'allocation': how}
        worst = needed
        if mode is not modes.Mode.FULL:
            worst, _how = self._needed_bytes(modes.Mode.FULL, self.disk_size)
        facts['needed_bytes_full'] = worst
        if needed > free:
            return failure(
                '%s free on the filesystem holding %s; a new %s disk in mode '
                '%s (%s) needs %s (%d bytes needed, %d free): spawns fail '
                'with "Not enough space to preallocate disk".'
                % (_human(free), fs['instances_path'],
                   _human(self.disk_size), mode.value, how, _human(needed),
                   needed, free),
                'Free space on that filesystem or move instances_path to a '
                'larger one (each new image also needs its copy in '
                'instances_path/_base).', **facts)
        details = ('%s free on the filesystem holding %s: room for %d new '
                   '%s disk(s) in mode %s (%s, %s each)'
                   % (_human(free), fs['instances_path'], free // needed,
                      _human(self.disk_size), mode.value, how,
                      _human(needed)))
        if worst != needed:
            details += ('; %d with a flavor asking %s=full'
                        % (free // worst, modes.FLAVOR_MODE_KEY))
        return success(details + '. Check another size with --disk-size.',
                       **facts)

    def _qemu_version(self):
        out = qemu.execute('--version')
        first = out.splitlines()[0] if out else ''
        match = re.search(r'version (\d+)\.(\d+)(?:\.(\d+))?', first)
        if not match:
            raise exception.QemuImgOutputError(
                cmd='qemu-img --version', reason='no version number',
                output=out[:200])
        return first.strip(), tuple(int(g or 0) for g in match.groups())

    def _check_qemu_img(self):
        try:
            line, version = self._qemu_version()
        except exception.PreallocError as exc:
            return failure(
                'qemu-img cannot run: %s' % exc.format_message(),
                'Install qemu-img (Debian/Ubuntu: qemu-utils, RHEL: '
                'qemu-img) in nova-compute\'s PATH.')
        facts = {'version': '.'.join(str(v) for v in version),
                 'version_line': line}
        if version[:2] < MIN_QEMU_VERSION:
            return failure(
                '%s: extended_l2, which preallocated overlays need, came with '
                'QEMU 5.2.' % line, 'Upgrade QEMU (nova 34 needs 6.2 anyway).',
                **facts)
        fs = self._filesystem()
        if fs['free_bytes'] < PROBE_MIN_FREE:
            return warning(
                '%s; no test overlay created: only %s free on the filesystem '
                'holding %s.' % (line, _human(fs['free_bytes']),
                                 fs['instances_path']),
                'Free space there (see the free space check) and run the '
                'check again.', **facts)
        mode = self._mode()
        layout, note = self._qcow2_layout(mode, PROBE_OVERLAY_BYTES)
        if layout.preallocation == 'off' and layout.extended_l2:
            # Thin by host mode, but flavors may ask for more: test it.
            layout = policy.Qcow2Layout('metadata', True,
                                        layout.cluster_size)
        facts.update(preallocation=layout.preallocation,
                     extended_l2=layout.extended_l2,
                     cluster_size=layout.cluster_size)
        try:
            tested = self._try_overlay(fs['directory'], layout)
        except exception.PreallocError as exc:
            return failure(
                '%s cannot create a qcow2 overlay with extended_l2=%s, '
                'preallocation=%s in %s: %s'
                % (line, 'on' if layout.extended_l2 else 'off',
                   layout.preallocation, fs['directory'],
                   exc.format_message()),
                'Spawns fail the same way: fix the error above (a QEMU '
                'without extended_l2 support, a filesystem refusing the '
                'writes), or set [prealloc_backend] mode = none.', **facts)
        facts.update(tested)
        details = ('%s created a %s overlay with extended_l2=%s, '
                   'preallocation=%s, cluster_size=%s in %s (%s allocated) '
                   'and grew it to %s (%s allocated).'
                   % (line, _human(PROBE_OVERLAY_BYTES),
                      'on' if layout.extended_l2 else 'off',
                      layout.preallocation, _human(layout.cluster_size),
                      fs['directory'], _human(tested['allocated_bytes']),
                      _human(PROBE_GROWN_BYTES),
                      _human(tested['grown_allocated_bytes'])))
        if note:
            details += ' (%s)' % note
        if layout.preallocation in ('falloc', 'full') and (
                tested['grown_allocated_bytes'] < PROBE_GROWN_BYTES):
            return warning(
                details + ' The data area is not fully allocated.',
                'Check that the filesystem supports fallocate(2) for files '
                'qemu-img writes (see the filesystem check).', **facts)
        return success(details, **facts)

    def _try_overlay(self, directory, layout):
        """Create, inspect and grow a tiny overlay in ``directory``."""
        workdir = tempfile.mkdtemp(prefix='.prealloc-check-', dir=directory)
        try:
            base = os.path.join(workdir, 'base.raw')
            with open(base, 'wb') as f:
                f.write(b'prealloc-check' * (PROBE_BASE_BYTES // 14))
                f.truncate(PROBE_BASE_BYTES)
            overlay = os.path.join(workdir, 'overlay.qcow2')
            qemu.create_overlay(overlay, PROBE_OVERLAY_BYTES, base, 'raw',
                                layout)
            info = qemu.info(overlay, 'qcow2')
            data = info.get('format-specific', {}).get('data', {})
            if bool(data.get('extended-l2')) != layout.extended_l2:
                raise exception.QemuImgOutputError(
                    cmd='qemu-img info', reason='extended-l2 is %s, asked %s'
                    % (data.get('extended-l2'), layout.extended_l2),
                    output=str(data)[:200])
            allocated = os.stat(overlay).st_blocks * 512
            qemu.resize(overlay, 'qcow2', PROBE_GROWN_BYTES,
                        layout.preallocation if layout.extended_l2
                        else 'off')
            grown = os.stat(overlay).st_blocks * 512
            return {'allocated_bytes': allocated,
                    'grown_allocated_bytes': grown}
        except OSError as exc:
            raise exception.AllocationFailed(path=workdir, reason=str(exc))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _check_privsep(self):
        ctx = prealloc_backend.privsep.ctx
        mode = self._mode()
        facts = {}
        # Sentences that describe the setup, and (code, sentence, fix) of
        # what is wrong with it; the checks go on after a problem, so that
        # one run names every problem.
        notes, problems = [], []
        helper_command = self.conf[ctx.cfg_section].helper_command
        if helper_command:
            helper = self._privsep_helper_command(helper_command, facts,
                                                  notes, problems)
        else:
            helper = self._privsep_root_helper(facts, notes, problems)
        if helper:
            self._privsep_helper_imports(helper, facts, notes, problems)
        details = ' '.join(notes + [p[1] for p in problems])
        if not problems:
            return success(details, **facts)
        fix = ' '.join(dict.fromkeys(p[2] for p in problems))
        if facts.get('method') == 'root_helper':
            fix += (' Or set [%s] helper_command instead (for example "sudo '
                    'privsep-helper --config-file /etc/nova/nova.conf").'
                    % prealloc_backend.privsep.ctx.cfg_section)
        code = max(p[0] for p in problems)
        if code == Code.WARNING:
            return warning(details, fix, **facts)
        # Raw disks, the raw config drive included, are allocated through
        # the daemon in modes space and full; flavors may ask for them.
        if mode in (modes.Mode.SPACE, modes.Mode.FULL):
            return failure(
                details + ' In mode %s spawns fail when the first raw disk '
                '(a config drive included) is allocated.' % mode.value,
                fix, **facts)
        return warning(
            details + ' Not needed in mode %s, but instances of flavors with '
            '%s=space or full will fail to spawn.'
            % (mode.value, modes.FLAVOR_MODE_KEY), fix, **facts)

    def _privsep_helper_command(self, helper_command, facts, notes,
                                problems):
        """Check [prealloc_backend_privsep] helper_command; return the
        privsep-helper it runs, or None.
        """
        section = prealloc_backend.privsep.ctx.cfg_section
        argv = shlex.split(helper_command)
        facts.update(method='helper_command', command=argv)
        fix = 'Correct [%s] helper_command.' % section
        if not argv or not shutil.which(argv[0]):
            problems.append((Code.FAILURE, 'helper_command %r: %s is not an '
                             'executable in PATH.' % (helper_command,
                                                      argv[:1]), fix))
            return None
        files, dirs = _config_args(argv)
        facts.update(helper_config_files=files, helper_config_dirs=dirs)
        ours = os.path.realpath(self.conf.instances_path)
        theirs = self._helper_instances_path(files, dirs)
        facts['helper_instances_path'] = theirs
        if theirs is None or os.path.realpath(theirs) != ours:
            problems.append((
                Code.FAILURE,
                'The daemon started by helper_command reads instances_path '
                '= %s (its configuration: %s), not %s: it refuses every disk '
                'under instances_path.'
                % (theirs, ', '.join(files + dirs) or 'no --config-file, so '
                   'nova.conf is not read', ours),
                "Pass nova-compute's configuration files to the helper: "
                'helper_command = sudo privsep-helper --config-file '
                '/etc/nova/nova.conf (oslo.privsep adds --privsep_context '
                'and --privsep_sock_path).'))
        helper = next((a for a in argv
                       if os.path.basename(a).startswith('privsep-helper')),
                      None)
        if helper is None:
            problems.append((
                Code.WARNING,
                'helper_command %r does not name privsep-helper: whether '
                'the daemon can import the plugin is not checked.'
                % helper_command,
                "Make sure the command runs oslo.privsep's privsep-helper "
                "from nova's Python environment."))
            return None
        path = shutil.which(helper)
        if not path:
            problems.append((Code.FAILURE, 'helper_command %r: %s not found.'
                             % (helper_command, helper), fix))
            return None
        notes.append('helper_command runs %s.' % path)
        return path

    def _privsep_root_helper(self, facts, notes, problems):
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
        facts.update(method='root_helper', root_helper=root_helper,
                     command=cmd)
        notes.append('nova-compute runs "%s".' % ' '.join(cmd))
        if not shutil.which(root_argv[0]):
            problems.append((
                Code.FAILURE, '%s is not installed.' % root_argv[0],
                'Install %s and let the nova user run "%s privsep-helper" '
                'without a password (distribution packages of nova do).'
                % (root_argv[0], root_helper)))
        if self.conf.workarounds.disable_rootwrap:
            helper = shutil.which('privsep-helper')
            if not helper:
                problems.append((Code.FAILURE, 'privsep-helper is not in '
                                 'PATH.', 'Install oslo.privsep where nova '
                                 'runs.'))
            return helper
        return self._privsep_rootwrap(root_argv, cmd[len(root_argv):],
                                      facts, notes, problems)

    def _privsep_rootwrap(self, root_argv, userargs, facts, notes, problems):
        """Match the helper's command line against nova-rootwrap's filters
        exactly as nova-rootwrap does; return the privsep-helper it runs.
        """
        rootwrap_conf = self.conf.rootwrap_config
        facts['rootwrap_config'] = rootwrap_conf
        if len(root_argv) < 2 or not shutil.which(root_argv[1]):
            problems.append((Code.FAILURE, '%s is not in PATH.'
                             % ' '.join(root_argv[1:2]),
                             'Install nova (nova-rootwrap) in PATH.'))
        parser = configparser.RawConfigParser()
        try:
            if not parser.read(rootwrap_conf):
                raise OSError('not found or not readable')
            config = rootwrap_wrapper.RootwrapConfig(parser)
        except (OSError, configparser.Error, ValueError) as exc:
            problems.append((
                Code.FAILURE, 'The rootwrap configuration %s ([DEFAULT] '
                'rootwrap_config) cannot be read: %s.' % (rootwrap_conf, exc),
                "Install nova's rootwrap.conf there (distribution packages "
                'do).'))
            return None
        filters = rootwrap_wrapper.load_filters(config.filters_path)
        ours = [os.path.join(d, FILTER_FILE) for d in config.filters_path
                if os.path.isfile(os.path.join(d, FILTER_FILE))]
        facts.update(filters_path=config.filters_path,
                     exec_dirs=config.exec_dirs, filter_files=ours)
        try:
            matched = rootwrap_wrapper.match_filter(filters, userargs,
                                                    config.exec_dirs)
        except rootwrap_wrapper.FilterMatchNotExecutable:
            problems.append((
                Code.FAILURE, 'nova-rootwrap finds no privsep-helper in its '
                'exec_dirs (%s).' % ', '.join(config.exec_dirs),
                'Add the directory holding privsep-helper (%s) to exec_dirs '
                'in %s.' % (os.path.dirname(shutil.which('privsep-helper') or
                                            '') or 'not in PATH either',
                            rootwrap_conf)))
            return None
        except rootwrap_wrapper.NoFilterMatched:
            problems.append((
                Code.FAILURE, 'nova-rootwrap refuses it: no filter in %s '
                'matches.' % ', '.join(config.filters_path),
                'Copy etc/rootwrap.d/%s to one of those directories.'
                % FILTER_FILE))
            return None
        facts['filter'] = matched.name
        note = 'nova-rootwrap allows it by the filter %s' % matched.name
        if matched.name == rootwrap_wrapper.load_filters([])[-1].name:
            note += (" (oslo.rootwrap's built-in rule for privsep-helper; "
                     '%s %s)' % (FILTER_FILE,
                                 'installed but not matching these '
                                 'arguments' if ours else 'not installed'))
        notes.append(note + '.')
        return matched.get_exec(exec_dirs=config.exec_dirs)

    def _helper_instances_path(self, files, dirs):
        """instances_path as the daemon's own configuration reads it."""
        import nova.conf.compute
        import nova.conf.paths

        scratch = cfg.ConfigOpts()
        opts = {opt.dest: opt for opt in nova.conf.paths.ALL_OPTS}
        for opt in nova.conf.compute.ALL_OPTS:
            if opt.dest == 'instances_path':
                opts['instances_path'] = opt
        scratch.register_opts(list(opts.values()))
        try:
            # privsep-helper parses its arguments with project 'privsep'.
            scratch(_oslo_args(files, dirs), project='privsep',
                    prog='privsep-helper', default_config_files=[])
            return scratch.instances_path
        except (cfg.Error, ValueError) as exc:
            LOG.warning('Cannot read the helper\'s configuration: %s', exc)
            return None

    def _privsep_helper_imports(self, helper, facts, notes, problems):
        """The Python running privsep-helper must import the plugin."""
        facts['privsep_helper'] = helper
        interpreter = _script_interpreter(helper)
        if interpreter is None:
            notes.append('%s is not a Python script: its environment is not '
                         'checked.' % helper)
            return
        facts['python'] = interpreter
        try:
            processutils.execute(*interpreter, '-c',
                                 'import prealloc_backend.privsep.fs')
        except (processutils.ProcessExecutionError, OSError) as exc:
            problems.append((
                Code.FAILURE, 'The Python of %s (%s) cannot import the '
                'plugin: %s' % (helper, ' '.join(interpreter),
                                str(getattr(exc, 'stderr', '') or exc)
                                .strip()[-300:]),
                'Install prealloc_backend in the Python environment of %s '
                '(the one nova-compute runs in).' % helper))
            return
        notes.append('The Python of %s (%s) imports the plugin.'
                     % (helper, ' '.join(interpreter)))

    def _invalid_label(self, exc):
        match = re.match(r'Value for option (\S+)', str(exc))
        name = match.group(1) if match else None
        labels = [label for label in self.invalid_options
                  if label.endswith('] %s' % name)]
        return ' or '.join(labels) or 'an option (%s)' % exc

    _upgrade_checks = (
        ('Configuration', _check_configuration),
        ('Effective mode', _check_mode),
        ('Compute driver', _check_compute_driver),
        ('Instances filesystem', _check_filesystem),
        ('Free space', _check_free_space),
        ('qemu-img', _check_qemu_img),
        ('Privsep daemon', _check_privsep),
    )

    def run_checks(self):
        """[(name, Result)] of every check; a check never raises."""
        results = []
        for name, func in self._upgrade_checks:
            try:
                result = func(self)
            except ValueError as exc:
                # An invalid option value this check needed: the
                # Configuration check names it and what is allowed.
                result = failure('Not checked: it needs %s, whose value is '
                                 'invalid.' % self._invalid_label(exc),
                                 'See the Configuration check.')
            except exception.PreallocError as exc:
                result = failure(exc.format_message(),
                                 'See the message: spawns fail the same way.')
            results.append((name, result))
        return results


def _config_args(argv):
    """(--config-file values, --config-dir values) of a command line."""
    files, dirs = [], []
    for index, arg in enumerate(argv):
        for flag, found in (('--config-file', files), ('--config-dir', dirs)):
            if arg == flag and index + 1 < len(argv):
                found.append(argv[index + 1])
            elif arg.startswith(flag + '='):
                found.append(arg.split('=', 1)[1])
    return files, dirs


def _script_interpreter(path):
    """argv of the interpreter of a '#!' script, or None."""
    try:
        with open(path, 'rb') as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b'#!'):
        return None
    argv = shlex.split(first[2:].decode(errors='replace'))
    return argv or None


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
    for name, result in results:
        lines = ['Check: %s' % name, 'Result: %s' % STATUS[result.code],
                 _wrap(result.details or '', 'Details: ')]
        if result.fix:
            lines.append(_wrap(result.fix, 'Fix: '))
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
        '--verbose', action='store_true',
        help='Print the log lines of the plugin and nova on stderr.')


def run(args):
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.ERROR,
        format='%(levelname)s %(name)s: %(message)s', stream=sys.stderr)
    conf = pb_conf.CONF
    config_args = _oslo_args(args.config_file, args.config_dir)
    try:
        load_config(conf, args.config_file, args.config_dir)
    except ConfigLoadError as exc:
        results = [('Configuration', failure(
            str(exc), 'Pass the files nova-compute reads: --config-file '
                      '/etc/nova/nova.conf (repeatable) or --config-dir.'))]
        files = list(args.config_file) + list(args.config_dir)
    else:
        checks = HostChecks(conf, config_args, args.disk_size)
        results = checks.run_checks()
        files = list(conf.config_file or []) + list(conf.config_dir or [])
    if args.json:
        print(render_json(results, files))
    else:
        print(render_table(results))
    return int(max(r.code for _n, r in results))
