"""The simulated ``devin-remote`` distribution (docs/fleet-api.md §8): ``latest_<suffix>``, artifacts,
``.sha256``."""

from __future__ import annotations

import hashlib
import re

import httpx
import pytest

from devin_outposts_sim.admin_client import SimAdminError
from devin_outposts_sim.state.dist import SUFFIXES, builtin_sha, standin_bytes, version_id
from devin_outposts_sim.testing import SimHandle


def get(sim: SimHandle, name: str) -> httpx.Response:
    """No Authorization header: the distribution is a public CDN."""
    return httpx.get(sim.static_base_url + name, timeout=10)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_latest_names_the_builtin_stand_in_and_its_bytes_match_the_sha256(
    sim: SimHandle, suffix: str
) -> None:
    latest = get(sim, f"latest_{suffix}")
    assert latest.status_code == 200
    sha = latest.text.strip()
    assert re.fullmatch(r"[0-9a-f]{6,40}", sha)
    assert sha == builtin_sha() == version_id(standin_bytes())
    binary = get(sim, f"devin-remote_{sha}_{suffix}")
    assert binary.status_code == 200
    assert binary.headers["content-type"] == "application/octet-stream"
    assert binary.content == standin_bytes()
    assert binary.content.startswith(b"#!/usr/bin/env python3\n")
    digest = get(sim, f"devin-remote_{sha}_{suffix}.sha256").text
    assert re.fullmatch(r"[0-9a-f]{64}\n", digest)  # the hex digest only
    assert digest.strip() == hashlib.sha256(binary.content).hexdigest()


def test_the_windows_latest_file_answers_with_and_without_exe(sim: SimHandle) -> None:
    assert (
        get(sim, "latest_windows_x64.exe").text == get(sim, "latest_windows_x64").text == builtin_sha() + "\n"
    )


def test_published_versions_and_latest(sim: SimHandle) -> None:
    v2 = sim.admin.publish_standin_variant("v2")
    assert v2 != builtin_sha()
    assert get(sim, "latest_linux_x64").text.strip() == builtin_sha()  # publishing alone changes nothing
    body = get(sim, f"devin-remote_{v2}_linux_x64").content
    assert version_id(body) == v2
    assert get(sim, f"devin-remote_{v2}_linux_x64.sha256").text.strip() == hashlib.sha256(body).hexdigest()
    assert sim.admin.set_latest(v2, suffixes=["linux_x64"])["linux_x64"] == v2
    assert get(sim, "latest_linux_x64").text.strip() == v2
    assert get(sim, "latest_linux_arm64").text.strip() == builtin_sha()

    custom = sim.admin.publish_remote(
        b"#!/bin/sh\nexit 7\n", sha="abc1234", suffixes=["macos_arm64"], latest=True
    )
    assert custom == "abc1234"
    assert get(sim, "latest_macos_arm64").text.strip() == "abc1234"
    assert get(sim, "devin-remote_abc1234_macos_arm64").content == b"#!/bin/sh\nexit 7\n"
    assert get(sim, "devin-remote_abc1234_linux_x64").status_code == 404  # only the suffix published

    state = sim.admin.dist()
    assert state["builtin_sha"] == builtin_sha()
    assert state["latest"]["linux_x64"] == v2
    names = {item["name"] for item in state["artifacts"]}
    assert f"devin-remote_{builtin_sha()}_windows_x64.exe" in names
    assert "devin-remote_abc1234_macos_arm64" in names


def test_a_tampered_artifact_does_not_match_its_sha256(sim: SimHandle) -> None:
    sha = sim.admin.publish_tampered()
    for suffix in SUFFIXES:
        body = get(sim, f"devin-remote_{sha}_{suffix}").content
        published = get(sim, f"devin-remote_{sha}_{suffix}.sha256").text.strip()
        assert re.fullmatch(r"[0-9a-f]{64}", published)
        assert hashlib.sha256(body).hexdigest() != published
    item = next(a for a in sim.admin.dist()["artifacts"] if a["sha"] == sha)
    assert item["tampered"] is True


@pytest.mark.parametrize(
    "name",
    [
        "latest_linux_x86",
        "latest_",
        "devin-remote_0000000_linux_x64",
        "devin-remote_0000000_linux_x64.sha256",
        "devin-remote_XYZ_linux_x64",
        "devin-remote_{builtin}_solaris",
        "devin-remote_{builtin}_linux_x64.md5",
        "index.html",
    ],
)
def test_unknown_files_are_404_with_a_detail(sim: SimHandle, name: str) -> None:
    response = get(sim, name.format(builtin=builtin_sha()))
    assert response.status_code == 404
    assert "detail" in response.json()


def test_latest_must_name_a_published_sha_unless_unchecked(sim: SimHandle) -> None:
    with pytest.raises(SimAdminError) as raised:
        sim.admin.set_latest("deadbeef")
    assert raised.value.status == 422
    sim.admin.set_latest("not-a-sha!", suffixes=["linux_x64"], check=False)  # to test a client's validation
    assert get(sim, "latest_linux_x64").text.strip() == "not-a-sha!"


def test_publish_validation(sim: SimHandle) -> None:
    for kwargs in ({"sha": "XYZ"}, {"suffixes": ["linux_x86"]}, {"published_sha256": "abc"}):
        with pytest.raises(SimAdminError) as raised:
            sim.admin.publish_remote(b"x", **kwargs)  # type: ignore[arg-type]
        assert raised.value.status == 422


def test_reset_forgets_published_artifacts(sim: SimHandle) -> None:
    sha = sim.admin.publish_standin_variant("gone", latest=True)
    sim.admin.reset()
    assert get(sim, f"devin-remote_{sha}_linux_x64").status_code == 404
    assert get(sim, "latest_linux_x64").text.strip() == builtin_sha()
