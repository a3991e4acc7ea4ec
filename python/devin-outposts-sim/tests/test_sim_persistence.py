"""State survives a restart (SIGTERM) and a crash (SIGKILL) of a ``sim serve`` subprocess."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from devin_outposts_sim.testing import SimProcess, sim_process

QUEUE = "/opbeta/outposts/devins"


def _client(proc: SimProcess, token: str) -> httpx.Client:
    return httpx.Client(base_url=proc.url, headers={"Authorization": f"Bearer {token}"}, timeout=15)


def _events_until(proc: SimProcess, token: str, cursor: str, session_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    with (
        _client(proc, token) as client,
        client.stream("GET", QUEUE, params={"watch": "true", "cursor": cursor}) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
                if events[-1]["object"]["metadata"]["session_id"] == session_id:
                    return events
    pytest.fail("the stream ended before the expected event")


@pytest.mark.parametrize("crash", [False, True], ids=["sigterm", "sigkill"])
def test_state_survives_a_restart(tmp_path: Path, crash: bool) -> None:
    with sim_process(tmp_path / "sim.db", claim_ttl=120, watch_max_duration=10, keepalive_interval=5) as proc:
        orch = proc.create_token("orchestrator")
        machine = proc.create_token("machine", account="acct-two")
        org = proc.admin.default_org()
        with _client(proc, orch) as client:
            outpost = client.post(
                "/opbeta/outposts/outposts", json={"name": "rhel", "platform": "linux"}
            ).json()
            oid = outpost["metadata"]["outpost_id"]
            client.put(f"/v3beta1/organizations/{org}/default-platform", json={"outpost_pool_id": oid})
            pending = proc.admin.enqueue(oid).session_id
            claimed = proc.admin.enqueue(oid).session_id
            gone = proc.admin.enqueue(oid).session_id
            proc.admin.tombstone(gone)
            claim = client.post(f"{QUEUE}/{claimed}/claim", json={"acceptor_id": "w1"}).json()
            token = claim["status"]["connect_token"]
            before = client.get(QUEUE).json()
        history_before = proc.admin.claims()
        first_pid = proc.pid

        proc.restart(kill=crash)

        assert proc.pid != first_pid
        with _client(proc, orch) as client:
            # Tokens, outposts, the queue, claims and settings are all still there.
            assert client.get(f"/opbeta/outposts/outposts/{oid}").json()["status"] == {
                "queue_depth": 1,
                "active_claims": 1,
            }
            after = client.get(QUEUE).json()
            assert after["items"] == before["items"]
            assert client.get(f"{QUEUE}/{gone}").status_code == 404
            assert (
                client.get(f"/v3beta1/organizations/{org}/default-platform").json()["outpost_pool_name"]
                == "rhel"
            )
            # The claim is still held: others lose, the holder renews, the old token still works.
            assert client.post(f"{QUEUE}/{claimed}/claim", json={"acceptor_id": "w2"}).status_code == 409
            assert proc.admin.check_connect_token(claimed, token)
            renewed = client.post(f"{QUEUE}/{claimed}/claim", json={"acceptor_id": "w1"})
            assert renewed.status_code == 200
            # A list cursor from before the restart still works, and watching from it sends only
            # changes made after it (revisions keep increasing across the restart).
            newer = proc.admin.enqueue(oid).session_id
            events = _events_until(proc, orch, before["cursor"], newer)
            assert [e["object"]["metadata"]["session_id"] for e in events] == [claimed, newer]
            assert pending not in {e["object"]["metadata"]["session_id"] for e in events}
        with _client(proc, machine) as other:
            assert other.get(QUEUE).status_code == 200  # the other account's token too
            assert other.get(f"{QUEUE}/{pending}").status_code == 404
        history_after = proc.admin.claims()
        assert history_after[: len(history_before)] == history_before
        assert [r["action"] for r in history_after[len(history_before) :]] == ["renew"]


def test_generated_admin_token_is_kept_in_a_private_file_and_reused(tmp_path: Path) -> None:
    import os
    import subprocess
    import time

    db = tmp_path / "sim.db"
    port_file = tmp_path / "port"
    env = {k: v for k, v in os.environ.items() if k != "DEVIN_SIM_ADMIN_TOKEN"}
    argv = [sys.executable, "-m", "devin_outposts_sim", "serve", "--db", str(db), "--port", "0"]
    argv += ["--port-file", str(port_file)]
    tokens = []
    for _dummy_round in range(2):
        port_file.unlink(missing_ok=True)
        log = (tmp_path / "serve.log").open("ab")
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 20
            while not (port_file.exists() and port_file.read_text().strip()):
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                assert time.monotonic() < deadline, "the simulator never wrote its port file"
                time.sleep(0.02)
            url = f"http://127.0.0.1:{port_file.read_text().strip()}"
            token_file = Path(str(db) + ".admin-token")
            assert token_file.stat().st_mode & 0o777 == 0o600
            token = token_file.read_text().strip()
            tokens.append(token)
            assert (
                httpx.get(f"{url}/_sim/config", headers={"Authorization": f"Bearer {token}"}).status_code
                == 200
            )
            assert httpx.get(f"{url}/_sim/config").status_code == 401
            httpx.get(f"{url}{QUEUE}", headers={"Authorization": "Bearer cog_secret_never_logged"})
        finally:
            proc.terminate()
            proc.wait(timeout=15)
            log.close()
    assert tokens[0] == tokens[1]  # reused across restarts
    output = (tmp_path / "serve.log").read_text()
    assert "serving http://127.0.0.1:" in output
    assert "GET /opbeta/outposts/devins" in output  # the access log is on by default...
    assert tokens[0] not in output  # ...and shows no token, admin or API
    assert "cog_secret_never_logged" not in output


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_graceful_stop_ends_open_watch_streams(tmp_path: Path) -> None:
    import threading

    with sim_process(tmp_path / "sim.db", watch_max_duration=300, keepalive_interval=60) as proc:
        token = proc.create_token("machine")
        ended = threading.Event()
        opened = threading.Event()

        def watcher() -> None:
            with (
                _client(proc, token) as client,
                client.stream("GET", QUEUE, params={"watch": "true"}) as response,
            ):
                opened.set()
                for _dummy_line in response.iter_lines():
                    pass
            ended.set()

        thread = threading.Thread(target=watcher, daemon=True)
        thread.start()
        assert opened.wait(timeout=10)
        code = proc.stop()
        thread.join(timeout=15)
        # The server ended the stream cleanly: a process dying mid-stream would leave an incomplete
        # chunked body, which raises in the watcher thread and never sets ``ended``.
        assert ended.is_set()
        # uvicorn re-raises the SIGTERM after its graceful shutdown, as a well-behaved daemon does.
        assert code == -signal.SIGTERM
