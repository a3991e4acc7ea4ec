"""Helpers shared by the CLI verbs: API options, running a coroutine, and one-line error reporting."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Awaitable, Coroutine
from typing import Any, Callable, TypeVar

from devin_outposts.api.client import FleetClient
from devin_outposts.api.errors import FleetAuthError, FleetConflict, FleetError, FleetNotFound
from devin_outposts.core import platform

# One table of exit codes for every verb and both programs (documented in docs/worker.md).
from devin_outposts.core.exits import ExitCode, ProgramExit

T = TypeVar("T")


def add_api_options(parser: argparse.ArgumentParser) -> None:
    """``--api-url`` and ``--token``, with the same environment variables as ``devin worker``."""
    parser.add_argument(
        "--api-url",
        default=None,
        help="Devin API base URL (env DEVIN_API_URL, default https://api.devin.ai)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="API token. Prefer the DEVIN_OUTPOSTS_TOKEN environment variable: argv is visible to "
        "every user of the machine.",
    )


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of plain text")


def fail(message: str, code: int = ExitCode.ERROR) -> int:
    """Print one error line to stderr and return the exit code."""
    print(f"devin-outposts: error: {message}", file=sys.stderr)
    return code


def exit_code_for(error: FleetError) -> int:
    if isinstance(error, FleetAuthError):
        return ExitCode.AUTH
    if isinstance(error, FleetNotFound):
        return ExitCode.NOT_FOUND
    if isinstance(error, FleetConflict):
        return ExitCode.CONFLICT
    return ExitCode.ERROR


def run_with_client(args: argparse.Namespace, action: Callable[[FleetClient], Awaitable[T]]) -> T:
    """Build a client from ``args`` and the environment, run ``action`` with it, and close it."""

    async def _run() -> T:
        async with FleetClient.from_env(api_url=args.api_url, token=args.token) as client:
            return await action(client)

    return asyncio.run(_run())


def guarded(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn fleet and input errors raised by ``handler`` into one clear line and an exit code."""

    def wrapper(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except FleetError as exc:
            return fail(str(exc), exit_code_for(exc))
        except ValueError as exc:
            return fail(str(exc), ExitCode.USAGE)

    wrapper.__name__ = handler.__name__
    wrapper.__doc__ = handler.__doc__
    return wrapper


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def run_until_done(main: Callable[[], Coroutine[Any, Any, int]], log: logging.Logger) -> int:
    """Run a long-lived command's coroutine: its exit code, or the one a ``ProgramExit`` carries (one line on
    stderr and in the log); 130 for a Ctrl-C that came before the signal handlers were installed."""
    # Before anything starts a session: the token in this process's environment stays out of its reach.
    platform.current().hide_environment()
    try:
        return asyncio.run(main())
    except ProgramExit as exc:
        log.error("%s", exc)
        return fail(str(exc), exc.code)
    except KeyboardInterrupt:
        return 130
