"""The ``devin-outposts`` command line.

Each verb group lives in its own module and registers itself through ``add_parser(subparsers)``:

* ``outpost`` (create/delete/list) mirrors ``devin worker outpost ...``;
* ``worker`` mirrors ``devin worker start`` and ``devin worker outpost ...``;
* ``orchestrate`` claims sessions and runs each on a fresh machine through a driver.

Only the module of the verb group being run is imported, so a long-running ``worker start`` never loads
the outpost verbs' code. The simulator has its own command, ``devin-outposts-sim``.

Errors print one line to stderr and exit non-zero; tracebacks are reserved for bugs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any, Callable, Optional

from devin_outposts import __version__
from devin_outposts.cli.common import EXIT_USAGE

#: Verb group -> the module whose ``add_parser`` registers it.
_VERB_MODULES = {
    "outpost": "devin_outposts.cli.outpost",
    "worker": "devin_outposts.cli.worker",
    "orchestrate": "devin_outposts.cli.orchestrate",
}


def _verb_adders(only: Optional[str] = None) -> list[Callable[[Any], None]]:
    return [
        importlib.import_module(module_name).add_parser
        for verb, module_name in _VERB_MODULES.items()
        if only is None or verb == only
    ]


def build_parser(only: Optional[str] = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, just that verb group is loaded (the others are unknown to it)."""
    parser = argparse.ArgumentParser(
        prog="devin-outposts",
        description="Devin Outposts worker and fleet client.",
    )
    parser.add_argument("--version", action="version", version=f"devin-outposts {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for add in _verb_adders(only):
        add(subparsers)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    first = words[0] if words else None
    parser = build_parser(first if first in _VERB_MODULES else None)
    args = parser.parse_args(words)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(handler(args))
    except KeyboardInterrupt:
        return 130
