"""The test-only admin API under ``/_sim``: the levers the real service keeps to itself.

It plays the Devin "brain" (enqueueing sessions, moving them through ``session_status``, tombstoning
them) and the account admin (issuing API tokens, creating organizations), and exposes the records tests
need (the claim history, connect-token validity). Every route except ``GET /_sim/health`` needs
``Authorization: Bearer <admin token>``; a wrong or missing one is a 401. See docs/simulator.md.
"""

from __future__ import annotations

from typing import Any, Optional

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from devin_outposts_sim.errors import Invalid, NotFound
from devin_outposts_sim.http import validate
from devin_outposts_sim.http.auth import require_admin
from devin_outposts_sim.http.runtime import SimRuntime, body_of, runtime_of
from devin_outposts_sim.state.accounts import DEFAULT_ACCOUNT, KNOWN_SCOPES

PREFIX = "/_sim"
#: Short scope names accepted by the admin API and the CLI.
SCOPE_ALIASES = {scope.rsplit(".", 1)[-1]: scope for scope in KNOWN_SCOPES}


def admin(request: Request) -> SimRuntime:
    sim = runtime_of(request)
    require_admin(request, sim.config.admin_token)
    return sim


def full_scope(name: Any) -> str:
    if not isinstance(name, str) or (name not in KNOWN_SCOPES and name not in SCOPE_ALIASES):
        raise Invalid(f"scope must be one of {', '.join(SCOPE_ALIASES)} (or the full scope names)")
    return SCOPE_ALIASES.get(name, name)


def account_of(body: dict[str, Any]) -> str:
    value = body.get("account_id")
    return DEFAULT_ACCOUNT if value is None else validate.identifier(value, "account_id")


def query_opt(request: Request, name: str) -> Optional[str]:
    return request.query_params.get(name) or None


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def get_config(request: Request) -> Response:
    return JSONResponse(admin(request).config.public())


async def put_config(request: Request) -> Response:
    """Change the settings that may change while serving: only ``tombstone_after`` (seconds, or null for
    never). A reset restores the configured value."""
    sim = admin(request)
    body = await body_of(request)
    unknown = sorted(set(body) - {"tombstone_after"})
    if unknown:
        raise Invalid(f"only tombstone_after can be changed while serving (got {', '.join(unknown)})")
    if "tombstone_after" in body:
        try:
            sim.set_tombstone_after(body["tombstone_after"])
        except ValueError as exc:
            raise Invalid(str(exc)) from exc
    return JSONResponse(sim.config.public())


async def create_token(request: Request) -> Response:
    sim = admin(request)
    body = await body_of(request)
    raw = body.get("scopes", [body["scope"]] if "scope" in body else None)
    if not isinstance(raw, list):
        raise Invalid("give scope (a name) or scopes (a list of names)")
    scopes = sorted({full_scope(name) for name in raw})
    account = account_of(body)
    label = validate.optional_str(body, "label", max_len=200)
    token = await run_in_threadpool(sim.store.accounts.create_token, account, scopes, label)
    org = await run_in_threadpool(sim.store.accounts.ensure_account, account)
    return JSONResponse(
        {"token": token, "account_id": account, "scopes": scopes, "default_org_id": org}, status_code=201
    )


async def ensure_account(request: Request) -> Response:
    sim = admin(request)
    account = account_of(await body_of(request))
    org_id = await run_in_threadpool(sim.store.accounts.ensure_account, account)
    return JSONResponse({"account_id": account, "default_org_id": org_id})


async def create_org(request: Request) -> Response:
    sim = admin(request)
    body = await body_of(request)
    account = account_of(body)
    name = validate.org_name(body.get("name"))
    org = await run_in_threadpool(sim.store.accounts.create_org, account, name)
    return JSONResponse(org, status_code=201)


async def list_orgs(request: Request) -> Response:
    sim = admin(request)
    items = await run_in_threadpool(sim.store.accounts.list_orgs, query_opt(request, "account_id"))
    return JSONResponse({"items": items})


async def create_outpost(request: Request) -> Response:
    sim = admin(request)
    body = await body_of(request)
    outpost = await run_in_threadpool(
        sim.store.accounts.create_outpost,
        account_of(body),
        validate.outpost_name(body.get("name")),
        validate.outpost_platform(body.get("platform")),
        validate.optional_str(body, "description", max_len=validate.DESCRIPTION_MAX),
    )
    return JSONResponse(outpost.to_wire(), status_code=201)


async def enqueue(request: Request) -> Response:
    sim = admin(request)
    body = await body_of(request)
    outpost_id = validate.required_str(body, "outpost_id", max_len=200)
    session_id = body.get("session_id")
    if session_id is not None:
        validate.identifier(session_id, "session_id")
    policy = body.get("network_policy")
    if policy is not None and not isinstance(policy, dict):
        raise Invalid("network_policy must be an object or null")
    entry = await run_in_threadpool(
        lambda: sim.store.queue.enqueue_wire(
            outpost_id,
            session_id,
            kind=validate.optional_str(body, "kind", max_len=32) or "new",
            platform=validate.optional_str(body, "platform", max_len=32),
            remote_binary_sha=validate.optional_str(body, "remote_binary_sha", max_len=64),
            session_status=validate.optional_str(body, "session_status", max_len=32) or "pending",
            network_policy=policy,
        )
    )
    return JSONResponse(entry, status_code=201)


async def list_sessions(request: Request) -> Response:
    sim = admin(request)
    include = validate.query_bool(request.query_params.get("include_deleted"), "include_deleted")
    items = await run_in_threadpool(
        lambda: sim.store.records.admin_sessions(
            outpost_id=query_opt(request, "outpost_id"), include_deleted=include
        )
    )
    return JSONResponse({"items": items})


async def get_session(request: Request) -> Response:
    sim = admin(request)
    session_id = request.path_params["session_id"]
    found = await run_in_threadpool(
        lambda: sim.store.records.admin_sessions(session_id=session_id, include_deleted=True)
    )
    if not found:
        raise NotFound("Session not found")
    return JSONResponse(found[0])


async def set_status(request: Request) -> Response:
    sim = admin(request)
    status = validate.required_str(await body_of(request), "session_status", max_len=32)
    entry = await run_in_threadpool(
        sim.store.queue.set_session_status_wire, request.path_params["session_id"], status
    )
    return JSONResponse(entry)


async def tombstone(request: Request) -> Response:
    sim = admin(request)
    entry = await run_in_threadpool(sim.store.queue.tombstone, request.path_params["session_id"])
    return JSONResponse(entry.to_wire())


async def claims(request: Request) -> Response:
    sim = admin(request)
    items = await run_in_threadpool(
        lambda: sim.store.records.claim_history(
            session_id=query_opt(request, "session_id"),
            outpost_id=query_opt(request, "outpost_id"),
            acceptor_id=query_opt(request, "acceptor_id"),
            account_id=query_opt(request, "account_id"),
        )
    )
    return JSONResponse({"items": items})


async def check_connect_token(request: Request) -> Response:
    sim = admin(request)
    body = await body_of(request)
    session_id = validate.required_str(body, "session_id", max_len=200)
    token = validate.required_str(body, "token", max_len=500)
    valid = await run_in_threadpool(sim.store.gateway.check_connect_token, session_id, token)
    return JSONResponse({"valid": valid})


async def reset(request: Request) -> Response:
    sim = admin(request)
    await run_in_threadpool(sim.store.reset)
    sim.set_tombstone_after(sim.configured_tombstone_after)
    return JSONResponse({"status": "ok"})


def admin_routes() -> list[BaseRoute]:
    return [
        Route(f"{PREFIX}/health", health, methods=["GET"]),
        Route(f"{PREFIX}/config", get_config, methods=["GET"]),
        Route(f"{PREFIX}/config", put_config, methods=["PUT"]),
        Route(f"{PREFIX}/accounts", ensure_account, methods=["POST"]),
        Route(f"{PREFIX}/tokens", create_token, methods=["POST"]),
        Route(f"{PREFIX}/orgs", create_org, methods=["POST"]),
        Route(f"{PREFIX}/orgs", list_orgs, methods=["GET"]),
        Route(f"{PREFIX}/outposts", create_outpost, methods=["POST"]),
        Route(f"{PREFIX}/sessions", enqueue, methods=["POST"]),
        Route(f"{PREFIX}/sessions", list_sessions, methods=["GET"]),
        Route(f"{PREFIX}/sessions/{{session_id}}", get_session, methods=["GET"]),
        Route(f"{PREFIX}/sessions/{{session_id}}/status", set_status, methods=["POST", "PUT"]),
        Route(f"{PREFIX}/sessions/{{session_id}}/tombstone", tombstone, methods=["POST"]),
        Route(f"{PREFIX}/claims", claims, methods=["GET"]),
        Route(f"{PREFIX}/connect-tokens/check", check_connect_token, methods=["POST"]),
        Route(f"{PREFIX}/reset", reset, methods=["POST"]),
    ]
