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

"""Preallocation modes, parsed once into an enum."""

import enum

from prealloc_backend import exception

# Flavor extra spec that overrides the host's mode for a flavor's instances.
FLAVOR_MODE_KEY = 'prealloc:mode'


class Mode(enum.Enum):
    NONE = 'none'
    METADATA = 'metadata'
    SPACE = 'space'
    FULL = 'full'

    @classmethod
    def parse(cls, value, source):
        """Return the Mode named ``value``; ``source`` names where it came
        from, for the error message.
        """
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise exception.InvalidPreallocMode(
                value=value, source=source, allowed=allowed())

    @property
    def preallocates(self):
        return self is not Mode.NONE


def allowed():
    return ', '.join(m.value for m in Mode)


# nova's [DEFAULT] preallocate_images values and the mode each one means.
NOVA_PREALLOCATE_IMAGES = {
    'none': Mode.NONE,
    'space': Mode.SPACE,
}


def host_mode(conf):
    """The host's mode: ``[prealloc_backend] mode``, or, unset, nova's
    ``[DEFAULT] preallocate_images`` (none -> none, space -> space).
    """
    own = conf.prealloc_backend.mode
    if own is not None:
        return Mode.parse(own, '[prealloc_backend] mode')
    nova_value = str(conf.preallocate_images).strip().lower()
    try:
        return NOVA_PREALLOCATE_IMAGES[nova_value]
    except KeyError:
        raise exception.InvalidPreallocMode(
            value=conf.preallocate_images,
            source='[DEFAULT] preallocate_images',
            allowed=', '.join(NOVA_PREALLOCATE_IMAGES))


def disk_mode(extra_specs, host):
    """The mode of a disk: its flavor's ``prealloc:mode`` extra spec when
    set, else ``host`` (the host's mode, see host_mode). The one function
    that decides it: the backend, the driver and diskplan.make_plan call it.
    """
    value = (extra_specs or {}).get(FLAVOR_MODE_KEY)
    if value is None:
        return host
    try:
        return Mode(str(value).strip().lower())
    except ValueError:
        raise exception.InvalidFlavorPolicy(
            value=value, key=FLAVOR_MODE_KEY, allowed=allowed())
