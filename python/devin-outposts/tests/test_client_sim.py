"""The async fleet client against the live simulator: the contract, end to end over real HTTP.

The module client (plugins/module_utils/_fleet_api.py) is held to the same simulator by the integration
playbooks, so both clients agree with one server.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from devin_outposts.api.client import FleetClient
from devin_outposts.api.errors import FleetAuthError, FleetConflict, FleetInvalid, FleetNotFound
from devin_outposts.api.models import Phase, WatchEventType
from devin_outposts_sim.testing import SimHandle, run_sim


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with run_sim(claim_ttl=30, watch_max_duration=1.0, keepalive_interval=0.2, sweep_interval=0.05) as handle:
        yield handle


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def client_for(sim: SimHandle, scope: str = "orchestrator", **kwargs: Any) -> FleetClient:
    return FleetClient(sim.url, sim.create_token(scope), retries=0, **kwargs)


def test_outpost_lifecycle_and_live_counters(sim: SimHandle) -> None:
    async def go() -> None:
        async with client_for(sim) as client:
            created = await client.create_outpost("client-life", platform="linux", description="d")
            assert created.outpost_id.startswith("outpost_env-")
            with pytest.raises(FleetConflict, match="client-life"):
                await client.create_outpost("client-life", platform="linux")
            entry = sim.admin.enqueue(created.outpost_id)
            found = await client.find_outpost("client-life")
            assert found is not None
            assert found.outpost_id == created.outpost_id
            assert found.status.queue_depth == 1
            await client.claim(entry.session_id, "w-life")
            fetched = await client.get_outpost(created.outpost_id)
            assert (fetched.status.queue_depth, fetched.status.active_claims) == (0, 1)
            assert await client.delete_outpost(created.outpost_id) is True
            assert await client.delete_outpost(created.outpost_id, missing_ok=True) is False
            assert await client.find_outpost("client-life") is None

    run(go())


def test_machine_token_cannot_create(sim: SimHandle) -> None:
    async def go() -> None:
        async with client_for(sim, "machine") as client:
            await client.create_outpost("machine-made", platform="linux")

    with pytest.raises(FleetAuthError) as info:
        run(go())
    assert info.value.status == 403


def test_unknown_token_is_401(sim: SimHandle) -> None:
    async def go() -> None:
        async with FleetClient(sim.url, "cog_not_a_real_token", retries=0) as client:
            await client.list_devins()

    with pytest.raises(FleetAuthError) as info:
        run(go())
    assert info.value.status == 401
    assert "cog_not_a_real_token" not in str(info.value)


def test_list_all_pages_and_dedups_to_the_exact_set(sim: SimHandle) -> None:
    outpost = sim.admin.create_outpost("client-pages", "linux")
    expected = {sim.admin.enqueue(outpost.outpost_id).session_id for dummy in range(57)}

    async def go() -> tuple[list[Any], Any]:
        async with client_for(sim, "machine") as client:
            return await client.list_all_devins(outpost=outpost.outpost_id, first=10)

    entries, cursor = run(go())
    assert {e.session_id for e in entries} == expected
    assert len(entries) == len(expected)
    assert cursor


def test_claim_renew_release_and_conflicts(sim: SimHandle) -> None:
    outpost = sim.admin.create_outpost("client-claims", "linux")
    session_id = sim.admin.enqueue(outpost.outpost_id).session_id

    async def go() -> None:
        async with client_for(sim, "machine") as client:
            first = await client.claim(session_id, "w-a")
            assert first.status.phase is Phase.CLAIMED
            assert first.status.gateway_url
            with pytest.raises(FleetConflict, match="already claimed"):
                await client.claim(session_id, "w-b")
            renewed = await client.claim(session_id, "w-a")
            assert renewed.connect_token_value() != first.connect_token_value()
            assert renewed.status.claim_deadline >= first.status.claim_deadline
            assert await client.release(session_id, "w-b") is None  # 409: not ours
            released = await client.release(session_id, "w-a")
            assert released is not None
            assert released.status.phase is Phase.PENDING
            sim.admin.tombstone(session_id)
            with pytest.raises(FleetNotFound):
                await client.get_devin(session_id)
            with pytest.raises(FleetNotFound):
                await client.claim(session_id, "w-a")

    run(go())


def test_list_then_watch_sees_later_changes_and_the_stream_ends(sim: SimHandle) -> None:
    outpost = sim.admin.create_outpost("client-watch", "linux")
    old = sim.admin.enqueue(outpost.outpost_id).session_id

    async def go() -> list[Any]:
        async with client_for(sim, "machine") as client:
            cursor = (await client.list_all_devins(outpost=outpost.outpost_id))[1]
            new = sim.admin.enqueue(outpost.outpost_id).session_id
            sim.admin.tombstone(old)
            events = [e async for e in client.watch_devins(outpost=outpost.outpost_id, cursor=cursor)]
            return [(e.type, e.object.session_id, new) for e in events]

    seen = run(go())  # returns at all only because the server ends the stream after watch_max_duration
    new = seen[0][2]
    assert (WatchEventType.MODIFIED, new) in [(t, s) for t, s, dummy in seen]
    assert (WatchEventType.DELETED, old) in [(t, s) for t, s, dummy in seen]


def test_default_platform_round_trip(sim: SimHandle) -> None:
    org = sim.admin.default_org()
    outpost = sim.admin.create_outpost("client-default", "linux")

    async def go() -> None:
        async with client_for(sim) as client:
            assert (await client.get_default_platform(org)).outpost_pool_id is None
            chosen = await client.set_default_platform(org, outpost_pool_id=outpost.outpost_id)
            assert chosen.outpost_pool_name == "client-default"
            assert (await client.get_default_platform(org)).outpost_pool_id == outpost.outpost_id
            with pytest.raises(FleetInvalid):
                await client.set_default_platform(org, outpost_pool_id="outpost_env-nope")
            cleared = await client.set_default_platform(org)
            assert cleared.platform is None
            assert cleared.outpost_pool_id is None

    run(go())


def cli(sim: SimHandle, *args: str, token: str) -> subprocess.CompletedProcess[str]:
    env = {"DEVIN_API_URL": sim.url, "DEVIN_OUTPOSTS_TOKEN": token, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "devin_outposts", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_create_list_delete(sim: SimHandle) -> None:
    token = sim.create_token("orchestrator")
    created = cli(
        sim,
        "worker",
        "outpost",
        "create",
        "cli-made",
        "--platform",
        "linux",
        "--description",
        "from the cli",
        token=token,
    )
    assert created.returncode == 0, created.stderr
    outpost_id = created.stdout.strip()
    assert outpost_id.startswith("outpost_env-")
    listed = cli(sim, "outpost", "list", token=token)
    assert any(line.split()[:3] == [outpost_id, "cli-made", "linux"] for line in listed.stdout.splitlines())
    again = cli(sim, "outpost", "create", "cli-made", "--platform", "linux", token=token)
    assert again.returncode == 5
    assert again.stderr.strip().splitlines() == [again.stderr.strip()]  # one line
    assert "cli-made" in again.stderr
    deleted = cli(sim, "worker", "outpost", "delete", outpost_id, token=token)
    assert (deleted.returncode, deleted.stdout.strip()) == (0, outpost_id)
    missing = cli(sim, "outpost", "delete", outpost_id, token=token)
    assert missing.returncode == 4


def test_cli_bad_token_is_one_line_and_exit_3(sim: SimHandle) -> None:
    result = cli(sim, "outpost", "list", token="cog_wrong")
    assert result.returncode == 3
    assert result.stderr.count("\n") == 1
    assert "401" in result.stderr
    assert "cog_wrong" not in result.stderr
