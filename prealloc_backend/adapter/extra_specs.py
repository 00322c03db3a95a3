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

"""Validators of the ``prealloc`` flavor extra specs, for nova-api.

Loaded by nova-api through the ``nova.api.extra_spec_validators`` entry
point ``prealloc``; install the plugin on every host running nova-api.
From microversion 2.86 on, nova-api then refuses, with HTTP 400:

* a bad value of a known key (``prealloc:mode=fast``): nova's message names
  the allowed values;
* any other key in the namespace (``prealloc:mdoe``): the catch-all
  validator below names the known keys. (nova's own refusal of an unknown
  key in a registered namespace only says the key "does not appear to be a
  valid extra spec".)

Keys outside the namespace are not affected. The allowed values come from
prealloc_backend.planner.modes and prealloc_backend.planner.qcow2_layout,
which the compute side
parses them with.
"""

from nova.api.validation.extra_specs import base
from nova import exception as nova_exception

from prealloc_backend.planner import modes
from prealloc_backend.planner import qcow2_layout

NAMESPACE = modes.FLAVOR_MODE_KEY.split(':', 1)[0]

MODE_VALUES = [mode.value for mode in modes.Mode]

mode_validator = base.ExtraSpecValidator(
    name=modes.FLAVOR_MODE_KEY,
    description=(
        'Preallocation of the instance disks of this flavor, overriding the '
        "compute host's mode ([prealloc_backend] mode, or [DEFAULT] "
        'preallocate_images when unset) at spawn, rebuild, unshelve and '
        "resize (the new flavor's mode applies to the grown disk). "
        '``none``: thin disks. ``metadata``: qcow2 metadata written at '
        'creation (nothing to do for raw). ``space``: blocks reserved with '
        'fallocate(2). ``full``: zeros written to every block not holding '
        'data. Only honoured by compute hosts running the prealloc_backend '
        'driver, on file disks (images_type raw, flat, qcow2, default).'
    ),
    value={
        'type': str,
        'description': 'The preallocation mode.',
        'enum': MODE_VALUES,
    },
)

CLUSTER_SIZE_VALUES = list(qcow2_layout.CLUSTER_SIZES)

cluster_size_validator = base.ExtraSpecValidator(
    name=qcow2_layout.FLAVOR_CLUSTER_KEY,
    description=(
        'Cluster size of the qcow2 overlays the plugin creates for this '
        "flavor's instances (modes metadata, space and full), overriding "
        "the compute host's [prealloc_backend] qcow2_cluster_size (128K by "
        'default: 4 KiB subclusters). Larger clusters have larger '
        'subclusters: every 4 KiB guest write into a new subcluster also '
        'copies the rest of it from the backing file (measured 0.36x a raw '
        'file at 256K, 0.12x at 2M); choose them only for workloads that '
        'write in large blocks. Only honoured by compute hosts running the '
        'prealloc_backend driver, on new qcow2 overlays.'
    ),
    value={
        'type': str,
        'description': 'The qcow2 cluster size.',
        'enum': CLUSTER_SIZE_VALUES,
    },
)

KNOWN_KEYS = [mode_validator.name, cluster_size_validator.name]


class UnknownKeyValidator(base.ExtraSpecValidator):
    """Refuses every key of the namespace that no other validator knows,
    naming the known keys.

    nova looks a key up by exact name first and only then tries the
    validators' patterns, so the known keys never reach this one; the
    pattern excludes them anyway, so that the validator does not claim them
    whatever the lookup order.
    """

    def validate(self, name, value):
        raise nova_exception.ValidationError(
            "Validation failed; extra spec '%s' is not a known %s extra "
            "spec: allowed keys are %s (%s allows %s; %s allows %s)." % (
                name, NAMESPACE, ', '.join(KNOWN_KEYS),
                modes.FLAVOR_MODE_KEY, ', '.join(MODE_VALUES),
                qcow2_layout.FLAVOR_CLUSTER_KEY,
                ', '.join(CLUSTER_SIZE_VALUES)))


unknown_key_validator = UnknownKeyValidator(
    name=NAMESPACE + ':{key}',
    description=(
        'Any other key of the %s namespace is refused; allowed keys are %s.'
        % (NAMESPACE, ', '.join(KNOWN_KEYS))
    ),
    value={
        'type': str,
        'description': 'Refused whatever the value.',
    },
    parameters=[
        {
            'name': 'key',
            'pattern': r'(?!(?:%s)$).*' % '|'.join(
                key.split(':', 1)[1] for key in KNOWN_KEYS),
            'description': 'Any key the plugin does not know.',
        },
    ],
)


def register():
    """Entry point of ``nova.api.extra_spec_validators``."""
    return [mode_validator, cluster_size_validator, unknown_key_validator]
