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

"""The parsers of ``prealloc-backend``'s subcommands and of
``prealloc-bench``, for sphinx-argparse.

prealloc_backend.cmd.main builds a subcommand's parser only once the
subcommand is chosen (``add_arguments`` of its module); these functions
build it the same way, so that the CLI pages render every option from the
code (``.. argparse::`` with ``:module: cli_parsers``).
"""

import argparse
import importlib
import re

from prealloc_backend.cmd import main


def rst_escape(text):
    """Help text is plain text; sphinx-argparse parses it as
    reStructuredText, where ``*.conf`` would open an emphasis.
    """
    return re.sub(r'([\\*`|])', r'\\\1', text)


def _parser(name):
    module = importlib.import_module('prealloc_backend.cmd.' + name)
    parser = argparse.ArgumentParser(prog='prealloc-backend ' + name,
                                     description=main.SUBCOMMANDS[name])
    module.add_arguments(parser)
    _escape(parser)
    return parser


def _escape(parser):
    for action in parser._actions:
        if action.help and action.help is not argparse.SUPPRESS:
            action.help = rst_escape(action.help)


def check_parser():
    return _parser('check')


def report_parser():
    return _parser('report')


def bench_parser():
    """``prealloc-bench``'s parser: the benchmark's own distribution."""
    from prealloc_bench import cmd
    parser = cmd.build_parser()
    _escape(parser)
    return parser
