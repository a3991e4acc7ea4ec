"""The worker's fleet client against the shared contract cases (python/contract/cases.yaml).

The modules' client runs the same cases in tests/unit/plugins/module_utils/test_contract.py, the event
source in tests/eda/test_outpost_queue_contract.py. Each case
scripts the server's answers (httpx.MockTransport) and states the result or error, the requests sent and
the waits between retries; this runner turns the client's models and exceptions into the case's terms.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Optional

import httpx
import pytest

from devin_outposts.api import client as client_module
from devin_outposts.api.client import FleetClient, normalize_api_url
from devin_outposts.api.errors import FleetError, FleetNotFound
from devin_outposts.api.models import Phase
from devin_outposts.core.config import ConfigError, boolean

import casebook

CASES: list[dict[str, Any]] = casebook.load("cases.yaml")
API = "https://api.test.invalid"


class ScriptedServer:
    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies = list(replies)
        self.requests: list[httpx.Request] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        assert self.replies, f"an unexpected request: {request.method} {request.url}"
        reply = self.replies.pop(0)
        if reply.get("connection") == "refused":
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        headers = {k: casebook.header_value(v) for k, v in (reply.get("headers") or {}).items()}
        if "raw" in reply:
            content = str(reply["raw"]).encode()
        else:
            content = json.dumps(reply["body"]).encode()
            headers.setdefault("Content-Type", "application/json")
        return httpx.Response(reply["status"], headers=headers, content=content)


async def call(client: FleetClient, name: str, args: dict[str, Any]) -> Any:
    """The operation ``name`` on the worker's client, its answer in the cases' terms."""
    if name == "defaults":
        fresh = FleetClient()  # every default
        try:
            return {
                "api_url": fresh.api_url,
                "timeout": fresh._http.timeout.read,
                "max_page_size": client_module.MAX_PAGE_SIZE,
            }
        finally:
            await fresh.aclose()
    if name == "phases":
        return [phase.value for phase in Phase]
    if name == "normalize_api_url":
        return normalize_api_url(args["url"])
    if name == "boolean_words":
        return [read_boolean(value) for value in args["values"]]
    if name == "list_outposts":
        outposts = await client.list_all_outposts(page_size=args.get("page_size", 200))
        return [o.outpost_id for o in outposts]
    if name == "create_outpost":
        created = await client.create_outpost(
            args["name"], platform=args.get("platform"), description=args.get("description")
        )
        return created.outpost_id
    if name == "delete_outpost":
        return await client.delete_outpost(args["outpost_id"], missing_ok=True)
    if name == "get_outpost":
        try:
            return (await client.get_outpost(args["outpost_id"])).outpost_id
        except FleetNotFound:
            return None  # "not found" is data in both dialects
    if name == "list_sessions":
        entries, cursor = await client.list_all_devins(
            outpost=args.get("outpost"),
            phase=args.get("phase"),
            acceptor_id=args.get("acceptor_id"),
            first=args.get("page_size", 100),
            cursor=args.get("cursor"),
        )
        return {
            "sessions": [e.session_id for e in entries],
            "phases": [e.status.phase.value if e.status.phase else None for e in entries],
            "cursor": cursor,
        }
    if name in ("get_default_platform", "set_default_platform"):
        if name == "get_default_platform":
            value = await client.get_default_platform(args["org_id"])
        else:
            value = await client.set_default_platform(
                args["org_id"], platform=args.get("platform"), outpost_pool_id=args.get("outpost_pool_id")
            )
        return {k: getattr(value, k) for k in ("platform", "outpost_pool_id", "outpost_pool_name")}
    if name == "claim":
        entry = await client.claim(args["session_id"], args["acceptor_id"])
        status = entry.status
        phase = status.phase.value if status.phase else None
        return {"phase": phase, "acceptor_id": status.acceptor_id, "gateway_url": status.gateway_url}
    if name == "release":
        released = await client.release(args["session_id"], args["acceptor_id"])
        return None if released is None else released.session_id
    if name == "get_session":
        return (await client.get_devin(args["session_id"])).session_id
    raise AssertionError(f"the worker runner does not know the operation {name!r}")


def read_boolean(value: str) -> Optional[bool]:
    """The worker's boolean option reader on one text; None when it refuses it."""
    try:
        return boolean("--flag", value)
    except ConfigError:
        return None


Outcome = tuple[Any, Optional[dict[str, Any]], "ScriptedServer", list[float]]


def run_case(case: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Outcome:
    server = ScriptedServer(case.get("replies") or [])
    sleeps: list[float] = []
    real_sleep = asyncio.sleep

    async def record(seconds: float) -> None:
        sleeps.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", record)

    async def main() -> tuple[Any, Optional[dict[str, Any]]]:
        client = FleetClient(API, "cog_contract_token", transport=httpx.MockTransport(server.handle))
        try:
            return await call(client, case["call"], case.get("args") or {}), None
        except FleetError as exc:
            return None, {"status": exc.status, "message": str(exc)}
        except ValueError as exc:  # refused before any request
            return None, {"status": None, "message": str(exc)}
        finally:
            await client.aclose()

    result, error = asyncio.run(main())
    monkeypatch.undo()
    return result, error, server, sleeps


@pytest.mark.parametrize("case", casebook.cases_for("cases.yaml", "worker"), ids=lambda c: c["id"])
def test_contract_case(case: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    result, error, server, sleeps = run_case(case, monkeypatch)
    casebook.judge_call(
        case,
        "worker",
        result=result,
        error=error,
        requests=[sent_request(request) for request in server.requests],
        sleeps=sleeps,
        unasked=len(server.replies),
    )


def sent_request(request: httpx.Request) -> dict[str, Any]:
    """A request the client sent, in the case's terms."""
    sent = {
        "method": request.method,
        "path": request.url.raw_path.decode().split("?", 1)[0],
        "query": dict(request.url.params),
    }
    if request.content:
        sent["body"] = json.loads(request.content)
    return sent


def test_every_case_has_an_id_and_an_expectation() -> None:
    ids = [case["id"] for case in CASES]
    assert len(ids) == len(set(ids))
    for case in CASES:
        assert ("result" in case["expect"]) != ("error" in case["expect"]), case["id"]
