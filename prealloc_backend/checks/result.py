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

"""What a check returns: an oslo.upgradecheck Result with its fix and facts.

Every check of ``prealloc-backend check`` is a function ``check(host) ->
Result``; ``host`` (checks/host.py) holds the parsed configuration and the
facts measured once for all checks. A Result is oslo.upgradecheck's, with
its Code (SUCCESS, WARNING, FAILURE) and one paragraph of details, and two
attributes upgradecheck's lacks: the fix (a sentence telling the operator
what to change, for WARNING and FAILURE), which the table prints on a line
of its own after the details, where nova-status runs its remedy into the
details; and the facts measured, which ``--json`` prints for configuration
management (cmd/check.py). Nothing here touches the filesystem.
"""

from oslo_upgradecheck import upgradecheck

Code = upgradecheck.Code


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
