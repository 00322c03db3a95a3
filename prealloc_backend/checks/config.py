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

"""Checks of nova.conf itself: valid option values, and the effective mode.

oslo.config checks a value only when it is first read, so a bad value in
nova.conf surfaces in nova-compute at the first spawn that reads it. The
options check reads every option the plugin and nova-compute's part of it
use, now, and names each invalid one with the file it is in and what is
allowed. The mode check says which mode results from ``[DEFAULT]
preallocate_images`` and ``[prealloc_backend] mode``, and what the backend's
plan (``diskplan.make_plan``) makes of it for a new disk on this host.

Both run as the command's user (root) and only read: the configuration
files and the options parsed from them.
"""

from oslo_config import cfg
from oslo_privsep import priv_context

from prealloc_backend.checks import result
from prealloc_backend import conf as pb_conf
from prealloc_backend import exception
from prealloc_backend.planner import diskplan
from prealloc_backend.planner import hostpolicy
from prealloc_backend.planner import modes
import prealloc_backend.privsep
from prealloc_backend import sizes

# nova's options the plugin (and this command) reads: checked for valid
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


def checked_options():
    """[(group, name)] of every option the options check reads."""
    names = list(NOVA_OPTIONS)
    names += [(pb_conf.GROUP_NAME, opt.dest)
              for opt in pb_conf.prealloc_opts]
    section = prealloc_backend.privsep.ctx.cfg_section
    names += [(section, opt.dest) for opt in priv_context.OPTS]
    return names


def _known_opts():
    """{(group, name): Opt} of nova's options and the plugin's."""
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


def raw_value(config_args, group, name):
    """(text as written, where) of an option, for error messages; (None,
    None) when it cannot be read.
    """
    group = None if group == 'DEFAULT' else group
    scratch = cfg.ConfigOpts()
    scratch.register_opt(cfg.StrOpt(name), group=group)
    try:
        scratch(config_args, project='nova', prog='nova-compute')
        value = scratch[group][name] if group else scratch[name]
        location = scratch.get_location(name, group)
    except (cfg.Error, ValueError):
        return None, None
    return value, getattr(location, 'detail', None)


def _value(conf, group, name):
    return conf[name] if group == 'DEFAULT' else conf[group][name]


def _invalid(host, group, name, exc, opt):
    """One sentence naming the option, the value and what is allowed."""
    value, where = raw_value(host.config_args, group, name)
    text = '[%s] %s = %r' % (group, name, value)
    if where:
        text += ' (in %s)' % where
    if opt is None:
        return text + ' is not valid: ' + str(exc).split('is not valid: ',
                                                         1)[-1]
    return text + ' is not valid: allowed values are ' + pb_conf.allowed(opt)


def config_files(conf):
    files = list(conf.config_file or [])
    for directory in conf.config_dir or []:
        files.append(directory + '/*.conf')
    return files


def check_options(host):
    """Every option the plugin reads has a valid value."""
    known = _known_opts()
    problems = []
    for group, name in checked_options():
        try:
            _value(host.conf, group, name)
        except ValueError as exc:
            problems.append(_invalid(host, group, name, exc,
                                     known.get((group, name))))
            host.invalid_options.append('[%s] %s' % (group, name))
    files = config_files(host.conf)
    if problems:
        return result.failure(
            '; '.join(problems),
            'Correct the value%s in the configuration file: nova-compute '
            'fails on the first use of an invalid value.'
            % ('s' if len(problems) > 1 else ''),
            config_files=files, invalid=len(problems))
    if not files:
        return result.warning(
            'No configuration file found (looked for nova.conf and '
            'nova-compute.conf in ~/.nova, ~, /etc/nova and /etc): every '
            'option has its default value.',
            'Pass the files nova-compute reads: --config-file '
            '/etc/nova/nova.conf (repeatable) or --config-dir.',
            config_files=files, invalid=0)
    return result.success('Values valid in %s.' % ', '.join(files),
                          config_files=files, invalid=0)


def mode_source(conf):
    """Which option the host's mode comes from, in words."""
    own = conf.prealloc_backend.mode
    nova_value = conf.preallocate_images
    if own is None:
        return '[DEFAULT] preallocate_images = %s' % nova_value
    if own != nova_value:
        return ('[prealloc_backend] mode = %s (overrides [DEFAULT] '
                'preallocate_images = %s)' % (own, nova_value))
    return '[prealloc_backend] mode = %s' % own


def describe_plan(plan):
    """What the backend does to a new disk, in words."""
    if plan.fmt is diskplan.DiskFormat.QCOW2:
        cluster = ('a cluster size of %s' % sizes.human(plan.cluster_size)
                   if plan.cluster_size else "qemu-img's default cluster size")
        return ('qcow2 overlays created with extended_l2=%s, '
                'preallocation=%s, %s'
                % ('on' if plan.extended_l2 else 'off',
                   plan.preallocation.value, cluster))
    return {diskplan.RawAction.NOTHING: 'raw disks left sparse',
            diskplan.RawAction.FALLOCATE: 'raw disks allocated with '
                                        'fallocate(2) over their size',
            diskplan.RawAction.ZERO_FILL: 'raw disk holes zero-filled',
            }[plan.raw_action]


def check_mode(host):
    """The effective mode, and what the plan makes of it here."""
    mode = host.mode
    source = mode_source(host.conf)
    disk_format = host.disk_format
    facts = {'mode': mode.value, 'source': source,
             'images_type': host.conf.libvirt.images_type,
             'use_cow_images': host.conf.use_cow_images,
             'disk_format': disk_format.value if disk_format else None}
    try:
        hostpolicy.validate(host.conf)
    except exception.ConflictingOptions as exc:
        return result.failure(
            exc.format_message(),
            'Change the options named above: nova-compute '
            '(prealloc_backend.LibvirtDriver) refuses to start with them.',
            **facts)
    if disk_format is None:
        return result.warning(
            'Mode %s from %s, but images_type = %s: the plugin only handles '
            'file disks (raw, flat, qcow2, default); these disks keep '
            "nova's own behaviour." % (mode.value, source,
                                       facts['images_type']),
            'Use [libvirt] images_type = qcow2, raw or default to have disks '
            'preallocated by the plugin, or do not install it on this host.',
            **facts)
    try:
        plan = host.plan(host.disk_size)
    except exception.FallocateUnsupported as exc:
        return result.failure(
            'Mode %s from %s: %s' % (mode.value, source,
                                     exc.format_message()),
            'See the Instances filesystem check.', **facts)
    if plan.fmt is diskplan.DiskFormat.QCOW2:
        facts.update(preallocation=plan.preallocation.value,
                     extended_l2=plan.extended_l2,
                     cluster_size=plan.cluster_size)
    else:
        facts['raw_action'] = plan.raw_action.value
    facts['needed_bytes'] = plan.needed_bytes
    details = ('Mode %s from %s: %s for a %s disk on this host'
               % (mode.value, source, describe_plan(plan),
                  sizes.human(host.disk_size)))
    if plan.warning:
        details += ' (%s)' % plan.warning
    if (mode is modes.Mode.METADATA and
            plan.fmt is diskplan.DiskFormat.RAW):
        return result.warning(
            details + '. Mode metadata, but the instance disks are raw '
            '(images_type = %s, use_cow_images = %s): raw disks have no '
            'metadata, so they stay sparse.'
            % (facts['images_type'], facts['use_cow_images']),
            'Choose [prealloc_backend] mode = space or full for raw disks, '
            'or qcow2 disks ([libvirt] images_type = qcow2).', **facts)
    return result.success(
        details + '. A flavor extra spec %s=none|metadata|space|full '
        'overrides the mode for its instances.' % modes.FLAVOR_MODE_KEY,
        **facts)
