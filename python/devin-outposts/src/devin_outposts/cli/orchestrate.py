"""``devin-outposts orchestrate``: claim sessions and run each on a fresh machine (docs/orchestrator.md)."""

from __future__ import annotations

import argparse
import logging

from devin_outposts.cli.common import fail, run_until_done
from devin_outposts.core.exits import ExitCode

log = logging.getLogger("devin_outposts.orchestrator")


def _orchestrate(args: argparse.Namespace) -> int:
    # Imported here so that other verbs do not pay for the orchestrator's modules.
    from devin_outposts.core.config import ConfigError
    from devin_outposts.core.logs import setup_logging
    from devin_outposts.orchestrator.options import build_config
    from devin_outposts.orchestrator.runner import Orchestrator

    try:
        # The token from DEVIN_OUTPOSTS_TOKEN, _FD or _FILE (core/tokenfile.py): read into the config, never
        # put into this process's environment.
        config = build_config(args)
    except ConfigError as exc:
        return fail(str(exc), ExitCode.USAGE)
    setup_logging(config.log_format, config.log_level)
    return run_until_done(Orchestrator(config).run, log)


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from devin_outposts.orchestrator.options import add_arguments

    parser = subparsers.add_parser(
        "orchestrate",
        help="claim sessions and run each on a fresh machine (process, podman, kubernetes, ansible)",
        description="Watch an outpost's queue, claim sessions oldest first up to --max-concurrent, "
        "provision a machine for each through the driver, start the worker there in direct-serve mode "
        "with the session's connect token, and tear the machine down when the session ends. The API "
        "token comes from DEVIN_OUTPOSTS_TOKEN, or from the file descriptor in DEVIN_OUTPOSTS_TOKEN_FD "
        "or the 0600 file in DEVIN_OUTPOSTS_TOKEN_FILE (never argv).",
    )
    add_arguments(parser)
    parser.set_defaults(handler=_orchestrate)
