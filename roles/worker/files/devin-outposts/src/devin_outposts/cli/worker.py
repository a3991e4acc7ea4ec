"""``devin-outposts worker ...``: the drop-in for ``devin worker``.

``worker outpost create|delete|list`` is the same as ``outpost ...``, spelled like the official CLI.
"""

from __future__ import annotations

import argparse

from devin_outposts.cli.outpost import add_outpost_commands


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("worker", help="serve sessions and manage outposts, like `devin worker`")
    verbs = parser.add_subparsers(dest="worker_command", metavar="VERB")
    verbs.required = True
    outpost = verbs.add_parser("outpost", help="create, delete and list outposts")
    add_outpost_commands(outpost)
