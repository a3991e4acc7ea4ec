"""The simulated brain and the distribution's levers, under ``/_sim`` (admin token required).

Brain (see :mod:`~devin_outposts_sim.state.gateway` for the call life cycle):

* ``POST /_sim/sessions/{id}/calls`` ``{"calls":[{"tool":"run","command":"..."}, ...]}``: 201
  ``{"items":[call...]}``, each with its ``id``; the tools are in :mod:`~devin_outposts_sim.remote.tools`.
* ``GET /_sim/sessions/{id}/calls[?wait=S]``: ``{"items":[...], "complete": bool}``. With ``wait``, the
  answer comes once no call is queued or delivered any more (or after ``S`` seconds, at most 60).
* ``GET /_sim/sessions/{id}/connections[?wait=S&count=N]``: ``{"items":[...]}``, what each remote
  connection reported (pid, cwd, env with the connect token masked, version, ...). With ``wait``, the
  answer comes once there are ``N`` (default 1) connections.
* ``POST /_sim/sessions/{id}/end`` ``{"session_status":"suspended"|"terminated"}``: the entry; queued
  calls are cancelled and connected remotes are told to exit 0. With ``status_lag`` set, the status is
  written that many seconds after the remotes are told (the entry returned still shows the old one).

Distribution (see :mod:`~devin_outposts_sim.state.dist`):

* ``GET /_sim/dist``: the built-in SHA, the ``latest`` pointers and every artifact (without bytes).
* ``POST /_sim/dist/artifacts`` ``{"content_b64", "sha"?, "suffixes"?, "published_sha256"?, "latest"?}``:
  201 ``{"sha", "artifacts":[...]}``. A ``published_sha256`` that is not the content's makes a tampered
  artifact.
* ``POST /_sim/dist/latest`` ``{"sha", "suffixes"?, "check"?}``: the new ``latest`` pointers.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Optional

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from devin_outposts_sim.errors import Invalid
from devin_outposts_sim.http.admin import PREFIX, admin
from devin_outposts_sim.http.gateway import long_poll, wait_seconds
from devin_outposts_sim.http.runtime import body_of
from devin_outposts_sim.remote import tools
from devin_outposts_sim.state.dist import check_suffixes

MAX_ADMIN_WAIT = 60.0
OPEN_STATES = ("queued", "delivered")


async def add_calls(request: Request) -> Response:
    sim = admin(request)
    calls = tools.validate_calls((await body_of(request)).get("calls"))
    items = await run_in_threadpool(sim.store.gateway.add_calls, request.path_params["session_id"], calls)
    return JSONResponse({"items": items}, status_code=201)


async def list_calls(request: Request) -> Response:
    sim = admin(request)
    session_id = request.path_params["session_id"]
    wait = wait_seconds(request, 0.0, MAX_ADMIN_WAIT)

    def complete(items: list[dict[str, Any]]) -> bool:
        return not any(item["state"] in OPEN_STATES for item in items)

    async def probe() -> Optional[list[dict[str, Any]]]:
        items = await run_in_threadpool(sim.store.gateway.session_calls, session_id)
        return items if complete(items) else None

    items = await long_poll(sim, probe, wait) if wait > 0 else None
    if items is None:
        items = await run_in_threadpool(sim.store.gateway.session_calls, session_id)
    return JSONResponse({"items": items, "complete": complete(items)})


async def list_connections(request: Request) -> Response:
    sim = admin(request)
    session_id = request.path_params["session_id"]
    wait = wait_seconds(request, 0.0, MAX_ADMIN_WAIT)
    raw = request.query_params.get("count") or "1"
    if not raw.isdigit() or int(raw) < 1:
        raise Invalid("count must be a positive integer")
    count = int(raw)

    async def probe() -> Optional[list[dict[str, Any]]]:
        items = await run_in_threadpool(sim.store.gateway.session_connections, session_id)
        return items if len(items) >= count else None

    items = await long_poll(sim, probe, wait) if wait > 0 else None
    if items is None:
        items = await run_in_threadpool(sim.store.gateway.session_connections, session_id)
    return JSONResponse({"items": items})


async def end_session(request: Request) -> Response:
    sim = admin(request)
    status = (await body_of(request)).get("session_status", "terminated")
    lag = sim.config.status_lag
    entry = await run_in_threadpool(
        lambda: sim.store.gateway.end_session(request.path_params["session_id"], status, lag=lag)
    )
    if lag > 0:
        # Every read writes a due status first; this writes it on time for watchers too.
        sim.sweep_after(lag)
    return JSONResponse(entry.to_wire())


async def dist_state(request: Request) -> Response:
    sim = admin(request)
    return JSONResponse(await run_in_threadpool(sim.store.dist.dist_state))


async def publish(request: Request) -> Response:
    sim = admin(request)
    body = await body_of(request)
    raw = body.get("content_b64")
    if not isinstance(raw, str):
        raise Invalid("content_b64 (the artifact's bytes in base64) is required")
    try:
        content = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise Invalid("content_b64 is not valid base64") from None
    sha, digest = body.get("sha"), body.get("published_sha256")
    if digest is not None and not isinstance(digest, str):
        raise Invalid("published_sha256 must be a string")
    artifacts = await run_in_threadpool(
        lambda: sim.store.dist.publish_artifact(
            content,
            sha=sha,
            suffixes=check_suffixes(body.get("suffixes")),
            published_sha256=digest,
            make_latest=bool(body.get("latest")),
        )
    )
    return JSONResponse(
        {"sha": artifacts[0].sha, "artifacts": [a.describe() for a in artifacts]}, status_code=201
    )


async def set_latest(request: Request) -> Response:
    sim = admin(request)
    body = await body_of(request)
    sha = body.get("sha")
    if not isinstance(sha, str):
        raise Invalid("sha is required")
    suffixes = check_suffixes(body.get("suffixes"))
    await run_in_threadpool(
        lambda: sim.store.dist.set_latest(sha, suffixes, check=body.get("check", True) is not False)
    )
    state = await run_in_threadpool(sim.store.dist.dist_state)
    return JSONResponse({"latest": state["latest"]})


def brain_routes() -> list[BaseRoute]:
    session = f"{PREFIX}/sessions/{{session_id}}"
    return [
        Route(f"{session}/calls", add_calls, methods=["POST"]),
        Route(f"{session}/calls", list_calls, methods=["GET"]),
        Route(f"{session}/connections", list_connections, methods=["GET"]),
        Route(f"{session}/end", end_session, methods=["POST"]),
        Route(f"{PREFIX}/dist", dist_state, methods=["GET"]),
        Route(f"{PREFIX}/dist/artifacts", publish, methods=["POST"]),
        Route(f"{PREFIX}/dist/latest", set_latest, methods=["POST"]),
    ]
