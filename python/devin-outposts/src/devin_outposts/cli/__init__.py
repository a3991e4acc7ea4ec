"""The ``devin-outposts`` command line.

Each verb group lives in its own module and registers itself through ``add_parser(subparsers)``:

* ``outpost`` (create/delete/list) mirrors ``devin worker outpost ...``;
* ``worker`` mirrors ``devin worker start`` and ``devin worker outpost ...``;
* ``orchestrate`` claims sessions and runs each on a fresh machine through a driver;
* ``network-policy check`` explains what a session's network policy decides for a destination.

Only the module of the verb group being run is imported, so a long-running ``worker start`` never loads
the outpost verbs' code. The simulator has its own command, ``devin-outposts-sim``.

Errors print one line to stderr and exit non-zero; tracebacks are reserved for bugs.

This package's ``__init__`` imports only the standard library at import time, so that :func:`main` can
hide the process's environment before anything slow is loaded (:mod:`devin_outposts.privacy`).
"""

from __future__ import annotations

import sys

# Only sys and devin_outposts.privacy (stdlib only) are imported before main() has hidden this process's
# environment: typing, argparse, the verbs' modules, httpx and pydantic come after.
from devin_outposts import privacy

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from typing import Any, Callable, Optional

#: Verb group -> the module whose ``add_parser`` registers it.
_VERB_MODULES = {
    "outpost": "devin_outposts.cli.outpost",
    "worker": "devin_outposts.cli.worker",
    "orchestrate": "devin_outposts.cli.orchestrate",
    "network-policy": "devin_outposts.cli.netpolicy",
}


def _verb_adders(only: Optional[str] = None) -> list[Callable[[Any], None]]:
    import importlib

    return [
        importlib.import_module(module_name).add_parser
        for verb, module_name in _VERB_MODULES.items()
        if only is None or verb == only
    ]


def build_parser(only: Optional[str] = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, just that verb group is loaded (the others are unknown to it)."""
    import argparse

    from devin_outposts import __version__

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
    """The ``devin-outposts`` command. The first thing it does, before it imports anything slow, is make
    this process undumpable (Linux): the token in its environment is then root's to read, not every
    process of its user's, a few milliseconds after the interpreter started (docs/security.md)."""
    privacy.make_undumpable()
    from devin_outposts.core.exits import ExitCode

    words = list(sys.argv[1:] if argv is None else argv)
    first = words[0] if words else None
    parser = build_parser(first if first in _VERB_MODULES else None)
    args = parser.parse_args(words)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return ExitCode.USAGE
    try:
        return int(handler(args))
    except KeyboardInterrupt:
        return 130
