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

"""The host's policy from its configuration, checked once: every
``[prealloc_backend]`` option read, the host's mode, the settings that
contradict each other refused, each naming the options.

nova-compute's start (the driver) and ``prealloc-backend check``
(checks/config.py) call ``validate`` alike, with the configuration they
loaded. Here rather than in conf.py, the options' own module, because the
judgement speaks the planner's words (modes.host_mode, the format of the
host's disks: diskplan.host_disk_format) and conf.py stays the floor
everything, the privileged daemon included, reads; nothing here touches a
disk.
"""

from oslo_config import cfg
from oslo_log import log as logging

from prealloc_backend import conf as pb_conf
from prealloc_backend import exception
from prealloc_backend.planner import diskplan
from prealloc_backend.planner import modes

LOG = logging.getLogger(__name__)


def check_options(conf):
    """Read every [prealloc_backend] option of ``conf`` once.

    oslo.config checks a value when it is first read: without this, a bad
    progress_interval would first fail in the middle of a zero-fill.
    """
    for opt in pb_conf.prealloc_opts:
        try:
            value = getattr(conf.prealloc_backend, opt.dest)
        except cfg.ConfigSourceValueError as exc:
            reason = str(exc).split(' is not valid: ', 1)[-1]
            raise exception.InvalidOption(group=pb_conf.GROUP_NAME,
                                          name=opt.name, reason=reason,
                                          allowed=pb_conf.allowed(opt))
        if value is None and opt.default is not None:
            raise exception.InvalidOption(group=pb_conf.GROUP_NAME,
                                          name=opt.name,
                                          reason='an empty value',
                                          allowed=pb_conf.allowed(opt))


def validate(conf):
    """Refuse invalid and contradictory settings of ``conf`` (nova's
    configuration with the plugin's options), naming the options.

    Returns the host's mode.
    """
    check_options(conf)
    mode = modes.host_mode(conf)
    opts = conf.prealloc_backend
    overlays = diskplan.host_disk_format(
        conf.libvirt.images_type,
        conf.use_cow_images) is diskplan.DiskFormat.QCOW2
    if mode.preallocates and not opts.qcow2_extended_l2 and overlays:
        raise exception.ConflictingOptions(
            reason='[prealloc_backend] qcow2_extended_l2 = False with mode '
                   '%s: the instance disks are qcow2 overlays (images_type=%s'
                   ', use_cow_images=%s) and QEMU cannot preallocate an '
                   'overlay without extended_l2; set qcow2_extended_l2 = True '
                   'or mode = none' % (mode.value, conf.libvirt.images_type,
                                       conf.use_cow_images))
    if opts.mode is not None and opts.mode != conf.preallocate_images:
        LOG.info('[prealloc_backend] mode = %(mode)s overrides [DEFAULT] '
                 'preallocate_images = %(nova)s for instance disks',
                 {'mode': opts.mode, 'nova': conf.preallocate_images})
    return mode
