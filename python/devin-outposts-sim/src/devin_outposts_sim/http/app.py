"""The simulated fleet API as a Starlette app: outposts CRUD, the queue, watch, claim, release, the
organization default platform, the enterprise's organizations list, the ``devin-remote`` distribution and the
gateway (:mod:`~devin_outposts_sim.http.gateway`), and (under ``/_sim``) the admin API and the brain
(:mod:`~devin_outposts_sim.http.admin`, :mod:`~devin_outposts_sim.http.brain`). See docs/simulator.md.

:func:`create_app` builds the app around a :class:`~devin_outposts_sim.state.store.Store`; the lifespan starts
the claim sweeper and the watch notifier. Every error, including unknown routes and wrong methods, is a
JSON ``{"detail": "..."}`` body.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Optional

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from devin_outposts_sim.errors import ALREADY_CLAIMED, Conflict, Invalid, SimError
from devin_outposts_sim.http import validate
from devin_outposts_sim.http.admin import admin_routes
from devin_outposts_sim.http.auth import authenticate
from devin_outposts_sim.http.brain import brain_routes
from devin_outposts_sim.http.cli_dist import cli_dist_routes
from devin_outposts_sim.http.config import SimConfig
from devin_outposts_sim.http.gateway import gateway_routes
from devin_outposts_sim.http.runtime import SimRuntime, body_of, detail, gateway_url, runtime_of
from devin_outposts_sim.http.watch import ChangeFeed, Notifier, watch_stream
from devin_outposts_sim.state.accounts import MACHINE_SCOPE, ORCHESTRATOR_SCOPE
from devin_outposts_sim.state.cursor import decode_org_cursor, decode_outpost_cursor, decode_queue_cursor
from devin_outposts_sim.state.store import Store

log = logging.getLogger(__name__)

#: The three spellings of the outposts collection (docs/fleet-api.md §4 and §10.1 Q1); all behave the same.
OUTPOST_COLLECTIONS = ("/opbeta/outposts/outposts", "/opbeta/outposts/pools", "/opbeta/outposts")
QUEUE = "/opbeta/outposts/devins"
ORGANIZATIONS = "/v3/enterprise/organizations"
PHASES = ("pending", "claimed")


# --- outposts --------------------------------------------------------------------------------------


async def list_outposts(request: Request) -> Response:
    sim = runtime_of(request)
    principal = await authenticate(request, sim.store, MACHINE_SCOPE, "list outposts")
    first = validate.page_size(request.query_params.get("first"))
    raw_after = request.query_params.get("after")
    after = decode_outpost_cursor(raw_after) if raw_after else None
    page = await run_in_threadpool(sim.store.accounts.list_outposts, principal.account_id, first, after)
    return JSONResponse(page.to_wire())


async def create_outpost(request: Request) -> Response:
    sim = runtime_of(request)
    principal = await authenticate(request, sim.store, ORCHESTRATOR_SCOPE, "create outposts")
    body = await body_of(request)
    name = validate.outpost_name(body.get("name"))
    platform = validate.outpost_platform(body.get("platform"))
    description = validate.optional_str(body, "description", max_len=validate.DESCRIPTION_MAX)
    allowed = body.get("allowed_org_ids")
    if allowed is not None and (
        not isinstance(allowed, list) or not all(isinstance(o, str) for o in allowed)
    ):
        raise Invalid("allowed_org_ids must be a list of organization ids or null")
    outpost = await run_in_threadpool(
        sim.store.accounts.create_outpost, principal.account_id, name, platform, description, allowed
    )
    return JSONResponse(outpost.to_wire(), status_code=201)


async def get_outpost(request: Request) -> Response:
    sim = runtime_of(request)
    principal = await authenticate(request, sim.store, ORCHESTRATOR_SCOPE, "read an outpost")
    outpost_id = request.path_params["outpost_id"]
    outpost = await run_in_threadpool(sim.store.accounts.get_outpost, principal.account_id, outpost_id)
    return JSONResponse(outpost.to_wire())


async def delete_outpost(request: Request) -> Response:
    sim = runtime_of(request)
    principal = await authenticate(request, sim.store, ORCHESTRATOR_SCOPE, "delete outposts")
    outpost_id = request.path_params["outpost_id"]
    outpost = await run_in_threadpool(sim.store.accounts.delete_outpost, principal.account_id, outpost_id)
    return JSONResponse(outpost.to_wire())


# --- the queue ---------------------------------------------------------------------------------------


async def list_devins(request: Request) -> Response:
    sim = runtime_of(request)
    principal = await authenticate(request, sim.store, MACHINE_SCOPE, "read the queue")
    query = request.query_params
    watch = validate.query_bool(query.get("watch"), "watch")
    outpost = query.get("outpost") or query.get("pool") or None
    raw_cursor = query.get("cursor")
    cursor = decode_queue_cursor(raw_cursor) if raw_cursor else None
    if watch:
        if sim.notifier is None or sim.feed is None:  # pragma: no cover - only without the lifespan
            raise SimError("the watch notifier is not running")
        stream = watch_stream(
            sim.store,
            sim.notifier,
            sim.feed,
            account_id=principal.account_id,
            outpost=outpost,
            cursor=cursor,
            max_duration=sim.config.watch_max_duration,
            keepalive_interval=sim.config.keepalive_interval,
        )
        headers = {
            "content-type": "text/event-stream",
            "cache-control": "no-cache",
            "x-accel-buffering": "no",
        }
        return StreamingResponse(stream, headers=headers)
    first = validate.page_size(query.get("first"))
    phase = query.get("phase") or None
    if phase is not None and phase not in PHASES:
        raise Invalid("phase must be pending or claimed")
    page = await run_in_threadpool(
        lambda: sim.store.queue.list_entries(
            principal.account_id,
            first=first,
            outpost=outpost,
            phase=phase,
            acceptor_id=query.get("acceptor_id") or None,
            cursor=cursor,
        )
    )
    return JSONResponse(page.to_wire())


async def get_devin(request: Request) -> Response:
    sim = runtime_of(request)
    principal = await authenticate(request, sim.store, MACHINE_SCOPE, "read the queue")
    entry = await run_in_threadpool(
        sim.store.queue.get_entry_wire, principal.account_id, request.path_params["session_id"]
    )
    return JSONResponse(entry)


async def claim(request: Request) -> Response:
    sim = runtime_of(request)
    principal = await authenticate(request, sim.store, MACHINE_SCOPE, "claim sessions")
    acceptor = validate.acceptor_id(await body_of(request))
    session_id = request.path_params["session_id"]
    if sim.store.queue.certainly_claimed_by_another(principal.account_id, session_id, acceptor):
        raise Conflict(ALREADY_CLAIMED)  # a losing claim, answered without a write (see the method)
    url = gateway_url(request, sim.config)
    entry = await run_in_threadpool(
        lambda: sim.store.queue.claim_wire(
            principal.account_id,
            session_id,
            acceptor,
            ttl=sim.config.claim_ttl,
            gateway_url=url,
        )
    )
    return JSONResponse(entry)


async def release(request: Request) -> Response:
    sim = runtime_of(request)
    principal = await authenticate(request, sim.store, MACHINE_SCOPE, "release sessions")
    acceptor = validate.acceptor_id(await body_of(request))
    entry = await run_in_threadpool(
        sim.store.queue.release_wire, principal.account_id, request.path_params["session_id"], acceptor
    )
    return JSONResponse(entry)


# --- organizations -----------------------------------------------------------------------------------


async def list_organizations(request: Request) -> Response:
    """``GET /v3/enterprise/organizations``: the token's account's organizations, paged like the outposts
    list (``first``, ``after``). Any token with an outposts scope may list them (docs/simulator.md)."""
    sim = runtime_of(request)
    principal = await authenticate(request, sim.store, MACHINE_SCOPE, "list organizations")
    first = validate.page_size(request.query_params.get("first"))
    raw_after = request.query_params.get("after")
    after = decode_org_cursor(raw_after) if raw_after else None
    page = await run_in_threadpool(sim.store.accounts.list_org_page, principal.account_id, first, after)
    return JSONResponse(page)


# --- organization default platform -----------------------------------------------------------------


async def get_default_platform(request: Request) -> Response:
    sim = runtime_of(request)
    principal = await authenticate(request, sim.store, MACHINE_SCOPE, "read the default platform")
    found = await run_in_threadpool(
        sim.store.accounts.get_default_platform, principal.account_id, request.path_params["org_id"]
    )
    return JSONResponse(found.to_wire())


async def put_default_platform(request: Request) -> Response:
    sim = runtime_of(request)
    principal = await authenticate(request, sim.store, ORCHESTRATOR_SCOPE, "set the default platform")
    body = await body_of(request)
    platform = validate.optional_str(body, "platform", max_len=100)
    outpost_pool_id = validate.optional_str(body, "outpost_pool_id", max_len=200)
    if platform is not None and outpost_pool_id is not None:
        raise Invalid("Give at most one of platform and outpost_pool_id")
    if platform is not None and not platform.strip():
        raise Invalid("platform must be a non-empty string or null")
    updated = await run_in_threadpool(
        sim.store.accounts.set_default_platform,
        principal.account_id,
        request.path_params["org_id"],
        platform,
        outpost_pool_id,
    )
    return JSONResponse(updated.to_wire())


# --- errors, lifespan, assembly ----------------------------------------------------------------------


async def on_sim_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SimError)
    return detail(exc.status, exc.detail)


async def on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return detail(exc.status_code, exc.detail, dict(exc.headers) if exc.headers else None)


async def on_crash(request: Request, exc: Exception) -> Response:
    log.error("internal error on %s %s: %s", request.method, request.url.path, type(exc).__name__)
    return detail(500, "Internal server error")


async def _sweep(store: Store, interval: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        with suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
        if stop.is_set():
            return
        try:
            expired = await run_in_threadpool(store.queue.expire_claims)
        except Exception:
            log.exception("claim sweeper failed")
        else:
            if expired:
                log.info("returned %d expired claim(s) to the queue", expired)


@asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    sim: SimRuntime = app.state.sim
    notifier = Notifier(asyncio.get_running_loop())
    sim.notifier = notifier
    feed = ChangeFeed(sim.store, notifier)
    sim.feed = feed
    sim.store.db.add_listener(feed.notify)
    gateway = Notifier(asyncio.get_running_loop())
    sim.gateway = gateway
    sim.store.db.add_listener(gateway.notify)
    sim.store.gateway.add_call_listener(gateway.notify)
    stop = asyncio.Event()
    sweeper = asyncio.ensure_future(_sweep(sim.store, sim.config.sweep_interval, stop))
    try:
        yield
    finally:
        sim.close_notifiers()
        stop.set()
        await sweeper
        sim.store.db.remove_listener(feed.notify)
        sim.store.db.remove_listener(gateway.notify)
        sim.store.gateway.remove_call_listener(gateway.notify)
        if sim.owns_store:
            sim.store.close()


def api_routes() -> list[BaseRoute]:
    routes: list[BaseRoute] = [
        Route(QUEUE, list_devins, methods=["GET"]),
        Route(QUEUE + "/{session_id}", get_devin, methods=["GET"]),
        Route(QUEUE + "/{session_id}/claim", claim, methods=["POST"]),
        Route(QUEUE + "/{session_id}/release", release, methods=["POST"]),
    ]
    for collection in OUTPOST_COLLECTIONS:
        routes.append(Route(collection, list_outposts, methods=["GET"]))
        routes.append(Route(collection, create_outpost, methods=["POST"]))
    for collection in OUTPOST_COLLECTIONS:  # after the fixed paths, which "/opbeta/outposts/{id}" shadows
        routes.append(Route(collection + "/{outpost_id}", get_outpost, methods=["GET"]))
        routes.append(Route(collection + "/{outpost_id}", delete_outpost, methods=["DELETE"]))
    routes.append(Route(ORGANIZATIONS, list_organizations, methods=["GET"]))
    path = "/v3beta1/organizations/{org_id}/default-platform"
    routes.append(Route(path, get_default_platform, methods=["GET"]))
    routes.append(Route(path, put_default_platform, methods=["PUT"]))
    return routes


def create_app(config: SimConfig, store: Optional[Store] = None) -> Starlette:
    """The simulator app. Without ``store``, it opens ``config.db`` and closes it at shutdown."""
    config.validate()
    runtime = SimRuntime(store=store or Store(config.db), config=config, owns_store=store is None)
    app = Starlette(
        routes=[*api_routes(), *gateway_routes(), *admin_routes(), *brain_routes(), *cli_dist_routes()],
        exception_handlers={SimError: on_sim_error, HTTPException: on_http_error, Exception: on_crash},
        lifespan=_lifespan,
    )
    app.state.sim = runtime
    return app
