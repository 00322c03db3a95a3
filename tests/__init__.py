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

# NOTE(nova): as nova's own test packages do, decide the concurrency mode
# before anything imports eventlet (oslo.privsep would): with
# OS_NOVA_DISABLE_EVENTLET_PATCHING=true (tox.ini) nova runs on native threads
# and forbids eventlet from then on.
# autopep8: off
from nova import monkey_patch; monkey_patch.patch()  # noqa
# autopep8: on
