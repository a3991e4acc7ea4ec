"""The worker end to end with the simulator's real stand-in ``devin-remote``.

A real ``devin-outposts worker start`` process downloads the stand-in from the simulator's distribution
(``--static-base-url``), verifies it and runs it for every claimed session; the stand-in connects to the
simulator's gateway with the connect token and executes the tool calls the test scripts as the brain.
Every assertion is on observed state: the call results and the connection records (what the stand-in
reported about itself, its environment included) read back through the admin API, the claim history,
and files on disk. Every process a test starts (workers, stand-ins and their commands) is stopped by
that test; the fixture fails the test if a stand-in outlived its worker.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from devin_outposts_sim.remote import tools

from standin_harness import CANARY, CHROME, PASSTHROUGH, REQUIRED, Harness, running_harness
from worker_fakes import alive, make_git_repo, pids_working_under


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    with running_harness(tmp_path) as h:
        yield h


def result_summary(calls: list[dict[str, Any]]) -> list[tuple[str, str, int, bool]]:
    return [(c["tool"], c["state"], c["result"]["exit_code"], c["result"]["ok"]) for c in calls]


# --- 1. end to end ----------------------------------------------------------------------------------


def test_a_claimed_session_runs_the_brains_tool_calls_then_the_worker_serves_the_next(
    harness: Harness,
) -> None:
    h = harness
    origin = make_git_repo(h.tmp / "origin" / "app", {"README.md": "# app\nversion one\n"})
    worker = h.worker("w1")
    first = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
    conn = h.connection(first)
    [claim] = h.claims(first, "claim")
    assert (conn["acceptor_id"], conn["chain"]) == (claim["acceptor_id"], claim["seq"])
    assert conn["ppid"] == worker.pid  # this worker process started it
    assert conn["version"] == h.standin_sha  # the build the worker downloaded and verified
    assert Path(conn["cwd"]) == (h.tmp / "w1" / "work").resolve()

    h.sim.admin.add_calls(
        first,
        [
            tools.git_clone(str(origin)),
            tools.edit("repos/app/README.md", "version one", "version two"),
            tools.run("git diff --stat && cat README.md", cwd="repos/app"),
            tools.read("repos/app/README.md"),
            tools.run(["sh", "-c", "echo failing >&2; exit 3"]),
        ],
    )
    calls = h.calls_done(first)
    assert result_summary(calls) == [
        ("git_clone", "done", 0, True),
        ("edit", "done", 0, True),
        ("run", "done", 0, True),
        ("read", "done", 0, True),
        ("run", "done", 3, False),
    ]
    clone, edit, diff, read, failing = (c["result"] for c in calls)
    assert clone["data"]["path"] == "repos/app"
    assert edit["data"]["replacements"] == 1
    assert "README.md | 2 +-" in diff["output"]
    assert "1 file changed, 1 insertion(+), 1 deletion(-)" in diff["output"]
    assert diff["output"].endswith("# app\nversion two\n")
    assert read["output"] == "# app\nversion two\n"
    assert failing["stderr"] == "failing\n"
    assert {c["connection_id"] for c in calls} == {conn["connection_id"]}
    checkout = h.tmp / "w1" / "work" / "repos" / "app"
    assert (checkout / "README.md").read_text() == "# app\nversion two\n"
    assert (checkout / ".git").is_dir()
    assert (origin / "README.md").read_text() == "# app\nversion one\n"  # a clone, not the origin

    h.sim.admin.end_session(first, "terminated")
    h.wait(lambda: h.released(first), "the claim to be released")
    # It exits 0 on its own or 143 on the worker's SIGTERM, whichever comes first: both end the session.
    h.wait(lambda: not alive(conn["pid"]), "the stand-in to exit")
    assert [r["action"] for r in h.claims(first) if r["action"] != "renew"] == ["claim", "release"]

    second = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
    conn2 = h.connection(second)
    assert (conn2["acceptor_id"], conn2["ppid"]) == (conn["acceptor_id"], worker.pid)
    h.sim.admin.add_calls(second, [tools.run("echo second; pwd")])
    [call] = h.calls_done(second)
    assert (call["result"]["exit_code"], call["result"]["output"]) == (0, f"second\n{conn2['cwd']}\n")
    h.sim.admin.end_session(second, "terminated")
    h.wait(lambda: h.released(second), "the second release")
    h.wait(lambda: not alive(conn2["pid"]), "the second stand-in to exit")

    worker.stop()
    assert worker.proc is not None
    assert worker.proc.returncode == 0
    assert h.token not in worker.log()


# --- 2. the session's environment ---------------------------------------------------------------------


def test_the_stand_in_gets_exactly_the_spawn_contract_environment(harness: Harness) -> None:
    h = harness
    worker = h.worker("w1")
    given = h.env()
    sid = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
    conn = h.connection(sid)
    state_dir = h.tmp / "w1" / "data" / "sessions" / sid
    # Checked while the session runs: the worker removes a terminated session's state dir.
    assert oct(state_dir.stat().st_mode & 0o777) == "0o700"
    h.sim.admin.add_calls(sid, [tools.run("env")])
    [shell] = h.calls_done(sid)
    h.sim.admin.end_session(sid, "terminated")
    h.wait(lambda: h.released(sid), "the release")

    env = conn["env"]
    if sys.platform.startswith("linux"):  # what it was exec'd with, not what Python added on start
        assert conn["env_source"] == "/proc/self/environ"
    assert set(env) == {*REQUIRED, "DEVIN_PTY_BRIDGE_PORT", "DEVIN_CHROME_PATH", *PASSTHROUGH}
    assert {name: env[name] for name in PASSTHROUGH} == {name: given[name] for name in PASSTHROUGH}
    assert env["DEVIN_OUTPOST_SESSION_ID"] == sid
    assert env["DEVIN_OUTPOST_GATEWAY_URL"] == f"ws://{h.sim.url.split('://', 1)[1]}/gateway"
    assert env["DEVIN_REMOTE_STATE_DIR"] == conn["state_dir"] == str(state_dir)
    assert env["DEVIN_CHROME_PATH"] == CHROME
    assert int(env["DEVIN_PTY_BRIDGE_PORT"]) > 0
    assert env["DEVIN_OUTPOST_CONNECT_TOKEN"] == "***"
    # The token it really used is the one the claim issued: the gateway recorded its fingerprint.
    fingerprints = {r["token_fingerprint"] for r in h.claims(sid) if r["action"] in ("claim", "renew")}
    assert conn["token_fingerprint"] in fingerprints
    assert conn["argv"][1:] == ["serve"]  # nothing secret on the command line

    # Neither the account token nor anything else from the worker's environment reached the session:
    # not the stand-in, and not the shell the brain's commands run in.
    report = json.dumps(conn)
    assert h.token not in report
    assert CANARY not in report
    assert shell["result"]["exit_code"] == 0
    shell_env = dict(line.split("=", 1) for line in shell["result"]["output"].splitlines() if "=" in line)
    assert shell_env["DEVIN_OUTPOST_SESSION_ID"] == sid
    assert "DEVIN_OUTPOST_CONNECT_TOKEN" not in shell_env  # the stand-in keeps it from commands
    assert "DEVIN_OUTPOSTS_TOKEN" not in shell_env
    assert h.token not in shell["result"]["output"]
    assert CANARY not in shell["result"]["output"]
    worker.stop()
    assert h.token not in worker.log()


# --- 3. concurrency --------------------------------------------------------------------------------------


def test_three_workers_serve_30_sessions_each_exactly_once(harness: Harness) -> None:
    h = harness
    workers = [h.worker(name, "--max-sessions", "2") for name in ("a", "b", "c")]
    # All three follow the queue before the first session arrives, so they all compete for it.
    notifier = h.sim.runtime.notifier
    assert notifier is not None
    h.wait(lambda: notifier.open_streams >= 3, "three queue watches")
    ledger = h.tmp / "ledger"  # outside every working dir: one line per execution of a scripted command
    sessions = [h.sim.admin.enqueue(h.outpost.outpost_id).session_id for dummy in range(30)]
    for sid in sessions:
        h.sim.admin.add_calls(sid, [tools.run(f"echo {sid} >> {ledger}")])

    ended_at: dict[str, float] = {}

    def end_the_served_ones() -> bool:
        """The brain ends each session as soon as its call's result is in; done once all are released."""
        for sid in sessions:
            if sid not in ended_at and all(c["state"] == "done" for c in h.sim.admin.calls(sid)):
                ended_at[sid] = time.time()
                h.sim.admin.end_session(sid, "terminated")
        return len(ended_at) == len(sessions) and all(h.released(sid) for sid in sessions)

    h.wait(end_the_served_ones, "all 30 sessions served, ended and released", timeout=240)

    assert sorted(ledger.read_text().split()) == sorted(sessions)  # every command ran exactly once
    servers: set[str] = set()
    for sid in sessions:
        [call] = h.sim.admin.calls(sid)
        assert (call["state"], call["attempts"], call["result"]["exit_code"]) == ("done", 1, 0), call
        [conn] = h.sim.admin.connections(sid)  # one gateway connection: one stand-in served it
        assert call["connection_id"] == conn["connection_id"]
        records = h.claims(sid)
        claims = [r for r in records if r["action"] == "claim"]
        # The claim the stand-in's token came from opened the history; its holder served the session.
        assert (claims[0]["acceptor_id"], claims[0]["seq"]) == (conn["acceptor_id"], conn["chain"]), records
        # A worker whose picture of the queue lagged may claim the row after it ended; the claim answer
        # says so and it gives the row back at once, without running anything (no second connection).
        for late in claims[1:]:
            assert late["at"] >= ended_at[sid], records
        holder: Optional[int] = None  # claims never overlap, and every one of them ended in a release
        for record in records:
            if record["action"] == "claim":
                assert holder is None, records
                holder = record["seq"]
            elif record["action"] in ("release", "expire", "tombstone"):
                assert (record["action"], record["chain"]) == ("release", holder), records
                holder = None
        assert holder is None, records
        servers.add(conn["acceptor_id"])
    assert len(servers) == 3  # the work was shared by all three

    for worker in workers:
        worker.stop()
        assert worker.proc is not None
        assert worker.proc.returncode == 0
    assert not pids_working_under(h.tmp)  # no stand-in outlived its worker
