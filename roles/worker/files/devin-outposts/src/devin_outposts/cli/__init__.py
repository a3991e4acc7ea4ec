"""The ``devin-outposts`` command line.

Each verb group lives in its own module and registers itself through ``add_parser(subparsers)``:

* ``outpost`` (create/delete/list) mirrors ``devin worker outpost ...``;
* ``sim`` runs and scripts the fleet simulator;
* ``worker`` (later) mirrors ``devin worker start``.

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

#: Modules whose ``add_parser`` registers a verb group, and the optional extra each one needs.
_VERB_MODULES = (
    ("devin_outposts.cli.outpost", None),
    ("devin_outposts.cli.worker", None),
    ("devin_outposts.cli.sim", "sim"),
)


def _verb_adders() -> list[Callable[[Any], None]]:
    adders: list[Callable[[Any], None]] = []
    for module_name, extra in _VERB_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # Only an optional extra that is not installed may hide a verb group; anything else is a bug.
            if extra is None or exc.name not in ("starlette", "uvicorn"):
                raise
            continue
        adders.append(module.add_parser)
    return adders


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="devin-outposts",
        description="Devin Outposts worker, fleet client and fleet simulator.",
    )
    parser.add_argument("--version", action="version", version=f"devin-outposts {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for add in _verb_adders():
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
