"""``devin-outposts worker ...``: the drop-in for ``devin worker``.

* ``worker start`` serves sessions from an outpost (see ``docs/worker.md`` and :mod:`devin_outposts.worker`);
* ``worker outpost create|delete|list`` is the same as ``outpost ...``, spelled like the official CLI.
"""

from __future__ import annotations

import argparse
import logging

from devin_outposts.cli.common import fail, run_until_done
from devin_outposts.cli.outpost import add_outpost_commands
from devin_outposts.core.config import ConfigError
from devin_outposts.core.exits import ExitCode
from devin_outposts.worker.options import add_start_arguments, build_config

log = logging.getLogger("devin_outposts.worker")


def _start(args: argparse.Namespace) -> int:
    try:
        config = build_config(args)
    except ConfigError as exc:
        return fail(str(exc), ExitCode.USAGE)
    # Imported here so that `worker outpost ...` does not pay for the worker's modules.
    from devin_outposts.core.logs import setup_logging
    from devin_outposts.worker.runner import Worker

    setup_logging(config.log_format, config.log_level)
    return run_until_done(Worker(config).run, log)


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("worker", help="serve sessions and manage outposts, like `devin worker`")
    verbs = parser.add_subparsers(dest="worker_command", metavar="VERB")
    verbs.required = True
    start = verbs.add_parser(
        "start",
        help="claim and serve sessions from an outpost (drop-in for `devin worker start`)",
        description="Claim sessions from an outpost's queue and serve each one with devin-remote. "
        "Pass the API token in DEVIN_OUTPOSTS_TOKEN. With DEVIN_REMOTE_SESSION_TOKEN and --session set, "
        "serve that pre-claimed session without calling the queue API (direct-serve mode).",
    )
    add_start_arguments(start)
    start.set_defaults(handler=_start)
    outpost = verbs.add_parser("outpost", help="create, delete and list outposts")
    add_outpost_commands(outpost)
