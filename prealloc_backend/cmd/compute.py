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

"""``prealloc-nova-compute``: nova-compute able to load the plugin's driver.

Run it exactly like ``nova-compute`` (same arguments, same configuration
files), with ``compute_driver = prealloc_backend.LibvirtDriver``.
"""
# autopep8: off
from nova import monkey_patch; monkey_patch.patch(backend='threading')  # noqa
# autopep8: on

from nova.cmd import compute  # noqa: E402

from prealloc_backend.adapter import driver  # noqa: E402


def main():
    driver.register()
    compute.main()
