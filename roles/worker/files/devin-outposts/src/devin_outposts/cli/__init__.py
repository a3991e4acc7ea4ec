"""The ``devin-outposts`` command line.

Each verb group lives in its own module and registers itself through ``add_parser(subparsers)``:

* ``outpost`` (create/delete/list) mirrors ``devin worker outpost ...``;
* ``sim`` runs and scripts the fleet simulator;
* ``worker`` (later) mirrors ``devin worker start``.

Errors print one line to stderr and exit non-zero; tracebacks are reserved for bugs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Optional, Sequence

from devin_outposts import __version__

#: Exit codes shared by every verb.
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_AUTH = 3
EXIT_NOT_FOUND = 4
EXIT_CONFLICT = 5


def _verb_modules() -> list[Callable[[argparse._SubParsersAction], None]]:  # type: ignore[type-arg]
    from devin_outposts.cli import outpost, sim

    adders = [outpost.add_parser, sim.add_parser]
    try:
        from devin_outposts.cli import worker
    except ImportError:  # the worker verbs are optional until they exist
        pass
    else:
        adders.append(worker.add_parser)
    return adders


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="devin-outposts",
        description="Devin Outposts worker, fleet client and fleet simulator.",
    )
    parser.add_argument("--version", action="version", version=f"devin-outposts {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for add in _verb_modules():
        add(subparsers)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(handler(args))
    except KeyboardInterrupt:
        return 130
