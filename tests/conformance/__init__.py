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

"""Conformance tier: nova 34's own tests with the plugin in place of nova's.

See tests/conformance/base.py for how the plugin's classes are put in place
and how the preallocation modes are applied.
"""

# NOTE(nova): as nova's own test packages do (nova/tests/unit/__init__.py,
# nova/tests/functional/__init__.py), patch before anything imports nova's
# services. With OS_NOVA_DISABLE_EVENTLET_PATCHING=true (tox.ini) it selects
# native threads and patches nothing.
# autopep8: off
from nova import monkey_patch ; monkey_patch.patch()  # noqa
# autopep8: on
