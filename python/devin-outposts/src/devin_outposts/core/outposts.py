"""Choosing the outpost to serve and checking that its platform matches this machine (docs/fleet-api.md
§7.1 and §7.5).

* ``--outpost`` is a name or an id, looked up in the outposts list (which a machine token may read);
* without it, the account's only outpost is used; with several, an interactive terminal is asked to
  choose, anything else must pass ``--outpost`` (exit 2);
* an outpost's ``spec.platform`` of ``null`` means the default platform and is accepted; any other value
  that is not this machine's OS (including one we do not know) ends the worker with exit code 6 before it
  claims anything, so it never claims and releases in a loop. A queue entry whose own ``spec.platform``
  names another OS is skipped (not claimed) with a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from typing import Optional

from devin_outposts.api.client import FleetClient
from devin_outposts.api.models import Outpost, QueueEntry
from devin_outposts.core.exits import ExitCode, ProgramExit
from devin_outposts.core.logs import escape_controls
from devin_outposts.core.platform import host_os

log = logging.getLogger(__name__)


async def resolve_outpost(client: FleetClient, wanted: Optional[str]) -> Outpost:
    if wanted:
        outpost = await client.find_outpost(wanted)
        if outpost is None:
            raise ProgramExit(
                ExitCode.NOT_FOUND, f"Could not find outpost {wanted}: no outpost has this name or id"
            )
        return outpost
    outposts = await client.list_all_outposts()
    if len(outposts) == 1:
        log.info("--outpost not given; serving the account's only outpost %s", outposts[0].name)
        return outposts[0]
    if not outposts:
        raise ProgramExit(ExitCode.NOT_FOUND, "the account has no outposts; create one or pass --outpost")
    if sys.stdin.isatty() and sys.stderr.isatty():
        return await asyncio.to_thread(_prompt_outpost, outposts)
    names = ", ".join(sorted(o.name for o in outposts))
    raise ProgramExit(ExitCode.USAGE, f"--outpost is required: the account has several outposts ({names})")


def check_platform(
    outpost: Optional[Outpost], entry: Optional[QueueEntry] = None, *, here: Optional[str] = None
) -> None:
    """Exit 6 when the outpost (or, for a default-platform outpost, the entry) wants another platform
    than ``here`` (this machine's OS by default; the orchestrator passes its driver's platform)."""
    here = here or host_os()
    platform = outpost.spec.platform if outpost is not None else None
    if platform is None and entry is not None:
        platform = entry.spec.platform
    if platform is not None and platform.value != here:
        name = outpost.name if outpost is not None else "the session's outpost"
        raise ProgramExit(
            ExitCode.PLATFORM,
            f"outpost {name} serves {platform.value} sessions but this machine runs {here}; run the "
            "worker on a matching machine or use an outpost for this platform",
        )


def entry_platform_ok(entry: QueueEntry, here: Optional[str] = None) -> bool:
    platform = entry.spec.platform
    return platform is None or platform.value == (here or host_os())


def _prompt_outpost(outposts: list[Outpost]) -> Outpost:
    ordered = sorted(outposts, key=lambda o: o.name)
    print("Outposts of this account:", file=sys.stderr)
    for number, outpost in enumerate(ordered, 1):
        platform = outpost.spec.platform.value if outpost.spec.platform else "default"
        line = f"  {number}. {outpost.name} ({outpost.outpost_id}, {platform})"
        print(escape_controls(line), file=sys.stderr)
    while True:
        print("Serve which outpost? [number] ", end="", file=sys.stderr, flush=True)
        answer = sys.stdin.readline()
        if not answer:
            raise ProgramExit(ExitCode.USAGE, "no outpost chosen; pass --outpost")
        with contextlib.suppress(ValueError):
            choice = int(answer.strip())
            if 1 <= choice <= len(ordered):
                return ordered[choice - 1]
