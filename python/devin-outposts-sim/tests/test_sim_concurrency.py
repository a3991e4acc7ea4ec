"""Exactly one winner per session under many concurrent claimers (HTTP and store level)."""

from __future__ import annotations

import asyncio
import random
import ssl
import threading
from collections import Counter
from pathlib import Path

import httpx

from devin_outposts.api.models import Outpost
from devin_outposts_sim.errors import Conflict
from devin_outposts_sim.state.store import Store
from devin_outposts_sim.testing import SimHandle

QUEUE = "/opbeta/outposts/devins"
CLAIMERS = 100
SESSIONS = 5


async def _race(url: str, token: str, session_ids: list[str]) -> list[tuple[str, str, int]]:
    """Each of CLAIMERS acceptors (its own HTTP client, like a separate worker) claims every session,
    all requests released at once, in random order."""
    acceptors = [f"acceptor-{n:03d}" for n in range(CLAIMERS)]
    attempts = [(sid, acceptor) for sid in session_ids for acceptor in acceptors]
    random.shuffle(attempts)
    headers = {"Authorization": f"Bearer {token}"}
    tls = ssl.create_default_context()  # shared: building one per client is the slow part of setup
    clients = {a: httpx.AsyncClient(base_url=url, headers=headers, timeout=60, verify=tls) for a in acceptors}
    start = asyncio.Event()

    async def attempt(sid: str, acceptor: str) -> tuple[str, str, int]:
        await start.wait()
        response = await clients[acceptor].post(f"{QUEUE}/{sid}/claim", json={"acceptor_id": acceptor})
        if response.status_code == 409:
            assert response.json() == {"detail": "Session is already claimed"}
        return sid, acceptor, response.status_code

    try:
        tasks = [asyncio.ensure_future(attempt(sid, acceptor)) for sid, acceptor in attempts]
        await asyncio.sleep(0)
        start.set()
        return list(await asyncio.gather(*tasks))
    finally:
        for client in clients.values():
            await client.aclose()


def test_100_concurrent_claimers_one_winner_per_session(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    ids = [sim.admin.enqueue(outpost.outpost_id).session_id for dummy in range(SESSIONS)]
    results = asyncio.run(_race(sim.url, machine_token, ids))
    statuses = Counter(status for dummy_sid, dummy_acceptor, status in results)
    assert statuses == {200: SESSIONS, 409: SESSIONS * (CLAIMERS - 1)}
    winners = {sid: acceptor for sid, acceptor, status in results if status == 200}
    assert sorted(winners) == sorted(ids)
    client = api(machine_token)
    for sid, acceptor in winners.items():
        assert client.get(f"{QUEUE}/{sid}").json()["status"]["acceptor_id"] == acceptor
    history = sim.admin.claims(outpost_id=outpost.outpost_id)
    assert sorted((r["session_id"], r["acceptor_id"]) for r in history) == sorted(winners.items())
    assert {r["action"] for r in history} == {"claim"}


def test_threads_racing_on_one_file_database_from_two_store_connections(tmp_path: Path) -> None:
    # Two Store objects on one file behave like two processes: BEGIN IMMEDIATE serialises them.
    db = str(tmp_path / "race.db")
    stores = [Store(db), Store(db)]
    try:
        outpost = stores[0].accounts.create_outpost("acct-default", "race")
        sid = stores[0].queue.enqueue(outpost.outpost_id).session_id
        barrier = threading.Barrier(CLAIMERS)
        wins: list[str] = []
        conflicts: list[str] = []
        lock = threading.Lock()

        def claimer(n: int) -> None:
            store = stores[n % 2]
            barrier.wait(timeout=30)
            try:
                store.queue.claim("acct-default", sid, f"t{n}", ttl=60, gateway_url="ws://x")
            except Conflict:
                with lock:
                    conflicts.append(f"t{n}")
            else:
                with lock:
                    wins.append(f"t{n}")

        threads = [threading.Thread(target=claimer, args=(n,)) for n in range(CLAIMERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert len(wins) == 1
        assert len(conflicts) == CLAIMERS - 1
        assert stores[1].queue.get_entry("acct-default", sid).status.acceptor_id == wins[0]
        revs = [r["rev"] for r in stores[0].records.admin_sessions(include_deleted=True)]
        assert revs == sorted(set(revs))
    finally:
        for store in stores:
            store.close()
