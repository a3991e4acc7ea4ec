"""Running ``podman``: one command at a time, without a shell, bounded in time, with a clean environment.

:class:`PodmanCli` is what the driver calls podman through. podman runs with the orchestrator's
environment minus every ``DEVIN_*`` variable (the account token never reaches podman, so never a
container); a command that outlives ``command_timeout``, or whose caller gave up (cancelled), is killed.
No argv of ours holds a secret (the connect token reaches podman on stdin), so argv is logged at debug.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
from collections.abc import Iterable
from typing import Any, Optional

from devin_outposts.orchestrator.drivers.base import DriverError
from devin_outposts.orchestrator.drivers.podman.objects import LIST_ATTEMPTS, Result, parse_json

log = logging.getLogger(__name__)


class PodmanCli:
    def __init__(self, podman: str = "podman", command_timeout: float = 120.0) -> None:
        self.podman = podman
        self.command_timeout = command_timeout

    def environment(self) -> dict[str, str]:
        # podman and conmon inherit this; a container gets none of it unless asked, but the account
        # token (DEVIN_OUTPOSTS_TOKEN) has no business in any process of the container stack.
        return {key: value for key, value in os.environ.items() if not key.startswith("DEVIN_")}

    async def run(self, *args: str, what: str, stdin: Optional[bytes] = None) -> Result:
        """``podman <args>`` without a shell; ``what`` names the operation in errors. ``stdin``: what
        podman reads (a secret: never in argv)."""
        log.debug("podman %s", shlex.join(args))
        try:
            proc = await asyncio.create_subprocess_exec(
                self.podman,
                *args,
                stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self.environment(),
            )
        except OSError as exc:
            raise DriverError(f"cannot run {self.podman} to {what}: {exc}") from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin), self.command_timeout)
        except asyncio.TimeoutError:
            await self.kill(proc)
            raise DriverError(f"podman did not {what} within {self.command_timeout:g} s") from None
        except asyncio.CancelledError:
            # The orchestrator gave up on this step (its provision timeout, a shutdown): no podman call
            # may go on acting behind its back.
            await asyncio.shield(self.kill(proc))
            raise
        code = proc.returncode if proc.returncode is not None else -1
        return Result(code, out.decode(errors="replace"), err.decode(errors="replace"))

    @staticmethod
    async def kill(proc: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()

    async def check(self, *args: str, what: str, stdin: Optional[bytes] = None) -> Result:
        """:meth:`run`; a failure is a :class:`DriverError` naming ``what``."""
        result = await self.run(*args, what=what, stdin=stdin)
        if result.code != 0:
            raise DriverError(f"Could not {what}: {result.error_line()}")
        return result

    async def inspect(self, kind: str, name: str) -> Optional[dict[str, Any]]:
        """``podman <kind> inspect <name>`` as a mapping; None when it does not exist."""
        # podman 4.3's `secret inspect` prints JSON by default and takes --format json for a template.
        as_json = [] if kind == "secret" else ["--format", "json"]
        result = await self.run(kind, "inspect", *as_json, name, what=f"inspect {kind} {name}")
        if result.code != 0:
            if result.not_found():
                return None
            raise DriverError(f"Could not inspect {kind} {name}: {result.error_line()}")
        data = parse_json(result.stdout, f"{kind} inspect {name}")
        if isinstance(data, list) and data and isinstance(data[0], dict):
            return data[0]
        return None

    async def listing(self, args: Iterable[str], what: str) -> list[dict[str, Any]]:
        """A listing as mappings. One that failed because something in it was removed meanwhile (another
        session's teardown) is asked again: that object is simply not listed any more."""
        argv = [*args, "--format", "json"]
        for attempt in range(LIST_ATTEMPTS):
            result = await self.run(*argv, what=what)
            if result.code == 0 or not result.not_found() or attempt + 1 == LIST_ATTEMPTS:
                break
        if result.code != 0:
            raise DriverError(f"Could not {what}: {result.error_line()}")
        data = parse_json(result.stdout, what)
        return [item for item in data if isinstance(item, dict)] if isinstance(data, list) else []
