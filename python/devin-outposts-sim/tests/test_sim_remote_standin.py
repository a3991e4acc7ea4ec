"""The stand-in ``devin-remote``, run for real as a subprocess against the simulator with a real claim.

The main test downloads it from the simulator's distribution the way a worker does (``latest_<suffix>``,
the binary, its ``.sha256``), makes it executable and runs it through its shebang with exactly the
spawn-contract environment. Every process a test starts is stopped by that test (``standin_process``
stops the stand-in at the end of its block).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from devin_outposts.api.models import Outpost, QueueEntry
from devin_outposts_sim.remote import standin_path, tools
from devin_outposts_sim.state.dist import builtin_sha
from devin_outposts_sim.testing import (
    SimHandle,
    claim_session,
    sim_process,
    standin_env,
    standin_process,
)
from devin_outposts_sim.testing.remote import PASSTHROUGH

SPAWN_VARS = {
    "DEVIN_OUTPOST_GATEWAY_URL",
    "DEVIN_OUTPOST_CONNECT_TOKEN",
    "DEVIN_OUTPOST_SESSION_ID",
    "DEVIN_REMOTE_STATE_DIR",
}


@pytest.fixture
def claimed(sim: SimHandle, outpost: Outpost, machine_token: str) -> QueueEntry:
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    return claim_session(sim.url, machine_token, sid, "worker-1")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


def make_repo(path: Path) -> Path:
    """A git repository with one commit, made the way a test would (``git init`` + commit)."""
    path.mkdir(parents=True)
    (path / "README.md").write_text("# app\nversion one\n")
    git = [
        "git",
        "-c",
        "user.name=test",
        "-c",
        "user.email=test@example.com",
        "-c",
        "init.defaultBranch=main",
    ]
    for args in (["init", "-q"], ["add", "README.md"], ["commit", "-q", "-m", "first"]):
        subprocess.run([*git, *args], cwd=path, check=True, capture_output=True)
    return path


def download(sim: SimHandle, into: Path, suffix: str = "linux_x64") -> tuple[Path, str]:
    """What a worker does: latest SHA, the binary, verify its .sha256, chmod +x."""
    sha = httpx.get(f"{sim.static_base_url}latest_{suffix}").text.strip()
    name = f"devin-remote_{sha}_{suffix}"
    body = httpx.get(sim.static_base_url + name).content
    assert hashlib.sha256(body).hexdigest() == httpx.get(f"{sim.static_base_url}{name}.sha256").text.strip()
    into.mkdir(parents=True, exist_ok=True)
    binary = into / "devin-remote"
    binary.write_bytes(body)
    binary.chmod(0o755)
    return binary, sha


def by_tool(calls: list[dict[str, Any]]) -> list[tuple[str, int, bool]]:
    return [(c["tool"], c["result"]["exit_code"], c["result"]["ok"]) for c in calls]


def test_the_downloaded_stand_in_runs_every_tool_and_exits_0_when_terminated(
    sim: SimHandle, claimed: QueueEntry, workdir: Path, tmp_path: Path
) -> None:
    # A build whose shebang names this interpreter: a launcher (a pyenv shim behind /usr/bin/env) would
    # add variables of its own to the environment under test.
    published = sim.admin.publish_standin_variant("exact-env", python=sys.executable, latest=True)
    binary, sha = download(sim, tmp_path / "cache")
    assert sha == published
    repo = make_repo(tmp_path / "origin" / "app")
    state = tmp_path / "state"
    sid = claimed.session_id
    with standin_process(workdir, claimed, state_dir=state, binary=binary) as remote:
        conn = sim.admin.wait_connection(sid, timeout=20)
        assert sim.admin.session(sid)["entry"]["status"]["session_status"] == "running"
        sim.admin.add_calls(
            sid,
            [
                tools.git_clone(str(repo)),
                tools.git_clone(repo.as_uri()),  # already there: reused
                tools.edit("repos/app/README.md", "version one", "version two"),
                tools.edit("repos/app/README.md", "not in the file", "x"),
                tools.run("git status --porcelain && cat README.md", cwd="repos/app"),
                tools.write("out/notes.txt", "héllo\n"),
                tools.read("out/notes.txt"),
                tools.run(["sh", "-c", "echo to-stderr >&2; exit 3"]),
                tools.run("echo $DEVIN_OUTPOST_CONNECT_TOKEN; sleep 30", timeout=0.3),
            ],
        )
        calls = sim.admin.wait_calls(sid, timeout=60)
        sim.admin.end_session(sid, "terminated")
        assert remote.wait(20) == 0
    assert by_tool(calls) == [
        ("git_clone", 0, True),
        ("git_clone", 0, True),
        ("edit", 0, True),
        ("edit", 1, False),
        ("run", 0, True),
        ("write", 0, True),
        ("read", 0, True),
        ("run", 3, False),
        ("run", 124, False),
    ]
    clone, reuse, edit, missing, status, _write, read, failing, slow = (c["result"] for c in calls)
    assert (clone["data"]["path"], clone["data"]["reused"], reuse["data"]["reused"]) == (
        "repos/app",
        False,
        True,
    )
    assert (workdir / "repos" / "app" / ".git").is_dir()
    assert edit["data"]["replacements"] == 1
    assert "not in" in missing["error"]
    assert status["output"] == " M README.md\n# app\nversion two\n"
    assert read["output"] == "héllo\n"
    assert (failing["stderr"], failing["output"]) == ("to-stderr\n", "")
    assert slow["data"]["timed_out"] is True
    assert claimed.connect_token_value() not in slow["output"]  # commands do not get the connect token
    assert all(c["state"] == "done" and c["delivered_at"] <= c["completed_at"] for c in calls)

    # What it reported on connect: its version, pid, cwd and exactly the environment it was given.
    assert conn["version"] == sha
    assert conn["pid"] == remote.pid
    assert Path(conn["cwd"]) == workdir.resolve()
    assert conn["state_dir"] == str(state)
    assert conn["env"]["DEVIN_OUTPOST_CONNECT_TOKEN"] == "***"
    assert conn["env"]["DEVIN_OUTPOST_SESSION_ID"] == sid
    if sys.platform.startswith("linux"):  # what it was exec'd with, not what Python added (LC_CTYPE)
        assert conn["env_source"] == "/proc/self/environ"
    assert set(conn["env"]) <= SPAWN_VARS | set(PASSTHROUGH)
    assert claimed.connect_token_value() not in json.dumps(conn)

    saved = json.loads((state / "state.json").read_text())
    assert (saved["phase"], saved["exit_code"], saved["calls_done"]) == ("ended", 0, len(calls))
    assert len((state / "calls.jsonl").read_text().splitlines()) == len(calls)
    assert oct(state.stat().st_mode & 0o777) == "0o700"
    assert "terminated" in remote.stdout


def test_suspended_also_exits_0(sim: SimHandle, claimed: QueueEntry, workdir: Path, tmp_path: Path) -> None:
    with standin_process(workdir, claimed, state_dir=tmp_path / "state") as remote:
        conn = sim.admin.wait_connection(claimed.session_id, timeout=20)
        assert conn["version"] == builtin_sha()  # run from the package source, it reports the served SHA
        sim.admin.end_session(claimed.session_id, "suspended")
        assert remote.wait(20) == 0


@pytest.mark.parametrize("missing", sorted(SPAWN_VARS - {"DEVIN_REMOTE_STATE_DIR"}))
def test_a_missing_spawn_variable_exits_2_with_one_line(
    claimed: QueueEntry, workdir: Path, missing: str
) -> None:
    env = standin_env(claimed)
    del env[missing]
    with standin_process(workdir, env=env) as remote:
        assert remote.wait(20) == 2
    [line] = remote.stderr.splitlines()
    assert missing in line
    assert claimed.connect_token_value() not in line


def test_usage_errors_exit_2(workdir: Path) -> None:
    for argv in ([], ["serve", "extra"], ["start"]):
        done = subprocess.run(
            [sys.executable, str(standin_path()), *argv],
            check=False,
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 2
        assert "usage" in done.stderr


def test_hostile_paths_are_rejected(
    sim: SimHandle, claimed: QueueEntry, workdir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    (workdir / "link").symlink_to(outside)
    (workdir / "inside.txt").write_text("mine\n")
    repo = make_repo(tmp_path / "origin" / "app")
    hostile = [
        tools.read("../outside/secret.txt"),
        tools.read(str(outside / "secret.txt")),
        tools.read("link/secret.txt"),
        tools.write("../outside/new.txt", "x"),
        tools.write("link/new.txt", "x"),
        tools.write("/tmp/../" + str(outside / "abs.txt").lstrip("/"), "x"),  # noqa: S108
        tools.edit("../outside/secret.txt", "secret", "gone"),
        tools.run("touch escaped", cwd=".."),
        tools.git_clone(str(repo), name=".."),
        tools.git_clone(str(repo), name="a/../../x"),
        tools.git_clone("https://example.invalid/app.git"),
        tools.git_clone(str(tmp_path / "no-such-repo")),
    ]
    allowed = [tools.read(str(workdir / "inside.txt")), tools.read("./sub/../inside.txt")]
    with standin_process(workdir, claimed, state_dir=tmp_path / "state") as remote:
        sim.admin.add_calls(claimed.session_id, hostile + allowed)
        calls = sim.admin.wait_calls(claimed.session_id, timeout=60)
        sim.admin.end_session(claimed.session_id)
        assert remote.wait(20) == 0
    for call in calls[: len(hostile)]:
        assert (call["result"]["exit_code"], call["result"]["ok"]) == (1, False), call
        assert call["result"]["error"]
    assert "outside the working directory" in calls[0]["result"]["error"]
    assert "local repositories" in calls[10]["result"]["error"]
    assert [c["result"]["output"] for c in calls[len(hostile) :]] == ["mine\n", "mine\n"]
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "secret\n"
    assert not (tmp_path / "escaped").exists()
    assert not (tmp_path / "x").exists()


def test_sigterm_exits_143_and_stops_the_running_command(
    sim: SimHandle, claimed: QueueEntry, workdir: Path, tmp_path: Path, wait_until: Callable[..., Any]
) -> None:
    with standin_process(workdir, claimed, state_dir=tmp_path / "state") as remote:
        sim.admin.add_calls(claimed.session_id, [tools.run("echo $$ > cmd.pid; exec sleep 60", timeout=120)])
        wait_until(lambda: (workdir / "cmd.pid").exists() and (workdir / "cmd.pid").read_text().strip())
        command = int((workdir / "cmd.pid").read_text())
        os.kill(remote.pid, signal.SIGTERM)
        assert remote.wait(20) == 143
    assert "SIGTERM" in remote.stderr
    assert wait_until(lambda: not _alive(command))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes (its parent, the stand-in, is gone and init reaps it).
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def test_a_rejected_token_exits_3(
    sim: SimHandle, claimed: QueueEntry, machine_token: str, workdir: Path, tmp_path: Path
) -> None:
    def release() -> None:
        response = httpx.post(
            f"{sim.url}/opbeta/outposts/devins/{claimed.session_id}/release",
            json={"acceptor_id": "worker-1"},
            headers={"Authorization": f"Bearer {machine_token}"},
        )
        assert response.status_code == 200

    # Released while it is connected and waiting: the long poll wakes and the next request is refused.
    with standin_process(workdir, claimed, state_dir=tmp_path / "state") as remote:
        sim.admin.wait_connection(claimed.session_id, timeout=20)
        release()
        assert remote.wait(20) == 3
    assert "rejected the connect token (401 Invalid connect token)" in remote.stderr
    assert claimed.connect_token_value() not in remote.stderr + remote.stdout
    # A stale token from the start.
    with standin_process(workdir, claimed, state_dir=tmp_path / "state2") as remote:
        assert remote.wait(20) == 3


def test_an_unreachable_gateway_exits_4_after_the_retry_window(claimed: QueueEntry, workdir: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there once the socket is closed
    env = standin_env(
        claimed,
        extra={
            "DEVIN_OUTPOST_GATEWAY_URL": f"ws://127.0.0.1:{port}/gateway",
            "DEVIN_STANDIN_RETRY_SECONDS": "0.5",
        },
    )
    with standin_process(workdir, env=env) as remote:
        assert remote.wait(20) == 4
    assert "unreachable" in remote.stderr


def test_a_second_stand_in_for_the_session_supersedes_the_first(
    sim: SimHandle, claimed: QueueEntry, workdir: Path, tmp_path: Path
) -> None:
    sid = claimed.session_id
    with standin_process(workdir, claimed, state_dir=tmp_path / "s1") as first:
        sim.admin.wait_connection(sid, timeout=20)
        with standin_process(workdir, claimed, state_dir=tmp_path / "s2") as second:
            sim.admin.wait_connection(sid, count=2, timeout=20)
            sim.admin.add_calls(sid, [tools.run("true")])  # wakes the first one's poll: 409
            assert first.wait(20) == 5
            [call] = sim.admin.wait_calls(sid, timeout=30)
            assert call["connection_id"] == sim.admin.connections(sid)[-1]["connection_id"]
            sim.admin.end_session(sid)
            assert second.wait(20) == 0
    assert "newer connection" in first.stderr


def test_the_stand_in_rides_out_a_simulator_restart(tmp_path: Path, workdir: Path) -> None:
    with sim_process(tmp_path / "sim.db", sweep_interval=0.05) as proc:
        token = proc.create_token("machine")
        sid = proc.admin.enqueue(proc.admin.create_outpost("rhel", "linux").outpost_id).session_id
        claimed = claim_session(proc.url, token, sid, "worker-1")
        published = proc.admin.publish_standin_variant("kept", latest=True)
        with standin_process(workdir, claimed, state_dir=tmp_path / "state") as remote:
            proc.admin.wait_connection(sid, timeout=20)
            proc.restart()  # the open long poll ends; the stand-in retries until the simulator is back
            proc.admin.add_calls(sid, [tools.write("after-restart.txt", "ok")])
            [call] = proc.admin.wait_calls(sid, timeout=60)
            proc.admin.end_session(sid)
            assert remote.wait(20) == 0
        assert call["result"]["ok"] is True
        assert (workdir / "after-restart.txt").read_text() == "ok"
        assert len(proc.admin.connections(sid)) == 1  # the same connection, persisted
        assert httpx.get(f"{proc.static_base_url}latest_linux_x64").text.strip() == published  # persisted


def test_the_builtin_build_runs_through_its_env_shebang(sim: SimHandle, tmp_path: Path) -> None:
    binary, sha = download(sim, tmp_path / "cache")
    assert binary.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    done = subprocess.run(
        [str(binary), "version"], capture_output=True, text=True, timeout=30, check=False
    )
    assert (done.returncode, done.stdout.split()[-1]) == (0, sha)


def test_a_stop_signal_that_comes_while_a_command_is_spawned_still_kills_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM right after the fork, before the stand-in waits on the command (a loaded machine widens that
    moment): the stand-in must still kill the command on its way out, never leave it running."""
    from devin_outposts_sim.remote import standin

    spawned: list[int] = []
    real_popen = subprocess.Popen

    def popen_then_signal(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = real_popen(*args, **kwargs)
        spawned.append(proc.pid)
        standin._on_signal(signal.SIGTERM, None)  # what the handler does when the signal lands here
        return proc

    monkeypatch.setattr(standin.subprocess, "Popen", popen_then_signal)
    with pytest.raises(standin.Stop):
        standin.execute("exec sleep 60", cwd=str(tmp_path), timeout=120, state_dir=str(tmp_path))
    assert spawned, "the command was never spawned"
    assert not _alive(spawned[0]), "the command outlived the stop"
