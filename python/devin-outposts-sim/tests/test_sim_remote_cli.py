"""``devin-outposts-sim call|calls|connections|end|dist ...`` against a running simulator."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
from sim_support import Cli

from devin_outposts.api.models import Outpost
from devin_outposts_sim.state.dist import builtin_sha
from devin_outposts_sim.testing import SimHandle, claim_session, standin_process


def test_call_scripts_calls_in_argv_order(sim: SimHandle, cli: Cli, outpost: Outpost, tmp_path: Path) -> None:
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    extra = tmp_path / "calls.json"
    extra.write_text(json.dumps([{"tool": "read", "path": "b.txt"}]))
    result = cli(
        "call", sid, "--write", "a.txt", "one", "--edit", "a.txt", "one", "two", "--run", "cat a.txt",
        "--read", "a.txt", "--clone", "/srv/app", "--calls-file", str(extra),
    )  # fmt: skip
    assert (result.code, result.err) == (0, "")
    ids = result.out.split()
    calls = sim.admin.calls(sid)
    assert ids == [c["id"] for c in calls]
    assert [c["tool"] for c in calls] == ["write", "edit", "run", "read", "git_clone", "read"]
    assert calls[1]["args"] == {"path": "a.txt", "old": "one", "new": "two"}


def test_calls_connections_and_end_with_a_running_stand_in(
    sim: SimHandle, cli: Cli, outpost: Outpost, machine_token: str, tmp_path: Path
) -> None:
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    claimed = claim_session(sim.url, machine_token, sid)
    with standin_process(tmp_path, claimed, state_dir=tmp_path / "state") as remote:
        assert cli("call", sid, "--run", "echo hello; exit 4").code == 0
        result = cli("calls", sid, "--wait", "30")
        assert result.code == 0
        lines = result.out.splitlines()
        assert lines[0].split("\t")[1:] == ["run", "done", "4"]
        assert lines[1] == "    output: hello"
        assert json.loads(cli("calls", sid, "--json").out)[0]["result"]["exit_code"] == 4
        result = cli("connections", sid, "--wait", "10")
        assert result.out.split("\t")[1] == str(remote.pid)
        env = json.loads(cli("connections", sid, "--json").out)[0]["env"]
        assert env["DEVIN_OUTPOST_CONNECT_TOKEN"] == "***"
        assert cli("end", sid, "--status", "suspended").out.strip() == f"{sid} suspended"
        assert remote.wait(20) == 0


def test_dist_show_publish_and_set_latest(sim: SimHandle, cli: Cli, tmp_path: Path) -> None:
    result = cli("dist", "show")
    assert result.code == 0
    assert f"latest_linux_x64\t{builtin_sha()}" in result.out
    assert sim.static_base_url in result.out
    artifact = tmp_path / "remote"
    artifact.write_bytes(b"#!/bin/sh\necho v9\n")
    sha = cli("dist", "publish", str(artifact), "--suffix", "linux_x64", "--latest").out.strip()
    assert httpx.get(f"{sim.static_base_url}latest_linux_x64").text.strip() == sha
    assert httpx.get(f"{sim.static_base_url}latest_linux_arm64").text.strip() == builtin_sha()
    bad = cli("dist", "publish", str(artifact), "--sha", "bad0001", "--tampered").out.strip()
    digest = httpx.get(f"{sim.static_base_url}devin-remote_{bad}_linux_x64.sha256").text.strip()
    assert digest != hashlib.sha256(artifact.read_bytes()).hexdigest()
    assert cli("dist", "set-latest", builtin_sha()).code == 0
    assert httpx.get(f"{sim.static_base_url}latest_linux_x64").text.strip() == builtin_sha()
    assert "tampered" in cli("dist", "show").out


def test_failures_exit_non_zero_with_one_line(sim: SimHandle, cli: Cli, outpost: Outpost) -> None:
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    result = cli("call", sid)
    assert (result.code, len(result.err.splitlines())) == (2, 1)
    result = cli("call", "devin-nope", "--read", "x")
    assert (result.code, len(result.err.splitlines())) == (4, 1)
    assert cli("dist", "set-latest", "0badc0de").code == 2
    sim.admin.add_calls(sid, [{"tool": "read", "path": "x"}])
    result = cli("calls", sid, "--wait", "0.2")  # nobody serves it
    assert result.code == 1
    assert "not done" in result.err
