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

"""``prealloc-backend``: the plugin's operator command.

Subcommands live in their own modules under prealloc_backend.cmd, each with
``add_arguments(parser)`` and ``run(args) -> exit status``; they are imported
only when chosen. The benchmark is its own command, ``prealloc-bench``
(the prealloc-backend-bench distribution, bench/ in the repository).
"""

import argparse
import importlib
import sys
import time

from prealloc_backend.system import stopping

SUBCOMMANDS = {
    'check': 'Tell whether this host will do what nova.conf asks, before '
             'the first spawn.',
    'adopt': 'Bring existing disks of this host to its preallocation '
             'policy, live for running guests.',
    'report': "Write this host's capacity figures (per host, disk and "
              "guest) for Prometheus: node_exporter's textfile collector.",
}
# Subcommands that talk to nova's services over oslo.messaging: they run in
# nova's native threading mode, as prealloc-nova-compute does (an eventlet
# imported but not patched leaves an RPC reply unread until it times out).
NATIVE_THREADS = ('adopt',)


def build_parser():
    parser = argparse.ArgumentParser(
        prog='prealloc-backend',
        description='Operator tools of the prealloc_backend nova plugin.')
    subparsers = parser.add_subparsers(dest='command', metavar='COMMAND')
    subparsers.required = True
    for name, summary in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=summary, description=summary)
        sub.set_defaults(module='prealloc_backend.cmd.' + name)
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    # Parse the subcommand name first, then let its module add its options.
    known, _rest = parser.parse_known_args(argv[:1] if argv else argv)
    if known.command in NATIVE_THREADS and 'eventlet' not in sys.modules:
        # Before anything imports eventlet (oslo.privsep does); a process
        # that already has it (a test runner) keeps what it chose.
        from nova import monkey_patch
        monkey_patch.patch(backend='threading')
    module = importlib.import_module(known.module)
    sub = argparse.ArgumentParser(prog='prealloc-backend ' + known.command,
                                  description=SUBCOMMANDS[known.command])
    module.add_arguments(sub)
    args = sub.parse_args(argv[1:])
    # When the command started (time.monotonic's clock): its process's
    # start, imports included (check's --timeout counts from it).
    args.started = time.monotonic() - stopping.seconds_since_start()
    return module.run(args)


if __name__ == '__main__':
    sys.exit(main())
