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

"""Check that nova-compute will load the plugin's driver.

nova imports a compute driver only as ``nova.virt.<compute_driver>``; the
plugin's driver becomes importable that way when nova-compute is started by
``prealloc-nova-compute``. The check does what that command and nova's
``load_compute_driver`` do, in this process: register, import, check it is
a ComputeDriver.

It runs as the command's user (root) and writes nothing: it looks the
wrapper up in PATH and imports modules already installed.
"""

import os
import shutil
import sys

from oslo_utils import importutils

from prealloc_backend.checks import result

WRAPPER = 'prealloc-nova-compute'
DRIVER_FIX = ('set [DEFAULT] compute_driver = %s and start nova-compute '
              'with the ' + WRAPPER + ' command (same arguments)')


def find_wrapper():
    """Path of prealloc-nova-compute in PATH or beside this Python."""
    return (shutil.which(WRAPPER) or
            shutil.which(WRAPPER, path=os.path.dirname(sys.executable)))


def check_compute_driver(host):
    """compute_driver names the plugin, and the plugin imports as nova
    will import it.
    """
    from nova.virt import driver as nova_driver

    from prealloc_backend.adapter import driver

    value = host.conf.compute_driver
    wrapper = find_wrapper()
    facts = {'compute_driver': value, 'wrapper': wrapper}
    fix = DRIVER_FIX % driver.COMPUTE_DRIVER
    if value != driver.COMPUTE_DRIVER:
        if value and value.split('.')[0] == driver.NOVA_VIRT_NAME:
            why = ('nova imports compute drivers only as nova.virt.'
                   '<compute_driver>: this name cannot be loaded')
        else:
            why = ('nova-compute will load nova.virt.%s, not the plugin: '
                   'instance disks will not be preallocated by it' % value)
        return result.failure('compute_driver = %s: %s.' % (value, why), fix,
                              **facts)
    # What nova-compute does (nova.virt.driver.load_compute_driver),
    # once prealloc-nova-compute has registered the module.
    driver.register()
    try:
        cls = importutils.import_class('nova.virt.%s' % value)
    except ImportError as exc:
        return result.failure(
            'compute_driver = %s cannot be imported: %s' % (value, exc),
            "Install the plugin in nova-compute's Python environment.",
            **facts)
    if not (isinstance(cls, type) and
            issubclass(cls, nova_driver.ComputeDriver)):
        return result.failure('nova.virt.%s is not a nova compute driver.'
                              % value, fix, **facts)
    facts['driver_class'] = '%s.%s' % (cls.__module__, cls.__name__)
    if not wrapper:
        return result.warning(
            'compute_driver = %s loads %s, but only when nova-compute is '
            'started by %s, which is not in PATH.'
            % (value, facts['driver_class'], WRAPPER),
            "Install the plugin in nova-compute's environment and start "
            'nova-compute with %s.' % WRAPPER, **facts)
    return result.success(
        'compute_driver = %s loads %s when nova-compute is started by %s '
        '(plain nova-compute cannot import it and exits).'
        % (value, facts['driver_class'], wrapper), **facts)
