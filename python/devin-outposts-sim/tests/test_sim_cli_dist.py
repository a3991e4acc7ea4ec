"""The simulated distribution of the official Devin CLI: ``/cli/<version>/devin-<platform>[.sha256]``,
its admin API, the stand-in ``devin`` it serves, and the ``sim devin-cli`` verbs."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from sim_support import Cli

from devin_outposts_sim.admin_client import SimAdminError
from devin_outposts_sim.state.cli_dist import PLATFORMS, standin_cli
from devin_outposts_sim.testing import SimHandle, sim_process

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the stand-in devin is a POSIX shell script")


def get(sim: SimHandle, path: str) -> httpx.Response:
    """No Authorization header: the distribution is public, like a CDN."""
    return httpx.get(sim.admin.cli_base_url + path, timeout=10)


def install(tmp_path: Path, content: bytes) -> Path:
    binary = tmp_path / "devin"
    binary.write_bytes(content)
    binary.chmod(0o755)
    return binary


# --- the public files --------------------------------------------------------------------------------


def test_nothing_is_published_out_of_the_box(sim: SimHandle) -> None:
    assert sim.admin.cli_dist()["artifacts"] == []
    response = get(sim, "1.2.3/devin-linux-x64")
    assert response.status_code == 404
    assert response.json() == {"detail": "No such file: 1.2.3/devin-linux-x64"}


@pytest.mark.parametrize("platform", PLATFORMS)
def test_a_published_version_serves_the_stand_in_and_its_sha256(sim: SimHandle, platform: str) -> None:
    artifacts = sim.admin.publish_cli("1.2.3")
    assert [a["platform"] for a in artifacts] == list(PLATFORMS)
    binary = get(sim, f"1.2.3/devin-{platform}")
    assert binary.status_code == 200
    assert binary.headers["content-type"] == "application/octet-stream"
    assert binary.content == standin_cli("1.2.3")
    assert binary.content.startswith(b"#!/bin/sh\n")
    digest = get(sim, f"1.2.3/devin-{platform}.sha256")
    assert digest.status_code == 200
    assert re.fullmatch(r"[0-9a-f]{64}\n", digest.text)  # the hex digest only, one line
    assert digest.text.strip() == hashlib.sha256(binary.content).hexdigest()


def test_versions_differ_and_a_republish_replaces(sim: SimHandle) -> None:
    sim.admin.publish_cli("1.2.3")
    sim.admin.publish_cli("1.3.0")
    assert get(sim, "1.2.3/devin-linux-x64").content != get(sim, "1.3.0/devin-linux-x64").content
    sim.admin.publish_cli("1.2.3", content=b"#!/bin/sh\necho replaced\n", platforms=["linux-x64"])
    assert get(sim, "1.2.3/devin-linux-x64").content == b"#!/bin/sh\necho replaced\n"
    assert get(sim, "1.2.3/devin-linux-arm64").content == standin_cli("1.2.3")
    state = sim.admin.cli_dist()
    assert state["prefix"] == "/cli/"
    assert {(a["version"], a["platform"]) for a in state["artifacts"]} == {
        (v, p) for v in ("1.2.3", "1.3.0") for p in PLATFORMS
    }


def test_custom_content_for_some_platforms_only(sim: SimHandle) -> None:
    sim.admin.publish_cli("2.0.0", content=b"binary bytes", platforms=["linux-arm64"])
    assert get(sim, "2.0.0/devin-linux-arm64").content == b"binary bytes"
    assert (
        get(sim, "2.0.0/devin-linux-arm64.sha256").text.strip() == hashlib.sha256(b"binary bytes").hexdigest()
    )
    assert get(sim, "2.0.0/devin-linux-x64").status_code == 404
    assert get(sim, "2.0.0/devin-linux-x64.sha256").status_code == 404


def test_a_tampered_artifact_serves_a_sha256_that_does_not_match(sim: SimHandle) -> None:
    (artifact,) = sim.admin.publish_cli("9.9.9", platforms=["linux-x64"], tampered=True)
    assert artifact["tampered"] is True
    body = get(sim, "9.9.9/devin-linux-x64").content
    served = get(sim, "9.9.9/devin-linux-x64.sha256").text.strip()
    assert re.fullmatch(r"[0-9a-f]{64}", served)
    assert served != hashlib.sha256(body).hexdigest()
    assert artifact["sha256"] == hashlib.sha256(body).hexdigest()
    assert artifact["published_sha256"] == served


def test_a_windows_build_is_served_with_exe_and_only_when_named(sim: SimHandle) -> None:
    artifacts = sim.admin.publish_cli("1.2.3")
    assert "windows-x64" not in [a["platform"] for a in artifacts]  # the shell stand-in is no Windows build
    (artifact,) = sim.admin.publish_cli("1.2.3", content=b"MZ exe bytes", platforms=["windows-x64"])
    assert artifact["path"] == "1.2.3/devin-windows-x64.exe"
    assert get(sim, "1.2.3/devin-windows-x64.exe").content == b"MZ exe bytes"
    digest = get(sim, "1.2.3/devin-windows-x64.exe.sha256").text.strip()
    assert digest == hashlib.sha256(b"MZ exe bytes").hexdigest()
    assert "windows-x64" in sim.admin.cli_dist()["platforms"]
    # The Linux names stay without .exe, and the Windows one needs it.
    assert get(sim, "1.2.3/devin-linux-x64.exe").status_code == 404
    assert get(sim, "1.2.3/devin-windows-x64").status_code == 404


def test_a_tampered_windows_build(sim: SimHandle) -> None:
    (artifact,) = sim.admin.publish_cli("9.9.9", content=b"MZ", platforms=["windows-x64"], tampered=True)
    assert artifact["tampered"] is True
    assert get(sim, "9.9.9/devin-windows-x64.exe.sha256").text.strip() == artifact["published_sha256"]


@pytest.mark.parametrize(
    "path",
    ["1.2.3/devin-windows-x64", "1.2.3/devin", "1.2.3/devin-linux-x64.md5", "1.2.3/other", "1.2.3",
     "1.2.3/devin-linux-x64.exe.sha256"],
)  # fmt: skip
def test_other_names_are_404(sim: SimHandle, path: str) -> None:
    sim.admin.publish_cli("1.2.3")
    response = get(sim, path)
    assert response.status_code == 404
    assert "detail" in response.json()


# --- the admin API -----------------------------------------------------------------------------------


def test_the_admin_routes_need_the_admin_token(sim: SimHandle) -> None:
    for method, path in (("GET", "/_sim/cli"), ("POST", "/_sim/cli/artifacts")):
        response = httpx.request(method, sim.url + path, json={"version": "1.2.3"}, timeout=10)
        assert response.status_code == 401, (method, path)
    assert sim.admin.cli_dist()["artifacts"] == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"version": "latest"}, "version must be a pinned version"),
        ({"version": "stable"}, "version must be a pinned version"),
        ({"version": ""}, "version must be a pinned version"),
        ({"version": "1.2/3"}, "version must be a pinned version"),
        ({}, "version must be a pinned version"),
        ({"version": "1.2.3", "platforms": ["windows-arm64"]}, "platforms must be"),
        ({"version": "1.2.3", "platforms": ["windows-x64"]}, "a windows platform needs content"),
        ({"version": "1.2.3", "platforms": []}, "platforms must be"),
        ({"version": "1.2.3", "content_b64": "not base64!"}, "not valid base64"),
        ({"version": "1.2.3", "published_sha256": "abc"}, "64 lowercase hex"),
        ({"version": "1.2.3", "tampered": "yes"}, "tampered must be"),
        ({"version": "1.2.3", "tampered": True, "published_sha256": "0" * 64}, "at most one of"),
    ],
)
def test_invalid_publications_are_422_and_publish_nothing(
    sim: SimHandle, body: dict[str, Any], message: str
) -> None:
    response = httpx.post(
        sim.url + "/_sim/cli/artifacts",
        json=body,
        headers={"Authorization": f"Bearer {sim.admin_token}"},
        timeout=10,
    )
    assert response.status_code == 422
    assert message in response.json()["detail"]
    assert sim.admin.cli_dist()["artifacts"] == []


def test_the_admin_client_names_the_operation_on_failure(sim: SimHandle) -> None:
    with pytest.raises(SimAdminError, match=r"Could not publish the devin CLI latest: 422 version must"):
        sim.admin.publish_cli("latest")


def test_a_reset_wipes_the_cli_artifacts(sim: SimHandle) -> None:
    sim.admin.publish_cli("1.2.3")
    sim.admin.reset()
    assert sim.admin.cli_dist()["artifacts"] == []
    assert get(sim, "1.2.3/devin-linux-x64").status_code == 404


def test_artifacts_survive_a_restart(tmp_path: Path) -> None:
    with sim_process(tmp_path / "sim.db") as proc:
        proc.admin.publish_cli("1.2.3", platforms=["linux-x64"])
        before = httpx.get(proc.admin.cli_base_url + "1.2.3/devin-linux-x64", timeout=10).content
        proc.restart()
        after = httpx.get(proc.admin.cli_base_url + "1.2.3/devin-linux-x64", timeout=10)
        assert after.status_code == 200
        assert after.content == before == standin_cli("1.2.3")


# --- the stand-in devin, run for real ----------------------------------------------------------------


def run(binary: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize("flag", ["--version", "-V", "version"])
def test_the_stand_in_prints_its_version(sim: SimHandle, tmp_path: Path, flag: str) -> None:
    sim.admin.publish_cli("1.2.3", platforms=["linux-x64"])
    binary = install(tmp_path, get(sim, "1.2.3/devin-linux-x64").content)
    result = run(binary, flag)
    assert (result.returncode, result.stdout, result.stderr) == (0, "devin 1.2.3\n", "")


def test_the_stand_in_worker_start_says_it_is_a_stand_in(tmp_path: Path) -> None:
    binary = install(tmp_path, standin_cli("2.0.1"))
    once = run(binary, "worker", "start", "--outpost", "rhel", "--once")
    assert once.returncode == 0
    assert "devin 2.0.1: stand-in for 'devin worker start'" in once.stdout
    assert "serves no sessions" in once.stdout


def test_the_stand_in_worker_start_runs_until_sigterm(tmp_path: Path) -> None:
    binary = install(tmp_path, standin_cli("2.0.1"))
    with subprocess.Popen(
        [str(binary), "worker", "start"], stdout=subprocess.PIPE, text=True, env={**os.environ}
    ) as proc:
        assert proc.stdout is not None
        assert "stand-in for 'devin worker start'" in proc.stdout.readline()
        assert proc.poll() is None  # still running: it waits for a signal, like a worker
        proc.terminate()
        assert proc.wait(timeout=30) == 0
        assert "stopping" in proc.stdout.read()


@pytest.mark.parametrize("args", [(), ("worker",), ("worker", "stop"), ("login",)])
def test_the_stand_in_refuses_anything_else_with_exit_2(tmp_path: Path, args: tuple[str, ...]) -> None:
    result = run(install(tmp_path, standin_cli("1.2.3")), *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "stand-in" in result.stderr


# --- the sim devin-cli verbs -------------------------------------------------------------------------


@pytest.fixture
def sim_cli(cli: Cli) -> Cli:
    """``sim_cli(*argv)``: ``devin-outposts-sim devin-cli <argv>`` (``cli`` of conftest.py)."""
    return functools.partial(cli, "devin-cli")


def test_publish_and_show_verbs(sim: SimHandle, sim_cli: Cli, tmp_path: Path) -> None:
    published = sim_cli("publish", "1.2.3", "--platform", "linux-x64")
    digest = hashlib.sha256(standin_cli("1.2.3")).hexdigest()
    assert (published.code, published.out, published.err) == (0, f"1.2.3/devin-linux-x64\t{digest}\n", "")

    payload = tmp_path / "devin"
    payload.write_bytes(b"custom")
    assert sim_cli("publish", "1.4.0", "--file", str(payload), "--platform", "linux-arm64").code == 0
    assert get(sim, "1.4.0/devin-linux-arm64").content == b"custom"
    assert sim_cli("publish", "9.9.9", "--tampered", "--platform", "linux-x64").code == 0

    shown = sim_cli("show")
    assert shown.code == 0
    assert shown.out.splitlines()[0] == f"base URL: {sim.url}/cli/"
    assert f"1.2.3/devin-linux-x64\t{len(standin_cli('1.2.3'))}\t{digest}" in shown.out
    assert re.search(r"^9\.9\.9/devin-linux-x64\t\d+\t[0-9a-f]{64}\ttampered$", shown.out, re.MULTILINE)

    as_json = json.loads(sim_cli("show", "--json").out)
    assert as_json["base_url"] == f"{sim.url}/cli/"
    assert [a["path"] for a in as_json["artifacts"]] == [
        "1.2.3/devin-linux-x64",
        "1.4.0/devin-linux-arm64",
        "9.9.9/devin-linux-x64",
    ]


def test_publish_verb_refuses_an_unpinned_version(sim: SimHandle, sim_cli: Cli) -> None:
    result = sim_cli("publish", "latest")
    assert result.code != 0
    assert result.out == ""
    assert "version must be a pinned version" in result.err
    assert sim.admin.cli_dist()["artifacts"] == []
