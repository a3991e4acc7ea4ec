"""The public side of a session's remote: the ``devin-remote`` distribution and the outpost gateway.

**Distribution** (no auth, like the real CDN): ``GET {sim}/devin-rs/remote/<file>`` serves
``latest_<suffix>``, ``devin-remote_<sha>_<suffix>`` and ``devin-remote_<sha>_<suffix>.sha256`` (see
:mod:`devin_outposts_sim.state.dist`); anything else is ``404 {"detail": ...}``.

**Gateway**. The real one is a websocket (``wss://``); the simulator's is plain HTTP long-poll under the
claim's ``gateway_url`` (``ws://<host:port>/gateway`` by default; the stand-in speaks ``ws://`` as
``http://``). Every request carries ``Authorization: Bearer <connect token>``; a token that is not valid
for the session right now (released, taken over, another session's, of a claim that lapsed and was not
claimed again by its acceptor, or of a tombstoned session once its remote has been told the end) is
``401 {"detail":"Invalid connect token"}``, checked before anything else.

* ``POST /gateway/sessions/{id}/connect`` with what the remote reports (pid, cwd, env, ...):
  ``{"connection_id", "session_status", "end", "max_wait"}``; marks the session ``running``.
* ``GET /gateway/sessions/{id}/next?connection_id=N&wait=S``: ``{"type":"call","call":{"id","tool",
  "args"}}``, ``{"type":"end","session_status"}`` once the session is suspended or terminated, or
  ``{"type":"idle"}`` after ``wait`` seconds (at most 30) with nothing to do. It wakes at once when the
  brain adds a call or the session changes (an asyncio notifier, no polling). A connection that a newer
  one of the session superseded gets 409.
* ``POST /gateway/sessions/{id}/calls/{call_id}/result?connection_id=N`` with the result object.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, Callable, Optional, TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from devin_outposts_sim.errors import Invalid, NotFound, SimError, Unauthorized
from devin_outposts_sim.http import validate
from devin_outposts_sim.http.auth import bearer_token
from devin_outposts_sim.http.runtime import SimRuntime, body_of, runtime_of
from devin_outposts_sim.state.dist import parse_name
from devin_outposts_sim.state.gateway import INVALID_CONNECT_TOKEN

GATEWAY_PREFIX = "/gateway"
STATIC_PREFIX = "/devin-rs/remote"
DEFAULT_WAIT = 20.0
MAX_WAIT = 30.0
T = TypeVar("T")


async def long_poll(
    sim: SimRuntime,
    probe: Callable[[], Awaitable[Optional[T]]],
    wait: float,
    request: Optional[Request] = None,
) -> Optional[T]:
    """``probe()`` until it returns something, re-probing each time the gateway notifier fires, for at
    most ``wait`` seconds (None then). Stops early when the server shuts down or the client went away."""
    hub = sim.gateway
    if hub is None:  # pragma: no cover - only without the lifespan
        raise SimError("the gateway notifier is not running")
    wake = hub.subscribe()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    try:
        while True:
            wake.clear()
            if request is not None and await request.is_disconnected():
                return None
            found = await probe()
            remaining = deadline - loop.time()
            if found is not None or remaining <= 0 or hub.closed:
                return found
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), remaining)
    finally:
        hub.unsubscribe(wake)


def wait_seconds(request: Request, default: float, maximum: float) -> float:
    raw = request.query_params.get("wait")
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86400:
        raise Invalid("wait must be a number of seconds")
    return min(value, maximum)


# --- distribution ------------------------------------------------------------------------------------


async def static_file(request: Request) -> Response:
    sim = runtime_of(request)
    name = request.path_params["name"]
    parsed = parse_name(name)
    if parsed is None:
        raise NotFound(f"No such file: {name}")
    kind, sha, suffix = parsed
    if kind == "latest":
        latest = await run_in_threadpool(sim.store.dist.latest_sha, suffix)
        return PlainTextResponse(latest + "\n")
    assert sha is not None
    artifact = await run_in_threadpool(sim.store.dist.artifact, sha, suffix)
    if artifact is None:
        raise NotFound(f"No such file: {name}")
    if kind == "sha256":
        return PlainTextResponse(artifact.published_sha256 + "\n")
    return Response(artifact.content, media_type="application/octet-stream")


# --- gateway -----------------------------------------------------------------------------------------


def connect_token(request: Request) -> str:
    token = bearer_token(request)
    if token is None:
        raise Unauthorized(INVALID_CONNECT_TOKEN)
    return token


async def authorized(request: Request) -> tuple[SimRuntime, str, str]:
    """The runtime, session id and token of a gateway request whose token the gateway accepts (else 401):
    a valid one, or one still to be told that its tombstoned session is over."""
    sim = runtime_of(request)
    session_id = request.path_params["session_id"]
    token = connect_token(request)
    if not await run_in_threadpool(sim.store.gateway.accepts_token, session_id, token):
        raise Unauthorized(INVALID_CONNECT_TOKEN)
    return sim, session_id, token


def connection_id(request: Request) -> int:
    raw = request.query_params.get("connection_id", "")
    if not raw.isdigit():
        raise Invalid("connection_id must be the id the connect answer gave")
    return int(raw)


async def connect(request: Request) -> Response:
    sim, session_id, token = await authorized(request)
    info = await body_of(request)
    env = info.get("env")
    if env is not None and (not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values())):
        raise Invalid("env must be an object of strings")
    answer = await run_in_threadpool(sim.store.gateway.remote_connect, session_id, token, info)
    return JSONResponse({**answer, "max_wait": MAX_WAIT})


async def next_call(request: Request) -> Response:
    sim = runtime_of(request)
    session_id = request.path_params["session_id"]
    token = connect_token(request)
    wait = wait_seconds(request, DEFAULT_WAIT, MAX_WAIT)
    connection = connection_id(request)

    async def probe() -> Optional[dict[str, Any]]:
        return await run_in_threadpool(sim.store.gateway.remote_next, session_id, token, connection)

    answer = await long_poll(sim, probe, wait, request)
    return JSONResponse(answer or {"type": "idle"})


async def post_result(request: Request) -> Response:
    sim, session_id, token = await authorized(request)
    connection = connection_id(request)
    result = await body_of(request)
    exit_code = result.get("exit_code")
    if isinstance(exit_code, bool) or not isinstance(exit_code, int):
        raise Invalid("exit_code must be an integer")
    validate.optional_str(result, "output", max_len=4 * 1024 * 1024)
    call_id = request.path_params["call_id"]
    answer = await run_in_threadpool(
        sim.store.gateway.remote_result, session_id, token, connection, call_id, result
    )
    return JSONResponse(answer)


def gateway_routes() -> list[BaseRoute]:
    session = f"{GATEWAY_PREFIX}/sessions/{{session_id}}"
    return [
        Route(f"{STATIC_PREFIX}/{{name}}", static_file, methods=["GET"]),
        Route(f"{session}/connect", connect, methods=["POST"]),
        Route(f"{session}/next", next_call, methods=["GET"]),
        Route(f"{session}/calls/{{call_id}}/result", post_result, methods=["POST"]),
    ]
