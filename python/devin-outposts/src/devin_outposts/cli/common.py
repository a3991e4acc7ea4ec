"""Helpers shared by the CLI verbs: API options, running a coroutine, and one-line error reporting."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Awaitable, Coroutine, Mapping
from typing import Any, Callable, Optional, TypeVar

from devin_outposts.api.client import FleetClient
from devin_outposts.api.errors import FleetAuthError, FleetConflict, FleetError, FleetNotFound
from devin_outposts.api.transport import tls_context
from devin_outposts.core import platform
from devin_outposts.core.config import (
    Program,
    add_table_arguments,
    resolve_table,
    shared_option,
    table_defaults,
)

# One table of exit codes for every verb and both programs (documented in docs/worker.md).
from devin_outposts.core.exits import ExitCode, ProgramExit
from devin_outposts.core.logs import escape_controls

T = TypeVar("T")


#: ``--api-url`` and ``--token`` of the outpost verbs: the worker's rows (core/config.py), with the same
#: variables; the token may come from its descriptor or file too.
API_OPTIONS = (shared_option("api_url", "api", Program.WORKER), shared_option("token", "api", Program.WORKER))


def add_api_options(parser: argparse.ArgumentParser) -> None:
    """``--api-url`` and ``--token``, with the same environment variables as ``devin worker``."""
    add_table_arguments(parser, API_OPTIONS, {"api": None})


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of plain text")


def fail(message: str, code: int = ExitCode.ERROR) -> int:
    """Print one error line to stderr (one line, whatever ids from the server it names) and return the exit
    code."""
    print(f"devin-outposts: error: {escape_controls(message)}", file=sys.stderr)
    return code


def exit_code_for(error: FleetError) -> int:
    if isinstance(error, FleetAuthError):
        return ExitCode.AUTH
    if isinstance(error, FleetNotFound):
        return ExitCode.NOT_FOUND
    if isinstance(error, FleetConflict):
        return ExitCode.CONFLICT
    return ExitCode.ERROR


def client_from(args: argparse.Namespace, environ: Optional[Mapping[str, str]] = None) -> FleetClient:
    """The outpost verbs' client: ``--api-url``, else ``DEVIN_API_URL``; ``--token``, else the account token
    the environment gives (core/tokenfile.py); the CA bundle of ``DEVIN_CA_BUNDLE``, if any."""
    env = os.environ if environ is None else environ
    values = {**table_defaults(API_OPTIONS), **resolve_table(API_OPTIONS, args, env)}
    return FleetClient(values["api_url"], values["token"], verify=tls_context(env))


def run_with_client(args: argparse.Namespace, action: Callable[[FleetClient], Awaitable[T]]) -> T:
    """Build a client from ``args`` and the environment, run ``action`` with it, and close it."""

    async def _run() -> T:
        async with client_from(args) as client:
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
