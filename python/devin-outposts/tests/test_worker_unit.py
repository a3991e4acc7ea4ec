"""Unit tests of the worker's building blocks: config, identity, paths, binaries, env, backoff, queue.

No simulator here: binaries come from a loopback distribution server and sessions from an in-memory
fleet (``worker_fakes``), so each test is fast and pins one rule of ``docs/worker.md``.
"""

from __future__ import annotations

import asyncio
import os
import random
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from devin_outposts.api.models import QueueEntry, WatchEvent
from devin_outposts.core import platform, processes
from devin_outposts.core.claiming import CONFLICT_PAUSE, CONFLICT_PAUSE_CAP, ClaimLoop, conflict_pause
from devin_outposts.core.config import ConfigError, parse_metrics_addr
from devin_outposts.core.feed import Backoff, QueueFeed, oldest_first
from devin_outposts.core.identity import (
    FileLock,
    LockedError,
    load_or_create_acceptor_id,
)
from devin_outposts.core.metrics import Metrics
from devin_outposts.core.paths import UnsafePathError, child_dir, safe_component
from devin_outposts.core.pool import SessionPool
from devin_outposts.worker import spawn
from devin_outposts.worker.binary import (
    BinaryError,
    BinaryStore,
    UnsupportedPlatform,
    VerificationError,
    parse_digest,
    platform_suffix,
)
from devin_outposts.worker.options import WorkerConfig, parse_start_args
from devin_outposts.worker.session import (
    FAILED,
    LOST,
    SERVED,
    SessionResult,
    SessionServer,
    WorkerHost,
    renew_delay,
)

from worker_fakes import SUFFIX, DistServer, FakeFleet, FakeRemote, sha256_hex

TOKEN = "cog_unit_account_token_do_not_leak"
CONNECT = "ct_unit_connect_token"
BASE_ENV = {"DEVIN_OUTPOSTS_TOKEN": TOKEN}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- config ---------------------------------------------------------------------------------------


def test_config_defaults_match_devin_worker_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = parse_start_args([], BASE_ENV)
    assert config.api_url == "https://api.devin.ai"
    assert config.cache_dir == Path("~/.devin/worker/cache").expanduser()
    assert config.data_dir == Path("~/.devin/worker").expanduser()
    assert config.sessions_dir == Path("~/.devin/worker/sessions").expanduser()
    assert config.static_base_url == "https://static.devin.ai/devin-rs/remote/"
    assert config.poll_interval == 5.0
    assert config.max_sessions == 1
    assert config.workdir == tmp_path
    assert config.watch is True
    assert config.restart_limit == 5
    assert config.pty_bridge_port is None
    assert config.gateway_url is None
    assert config.remote_binary_sha is None
    assert TOKEN not in repr(config)


def test_config_env_is_used_and_flags_win(tmp_path: Path) -> None:
    env = {
        **BASE_ENV,
        "DEVIN_API_URL": "http://env.example/opbeta/outposts/",
        "DEVIN_WORKER_ACCEPTOR_ID": "env-acceptor",
        "DEVIN_WORKER_CACHE_DIR": str(tmp_path / "envdata" / "cache"),
        "DEVIN_WORKER_STATIC_BASE_URL": "http://static.env/remote",
        "DEVIN_OUTPOST_GATEWAY_URL": "wss://gw.env",
        "DEVIN_WORKER_REMOTE_SHA": "ABCDEF1",
        "DEVIN_PTY_BRIDGE_PORT": "7000",
        "DEVIN_CHROME_PATH": "/usr/bin/google-chrome",
    }
    config = parse_start_args([], env)
    assert config.api_url == "http://env.example"
    assert config.acceptor_id == "env-acceptor"
    assert config.data_dir == tmp_path / "envdata"
    assert config.static_base_url == "http://static.env/remote/"
    assert config.gateway_url == "wss://gw.env"
    assert config.remote_binary_sha == "abcdef1"
    assert config.pty_bridge_port == 7000
    assert config.chrome_path == "/usr/bin/google-chrome"
    flags = parse_start_args(
        [
            "--api-url",
            "http://flag.example",
            "--acceptor-id",
            "flag-acceptor",
            "--cache-dir",
            str(tmp_path / "c"),
            "--remote-binary-sha",
            "1234567",
            "--pty-bridge-port",
            "7001",
            "--token",
            "cog_from_flag",
            "--gateway-url",
            "wss://gw.flag",
            "--no-watch",
            "--poll-interval-secs",
            "0.5",
        ],
        env,
    )
    assert flags.api_url == "http://flag.example"
    assert flags.acceptor_id == "flag-acceptor"
    assert flags.cache_dir == tmp_path / "c"
    assert flags.remote_binary_sha == "1234567"
    assert flags.pty_bridge_port == 7001
    assert flags.token == "cog_from_flag"
    assert flags.gateway_url == "wss://gw.flag"
    assert flags.watch is False
    assert flags.poll_interval == 0.5


def test_config_empty_env_values_count_as_unset() -> None:
    config = parse_start_args([], {**BASE_ENV, "DEVIN_API_URL": "", "DEVIN_WORKER_REMOTE_SHA": " "})
    assert config.api_url == "https://api.devin.ai"
    assert config.remote_binary_sha is None


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "no API token"),
        (["--remote-binary-sha", "xyz"], BASE_ENV, "hex git SHA"),
        (["--remote-binary-sha", "abc"], BASE_ENV, "hex git SHA"),
        (["--poll-interval-secs", "0"], BASE_ENV, "at least"),
        (["--max-sessions", "0"], BASE_ENV, "at least"),
        (["--fleet-size", "0"], BASE_ENV, "at least"),
        ([], {**BASE_ENV, "DEVIN_WORKER_FLEET_SIZE": "many"}, "integer"),
        (["--max-sessions", "2", "--once"], BASE_ENV, "--max-sessions"),
        (["--max-sessions", "2", "--session", "devin-1"], BASE_ENV, "--max-sessions"),
        (["--max-sessions", "2", "--pty-bridge-port", "7000"], BASE_ENV, "--pty-bridge-port"),
        (["--acceptor-id", "../bad id"], BASE_ENV, "invalid acceptor id"),
        (["--api-url", "ftp://x"], BASE_ENV, "http"),
        (["--gateway-url", "tcp://x"], BASE_ENV, "--gateway-url"),
        (["--metrics-addr", "host:notaport"], BASE_ENV, "--metrics-addr"),
        ([], {"DEVIN_REMOTE_SESSION_TOKEN": "ct_x"}, "--session is required"),
        (["--session", "devin-1"], {"DEVIN_REMOTE_SESSION_TOKEN": "ct_x"}, "DEVIN_OUTPOST_GATEWAY_URL"),
        ([], {**BASE_ENV, "DEVIN_WORKER_WATCH": "maybe"}, "true or false"),
    ],
)
def test_config_rejects_bad_values(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("-", r"\-")):
        parse_start_args(argv, env)


def test_config_direct_mode_needs_no_account_token() -> None:
    config = parse_start_args(
        ["--session", "devin-1"],
        {"DEVIN_REMOTE_SESSION_TOKEN": "ct_direct", "DEVIN_OUTPOST_GATEWAY_URL": "wss://g"},
    )
    assert config.direct
    assert config.token is None
    assert "ct_direct" not in repr(config)


def test_metrics_addr_forms() -> None:
    assert str(parse_metrics_addr(":9100")) == "0.0.0.0:9100"
    assert str(parse_metrics_addr("127.0.0.1:0")) == "127.0.0.1:0"
    assert str(parse_metrics_addr("[::1]:9100")) == "::1:9100"


def test_slot_dirs(tmp_path: Path) -> None:
    one = WorkerConfig(workdir=tmp_path)
    assert one.slot_dir(0) == tmp_path
    three = WorkerConfig(workdir=tmp_path, max_sessions=3)
    assert [three.slot_dir(i) for i in range(3)] == [tmp_path / f"slot-{i}" for i in range(3)]


# --- identity -------------------------------------------------------------------------------------


def test_acceptor_id_is_generated_once_stored_0600_and_reused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = load_or_create_acceptor_id(data)
    path = data / "acceptor_id"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert path.read_text().strip() == first
    assert load_or_create_acceptor_id(data) == first
    assert load_or_create_acceptor_id(tmp_path / "other") != first


def test_corrupt_acceptor_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "acceptor_id").write_text("../../etc/passwd\n")
    with pytest.raises(ValueError, match="delete the file"):
        load_or_create_acceptor_id(tmp_path)


def test_data_dir_lock_excludes_a_second_worker_process(tmp_path: Path) -> None:
    lock = FileLock(tmp_path / "worker.lock", "the worker data directory").acquire()
    try:
        with pytest.raises(LockedError, match="another worker"):
            FileLock(tmp_path / "worker.lock", "the worker data directory").acquire()
        code = (
            "import sys; from pathlib import Path\n"
            "from devin_outposts.core.identity import FileLock, LockedError\n"
            "try:\n FileLock(Path(sys.argv[1]), 'x').acquire()\nexcept LockedError:\n sys.exit(9)\n"
        )
        other = subprocess.run([sys.executable, "-c", code, str(tmp_path / "worker.lock")], check=False)
        assert other.returncode == 9
    finally:
        lock.release()
    FileLock(tmp_path / "worker.lock", "x").acquire().release()


# --- paths ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hostile",
    [
        "../../x",
        "..",
        ".",
        "",
        "/etc/passwd",
        "a/b",
        "a\\b",
        ".hidden",
        "x" * 500,
        "CON",
        "nul.txt",
        "a\x00b",
        "devin-1/../../../tmp",
        "ok.",
        "é",
        "-leading-dash",
        "..\\..\\windows",
    ],
)
def test_hostile_ids_stay_inside_the_parent(tmp_path: Path, hostile: str) -> None:
    component = safe_component(hostile)
    assert component not in ("", ".", "..")
    for bad in ("/", "\\", "\x00"):
        assert bad not in component
    assert not component.startswith(".")
    assert len(component) <= 100
    path = child_dir(tmp_path, hostile)
    assert path.parent == tmp_path.resolve()


def test_plain_ids_are_kept_and_encoded_ids_are_distinct() -> None:
    assert safe_component("devin-0123abcd") == "devin-0123abcd"
    assert safe_component("a/b") != safe_component("a_b")
    assert safe_component("a_b") == "a_b"
    assert safe_component("../x") != safe_component("../y")
    assert safe_component("a/b").startswith("_")


def test_symlinked_state_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "parent").mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "parent" / "devin-1")
    with pytest.raises(UnsafePathError, match="symlink"):
        child_dir(tmp_path / "parent", "devin-1")


# --- binaries -------------------------------------------------------------------------------------


def test_platform_suffixes() -> None:
    assert platform_suffix("Linux", "x86_64") == "linux_x64"
    assert platform_suffix("Linux", "aarch64") == "linux_arm64"
    assert platform_suffix("Darwin", "arm64") == "macos_arm64"
    assert platform_suffix("Windows", "AMD64") == "windows_x64.exe"
    with pytest.raises(UnsupportedPlatform):
        platform_suffix("Darwin", "x86_64")


def test_digest_file_forms() -> None:
    digest = "a" * 64
    assert parse_digest(digest + "\n") == digest
    assert parse_digest(f"{digest.upper()}  devin-remote_abc_linux_x64\n") == digest
    assert parse_digest(f"\n{digest} *devin-remote\n") == digest
    with pytest.raises(VerificationError):
        parse_digest("not-a-digest devin-remote\n")
    with pytest.raises(VerificationError):
        parse_digest("")


def test_sha_resolution_order(tmp_path: Path) -> None:
    async def scenario(dist: DistServer) -> list[tuple[str, str]]:
        store = BinaryStore(tmp_path / "cache", dist.url)
        try:
            return [
                await store.resolve_sha("aaaaaa1", "bbbbbb2"),
                await store.resolve_sha(None, "bbbbbb2"),
                await store.resolve_sha(None, None),
            ]
        finally:
            await store.aclose()

    with DistServer("cccccc3", b"#!/bin/sh\n") as dist:
        assert run(scenario(dist)) == [("aaaaaa1", "session"), ("bbbbbb2", "worker"), ("cccccc3", "latest")]
        assert dist.count(f"latest_{SUFFIX}") == 1


def test_invalid_shas_are_refused(tmp_path: Path) -> None:
    async def scenario(dist: DistServer) -> None:
        store = BinaryStore(tmp_path / "cache", dist.url)
        try:
            with pytest.raises(BinaryError, match="hex SHA"):
                await store.resolve_sha("../../etc", None)
            dist.files[f"latest_{SUFFIX}"] = b"<html>not a sha</html>"
            with pytest.raises(BinaryError, match="hex SHA"):
                await store.resolve_sha(None, None)
        finally:
            await store.aclose()

    with DistServer("cccccc3", b"#!/bin/sh\n") as dist:
        run(scenario(dist))


def test_download_is_verified_cached_0755_and_reused(tmp_path: Path) -> None:
    binary = b"#!/bin/sh\necho hello\n"

    async def scenario(dist: DistServer) -> tuple[Path, Path]:
        store = BinaryStore(tmp_path / "cache", dist.url)
        try:
            first = await store.ensure("abc1234")
            second = await store.ensure("abc1234")
            return first, second
        finally:
            await store.aclose()

    with DistServer("abc1234", binary, digest_format="{digest}  {name}") as dist:
        first, second = run(scenario(dist))
        assert first == second == tmp_path / "cache" / f"devin-remote_abc1234_{SUFFIX}"
        assert first.read_bytes() == binary
        assert stat.S_IMODE(first.stat().st_mode) == 0o755
        assert dist.count(f"devin-remote_abc1234_{SUFFIX}") == 1
        assert not [p for p in first.parent.iterdir() if p.name.endswith(".part")]


def test_checksum_mismatch_is_refused_and_never_cached(tmp_path: Path) -> None:
    async def scenario(dist: DistServer) -> None:
        store = BinaryStore(tmp_path / "cache", dist.url)
        try:
            with pytest.raises(VerificationError, match="Refusing devin-remote abc1234"):
                await store.ensure("abc1234")
        finally:
            await store.aclose()

    with DistServer("abc1234", b"#!/bin/sh\necho good\n") as dist:
        dist.tamper("abc1234", b"#!/bin/sh\necho evil\n")
        run(scenario(dist))
    leftovers = list((tmp_path / "cache").iterdir())
    assert not [p for p in leftovers if p.name.startswith("devin-remote_abc1234")], leftovers


def test_tampered_cache_is_discarded_and_downloaded_again(tmp_path: Path) -> None:
    good = b"#!/bin/sh\necho good\n"

    async def scenario(dist: DistServer) -> Path:
        store = BinaryStore(tmp_path / "cache", dist.url)
        try:
            path = await store.ensure("abc1234")
            path.write_bytes(b"#!/bin/sh\necho evil\n")
            path = await store.ensure("abc1234")
            assert store.verification_failures == 1
            return path
        finally:
            await store.aclose()

    with DistServer("abc1234", good) as dist:
        path = run(scenario(dist))
        assert path.read_bytes() == good
        assert dist.count(f"devin-remote_abc1234_{SUFFIX}") == 2


def test_a_new_process_verifies_the_cache_against_the_published_digest(tmp_path: Path) -> None:
    good = b"#!/bin/sh\necho good\n"

    async def fetch(dist: DistServer) -> Path:
        store = BinaryStore(tmp_path / "cache", dist.url)
        try:
            return await store.ensure("abc1234")
        finally:
            await store.aclose()

    with DistServer("abc1234", good) as dist:
        path = run(fetch(dist))
        path.write_bytes(b"evil")
        (path.parent / (path.name + ".sha256")).write_text(sha256_hex(b"evil"))  # the attacker edits both
        assert run(fetch(dist)).read_bytes() == good


def test_download_errors_are_binary_errors(tmp_path: Path) -> None:
    async def scenario(dist: DistServer) -> None:
        store = BinaryStore(tmp_path / "cache", dist.url)
        try:
            with pytest.raises(BinaryError, match="HTTP 404"):
                await store.ensure("deadbee")
        finally:
            await store.aclose()

    with DistServer("abc1234", b"x") as dist:
        run(scenario(dist))


# --- session environment --------------------------------------------------------------------------


def test_session_env_is_exactly_the_spawn_contract(tmp_path: Path) -> None:
    source = {
        "PATH": "/usr/bin",
        "HOME": "/home/w",
        "USER": "w",
        "LOGNAME": "w",
        "TMPDIR": "/srv/tmp",
        "LANG": "C.UTF-8",
        "TZ": "UTC",
        "DISPLAY": ":0",
        "XAUTHORITY": "/x",
        "DEVIN_OUTPOSTS_TOKEN": TOKEN,
        "DEVIN_REMOTE_SESSION_TOKEN": "ct_direct_secret",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t",
        "SSH_AUTH_SOCK": "/s",
        "LD_PRELOAD": "/evil.so",
        "PYTHONPATH": "/p",
    }
    env = spawn.build_session_env(
        gateway_url="wss://gw",
        connect_token=CONNECT,
        session_id="devin-1",
        state_dir=tmp_path,
        pty_bridge_port=7000,
        chrome_path="/usr/bin/chrome",
        desktop="true",
        source=source,
    )
    assert set(env) == {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "TMPDIR",
        "LANG",
        "TZ",
        "DISPLAY",
        "XAUTHORITY",
        "DEVIN_OUTPOST_GATEWAY_URL",
        "DEVIN_OUTPOST_CONNECT_TOKEN",
        "DEVIN_OUTPOST_SESSION_ID",
        "DEVIN_REMOTE_STATE_DIR",
        "DEVIN_PTY_BRIDGE_PORT",
        "DEVIN_CHROME_PATH",
        "DEVIN_OUTPOST_DESKTOP",
    }
    assert env["DEVIN_OUTPOST_CONNECT_TOKEN"] == CONNECT
    assert TOKEN not in env.values()
    assert "ct_direct_secret" not in env.values()


def test_session_env_skips_absent_and_optional_values(tmp_path: Path) -> None:
    env = spawn.build_session_env(
        gateway_url="wss://gw",
        connect_token=CONNECT,
        session_id="s",
        state_dir=tmp_path,
        pty_bridge_port=1,
        source={"PATH": "/bin", "HOME": ""},
    )
    assert set(env) == {
        "PATH",
        "DEVIN_OUTPOST_GATEWAY_URL",
        "DEVIN_OUTPOST_CONNECT_TOKEN",
        "DEVIN_OUTPOST_SESSION_ID",
        "DEVIN_REMOTE_STATE_DIR",
        "DEVIN_PTY_BRIDGE_PORT",
    }


def test_windows_session_env_keeps_the_system_variables(tmp_path: Path) -> None:
    with platform.use(platform.Windows()):
        env = spawn.build_session_env(
            gateway_url="wss://gw",
            connect_token=CONNECT,
            session_id="s",
            state_dir=tmp_path,
            pty_bridge_port=1,
            source={"SystemRoot": "C:\\Windows", "ComSpec": "cmd.exe", "Path": "C:\\bin", "SECRET": "x"},
        )
    assert env["SystemRoot"] == "C:\\Windows"
    assert env["ComSpec"] == "cmd.exe"
    assert "SECRET" not in env


# --- backoff and renewals -------------------------------------------------------------------------


def test_backoff_bounds_and_reset() -> None:
    low = Backoff(base=1, cap=60, rng=lambda: 0.0)
    high = Backoff(base=1, cap=60, rng=lambda: 0.999999)
    lows = [low.next_delay() for dummy in range(10)]
    highs = [high.next_delay() for dummy in range(10)]
    assert lows[:3] == [0.5, 1.0, 2.0]
    assert highs[0] == pytest.approx(1.0, abs=1e-3)
    assert max(highs) <= 60
    assert highs[-1] == pytest.approx(60, abs=1e-3)
    assert lows[-1] == 30
    assert not high.connection_lived(4.9)
    assert high.next_delay() == pytest.approx(60, abs=1e-3)
    assert high.connection_lived(5.0)
    assert high.next_delay() == pytest.approx(1.0, abs=1e-3)


def test_renew_delay() -> None:
    assert renew_delay(300, 60) == 200
    assert renew_delay(90, 60) == 30
    assert renew_delay(3, 60) == 1
    assert renew_delay(0, 60) == 0
    assert renew_delay(-5, 60) == 0
    for remaining in (0.2, 1, 10, 100, 1000):
        assert 0 < renew_delay(remaining, 60) < remaining


def test_renewals_are_brought_forward_at_random_never_past_the_margin_nor_before_a_third() -> None:
    """Claims taken in one burst must not renew in one burst forever: each renewal comes up to a tenth of
    the remaining time early (a 300 s claim: between 170 s and 200 s), never later than without jitter and
    never before a third of the remaining time."""
    assert renew_delay(300, 60, jitter=1.0) == pytest.approx(170)
    assert renew_delay(300, 60, jitter=0.5) == pytest.approx(185)
    assert renew_delay(3, 60, jitter=1.0) == pytest.approx(1)  # already at the one-third floor
    waits = [renew_delay(300, 60, jitter=random.random()) for dummy in range(200)]
    assert all(170 <= wait <= 200 for wait in waits)
    assert max(waits) - min(waits) > 15  # spread, not one instant
    for remaining in (0.2, 1, 10, 100, 1000):
        for jitter in (0.0, 0.3, 1.0, 7.0, -1.0):  # out-of-range jitter is clamped
            wait = renew_delay(remaining, 60, jitter=jitter)
            assert remaining / 3 - 1e-9 <= wait or wait == 0.05
            assert wait <= renew_delay(remaining, 60)


# --- queue picture --------------------------------------------------------------------------------


def entry(sid: str, created: int, **status: Any) -> QueueEntry:
    return QueueEntry.model_validate(
        {
            "metadata": {"session_id": sid, "outpost_id": "o", "created_at": created, "updated_at": created},
            "status": {"phase": "pending", "session_status": "pending", **status},
        }
    )


def make_feed(**kwargs: Any) -> QueueFeed:
    """A feed without a server, made on an event loop (Python 3.9 binds its Event to the loop)."""

    async def make() -> QueueFeed:
        return QueueFeed(object(), "o", "me", **kwargs)  # type: ignore[arg-type]

    return run(make())


def test_oldest_first_by_created_at_then_session_id() -> None:
    entries = [entry("b", 2), entry("c", 1), entry("a", 2), entry("d", 3)]
    assert [e.session_id for e in oldest_first(entries)] == ["c", "a", "b", "d"]


def test_feed_offers_only_claimable_rows_oldest_first() -> None:
    now = 1_000_000.0
    feed = make_feed(clock=lambda: now)
    feed.replace_all(
        [
            entry("old-suspended", 1, session_status="suspended"),
            entry("old-terminated", 2, session_status="terminated"),
            entry("pending-running", 5, session_status="running"),
            entry("b-new", 4),
            entry("a-new", 4),
            entry("theirs", 3, phase="claimed", acceptor_id="other", claim_deadline=int(now + 60)),
            entry("theirs-expired", 3, phase="claimed", acceptor_id="other", claim_deadline=int(now - 5)),
            entry("mine", 3, phase="claimed", acceptor_id="me", claim_deadline=int(now + 60)),
        ]
    )
    assert [e.session_id for e in feed.candidates()] == [
        "theirs-expired",
        "a-new",
        "b-new",
        "pending-running",
    ]
    assert [e.session_id for e in feed.candidates(exclude=["a-new"])] == [
        "theirs-expired",
        "b-new",
        "pending-running",
    ]
    wakeup = feed.next_wakeup()
    assert wakeup is not None
    assert 55 < wakeup <= 62
    feed.penalize("b-new", 30)
    assert "b-new" not in [e.session_id for e in feed.candidates()]


def test_feed_upserts_watch_events_by_session_id() -> None:
    feed = make_feed()
    seen: list[tuple[str, bool]] = []
    feed.on_update = lambda sid, e: seen.append((sid, e is not None))
    feed.replace_all([entry("a", 1)])

    def event(kind: str, e: QueueEntry, cursor: str) -> WatchEvent:
        return WatchEvent.model_validate({"type": kind, "object": e.to_wire(), "cursor": cursor})

    feed.apply(event("MODIFIED", entry("b", 2), "c1"))
    feed.apply(event("MODIFIED", entry("b", 2), "c2"))  # a duplicate (at-least-once)
    assert [e.session_id for e in feed.candidates()] == ["a", "b"]
    feed.apply(event("MODIFIED", entry("a", 1, phase="claimed", acceptor_id="x", claim_deadline=2**31), "c3"))
    feed.apply(event("DELETED", entry("b", 2), "c4"))
    feed.apply(event("SOMETHING_NEW", entry("c", 3), "c5"))
    assert [e.session_id for e in feed.candidates()] == ["c"]
    assert feed.cursor == "c5"
    assert ("b", False) in seen


def test_the_feed_keeps_no_ended_rows_but_sees_a_resume() -> None:
    # The soak's workers grew ~2 MiB an hour: every session the outpost ever served stayed in the picture.
    feed = make_feed()
    updates: list[str] = []
    feed.on_update = lambda sid, e: updates.append(sid)
    feed.replace_all([entry(f"done-{n}", n, session_status="terminated") for n in range(200)])
    ours = {"phase": "claimed", "acceptor_id": "me", "claim_deadline": 2**31}
    feed.upsert(entry("mine", 300, session_status="terminated", **ours))
    feed.upsert(entry("paused", 301, session_status="suspended"))
    assert sorted(feed.entries) == ["mine"]  # our own claim stays until we release it
    assert len(updates) == 202  # the owner still hears about every row
    feed.upsert(entry("paused", 301, session_status="pending"))  # resumed
    assert [e.session_id for e in feed.candidates()] == ["paused"]


# --- serving a session against an in-memory fleet -------------------------------------------------


def serve_once(
    tmp_path: Path,
    fleet: FakeFleet,
    remote: FakeRemote,
    sid: str = "devin-1",
    servers: Optional[list[SessionServer]] = None,
    **overrides: Any,
) -> Any:
    """Serve ``sid`` once with a fresh SessionServer; ``servers`` receives it before it serves."""

    async def scenario() -> Any:
        options: dict[str, Any] = {
            "poll_interval": 0.1,
            "confirm_interval": 0.05,
            "stop_grace": 2.0,
            **overrides,
        }
        config = WorkerConfig(
            token=TOKEN, cache_dir=tmp_path / "data" / "cache", workdir=tmp_path / "wd", **options
        )
        with DistServer("abc1234", remote.script) as dist:
            store = BinaryStore(config.cache_dir, dist.url)
            try:
                claim = await fleet.claim(sid, "me")
                server = SessionServer(
                    config,
                    session_id=sid,
                    acceptor_id="me",
                    binaries=store,
                    metrics=Metrics(),
                    cwd=config.workdir,
                    fleet=fleet,
                    claim=claim,
                )
                if servers is not None:
                    servers.append(server)
                result = await server.serve()
                return result, server.metrics
            finally:
                await store.aclose()

    return run(scenario())


def test_restart_limit_then_release(tmp_path: Path) -> None:
    remote = FakeRemote(tmp_path / "remote")
    remote.default("exit:3")
    fleet = FakeFleet()
    fleet.statuses["devin-1"] = "running"
    result, metrics = serve_once(tmp_path, fleet, remote, restart_limit=2)
    assert result.outcome == FAILED
    assert "restarted 2 times" in result.detail
    assert len(remote.runs("devin-1")) == 3
    assert metrics.counters["remote_restarts"] == 2
    assert fleet.calls[-1] == ("release", "devin-1")
    assert "devin-1" not in fleet.holders


def test_exit_zero_confirmed_terminated_then_release(tmp_path: Path) -> None:
    remote = FakeRemote(tmp_path / "remote")
    remote.default("exit:0")
    fleet = FakeFleet()
    fleet.statuses["devin-1"] = "terminated"
    # No status poll while the remote runs: a poll that saw "terminated" first would stop the remote
    # before a loaded machine had even started it, and this test is about the exit and its confirmation.
    result = serve_once(tmp_path, fleet, remote, poll_interval=60.0)[0]
    assert result.outcome == SERVED
    assert result.session_status == "terminated"
    assert len(remote.runs("devin-1")) == 1
    assert fleet.calls[-1] == ("release", "devin-1")
    assert not (tmp_path / "data" / "sessions" / "devin-1").exists()  # terminated: state removed


def test_exit_zero_suspended_keeps_state_dir(tmp_path: Path) -> None:
    remote = FakeRemote(tmp_path / "remote")
    remote.default("exit:0")
    fleet = FakeFleet()
    fleet.statuses["devin-1"] = "suspended"
    result = serve_once(tmp_path, fleet, remote)[0]
    assert (result.outcome, result.session_status) == (SERVED, "suspended")
    state = tmp_path / "data" / "sessions" / "devin-1"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700


def test_exit_zero_while_live_restarts_with_a_fresh_token(tmp_path: Path) -> None:
    remote = FakeRemote(tmp_path / "remote")
    remote.plan("devin-1", "exit:0", "exit:0", "marker:second")
    fleet = FakeFleet()
    fleet.statuses["devin-1"] = "running"

    async def terminate_later() -> None:
        while not (remote.records / "second").exists():  # noqa: ASYNC110 - a file, not an event
            await asyncio.sleep(0.05)
        fleet.statuses["devin-1"] = "terminated"

    async def scenario() -> Any:
        task = asyncio.ensure_future(terminate_later())
        result = await asyncio.to_thread(serve_once, tmp_path, fleet, remote, "devin-1", confirm_reads=2)
        await task
        return result

    result = run(scenario())[0]
    runs = remote.runs("devin-1")
    assert result.outcome == SERVED
    assert len(runs) == 3
    tokens = [r["env"]["DEVIN_OUTPOST_CONNECT_TOKEN"] for r in runs]
    assert tokens[0] != tokens[-1]
    assert fleet.count("renew") >= 2


def test_terminated_while_running_stops_the_remote(tmp_path: Path) -> None:
    remote = FakeRemote(tmp_path / "remote")
    fleet = FakeFleet()

    async def terminate_when_running() -> None:
        while not remote.runs("devin-1"):  # noqa: ASYNC110 - a file, not an event
            await asyncio.sleep(0.05)
        fleet.statuses["devin-1"] = "terminated"

    async def scenario() -> Any:
        task = asyncio.ensure_future(terminate_when_running())
        result = await asyncio.to_thread(serve_once, tmp_path, fleet, remote)
        await task
        return result

    result = run(scenario())[0]
    assert result.outcome == SERVED
    pid = remote.runs("devin-1")[0]["pid"]
    assert pid in remote.stopped_pids()  # it got SIGTERM and exited
    assert fleet.calls[-1] == ("release", "devin-1")


def test_lost_claim_stops_the_remote_and_does_not_release(tmp_path: Path) -> None:
    from devin_outposts.api.errors import FleetConflict

    remote = FakeRemote(tmp_path / "remote")
    fleet = FakeFleet(ttl=1)
    fleet.statuses["devin-1"] = "running"

    async def lose_claim_once_running() -> None:
        # Only after the remote recorded its start: a loaded machine may take longer than one renewal
        # interval (a third of the 1 s TTL) to start a Python process.
        while not remote.runs("devin-1"):  # noqa: ASYNC110 - a file, not an event
            await asyncio.sleep(0.05)
        fleet.renew_error = FleetConflict("claim session devin-1", "Session is already claimed", 409)

    async def scenario() -> Any:
        task = asyncio.ensure_future(lose_claim_once_running())
        result = await asyncio.to_thread(serve_once, tmp_path, fleet, remote)
        await task
        return result

    result = run(scenario())[0]
    assert result.outcome == LOST
    assert fleet.count("release") == 0
    assert remote.runs("devin-1")[0]["pid"] in remote.stopped_pids()


def test_a_claim_that_expires_in_an_outage_stops_the_remote_of_a_pending_session(tmp_path: Path) -> None:
    # Found by benchmarks/soak.py: a 30 s outage with a 10 s TTL let another worker claim the session a
    # moment before this worker's renewal came back with a 409, so two remotes ran for one session.
    # Past the deadline the queue may hand a session that is not running to anyone: stop first.
    remote = FakeRemote(tmp_path / "remote")
    fleet = FakeFleet(ttl=2)
    seen: dict[str, float] = {}

    async def outage_once_running() -> None:
        while not remote.runs("devin-1"):  # noqa: ASYNC110 - a file, not an event
            await asyncio.sleep(0.05)
        fleet.outage = True
        seen["outage"] = time.time()
        # Without the fix the remote would run on: end the outage and the session after 8 s (the test
        # then fails on the outcome instead of hanging).
        while time.time() - seen["outage"] < 8.0 and not remote.stopped_pids():  # noqa: ASYNC110 - files
            await asyncio.sleep(0.05)
        fleet.outage = False
        fleet.statuses["devin-1"] = "terminated"

    async def scenario() -> Any:
        task = asyncio.ensure_future(outage_once_running())
        result = await asyncio.to_thread(serve_once, tmp_path, fleet, remote)
        await task
        return result

    result = run(scenario())[0]
    assert result.outcome == LOST
    assert "expired" in result.detail
    assert fleet.count("release") == 0  # nothing to release: the claim is void
    pid = remote.runs("devin-1")[0]["pid"]
    assert pid in remote.stopped_pids()
    # It waited for the deadline of the last renewal that succeeded, not just for the first failure: the
    # remote wrote its stop record (mtime: when SIGTERM came) at or after that deadline.
    stopped_at = (remote.records / f"stopped-{pid}").stat().st_mtime
    assert stopped_at >= fleet.deadlines["devin-1"] > seen["outage"] - fleet.ttl


def test_a_running_session_is_served_through_an_outage_longer_than_its_claim(tmp_path: Path) -> None:
    # The fleet keeps an expired claim on a running session with its worker: stopping would end live work.
    remote = FakeRemote(tmp_path / "remote")
    fleet = FakeFleet(ttl=1)
    fleet.statuses["devin-1"] = "running"
    alive_after_outage: list[bool] = []

    async def outage_then_end() -> None:
        while not remote.runs("devin-1"):  # noqa: ASYNC110 - a file, not an event
            await asyncio.sleep(0.05)
        fleet.outage = True
        await asyncio.sleep(3.0)  # three claim lifetimes
        alive_after_outage.append(remote.runs("devin-1")[0]["pid"] not in remote.stopped_pids())
        fleet.outage = False
        fleet.statuses["devin-1"] = "terminated"

    async def scenario() -> Any:
        task = asyncio.ensure_future(outage_then_end())
        result = await asyncio.to_thread(serve_once, tmp_path, fleet, remote)
        await task
        return result

    result = run(scenario())[0]
    assert alive_after_outage == [True]
    assert result.outcome == SERVED
    assert fleet.count("release") == 1


def test_remote_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    remote = FakeRemote(tmp_path / "remote")
    remote.default("ignore-term")
    fleet = FakeFleet()

    async def tombstone_when_running() -> None:
        # The remote writes its run record only after it has set SIGTERM to be ignored, so once the record
        # exists the SIGTERM cannot stop it and only the SIGKILL after the grace can.
        while not remote.runs("devin-1"):  # noqa: ASYNC110 - a file, not an event
            await asyncio.sleep(0.05)
        fleet.gone.add("devin-1")

    async def scenario() -> Any:
        task = asyncio.ensure_future(tombstone_when_running())
        result = await asyncio.to_thread(serve_once, tmp_path, fleet, remote, "devin-1", stop_grace=0.5)
        await task
        return result

    result = run(scenario())[0]
    assert result.outcome == SERVED
    assert result.detail == "entry gone"
    pid = remote.runs("devin-1")[0]["pid"]
    assert pid not in remote.stopped_pids()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_refused_binary_is_never_run_and_the_claim_is_released(tmp_path: Path) -> None:
    remote = FakeRemote(tmp_path / "remote")
    evil = FakeRemote(tmp_path / "evil", tag="evil")
    fleet = FakeFleet()

    async def scenario() -> Any:
        config = WorkerConfig(token=TOKEN, cache_dir=tmp_path / "data" / "cache", workdir=tmp_path / "wd")
        with DistServer("abc1234", remote.script) as dist:
            dist.tamper("abc1234", evil.script)
            store = BinaryStore(config.cache_dir, dist.url)
            try:
                claim = await fleet.claim("devin-1", "me")
                server = SessionServer(
                    config,
                    session_id="devin-1",
                    acceptor_id="me",
                    binaries=store,
                    metrics=Metrics(),
                    cwd=config.workdir,
                    fleet=fleet,
                    claim=claim,
                )
                return await server.serve(), server.metrics
            finally:
                await store.aclose()

    result, metrics = run(scenario())
    assert result.outcome == FAILED
    assert result.refused_binary
    assert "Refusing devin-remote abc1234" in result.detail
    assert metrics.counters["binary_verification_failures"] == 1
    assert evil.runs() == []
    assert remote.runs() == []
    assert fleet.calls[-1] == ("release", "devin-1")


def test_hostile_session_id_state_dir_stays_inside(tmp_path: Path) -> None:
    remote = FakeRemote(tmp_path / "remote")
    remote.default("exit:0")
    fleet = FakeFleet()
    sid = "../../escape"
    fleet.statuses[sid] = "suspended"
    result = serve_once(tmp_path, fleet, remote, sid)[0]
    assert result.outcome == SERVED
    state = Path(remote.runs(sid)[0]["env"]["DEVIN_REMOTE_STATE_DIR"])
    assert state.parent == (tmp_path / "data" / "sessions").resolve()
    assert not (tmp_path / "escape").exists()
    assert not (tmp_path / "data" / "escape").exists()


def test_stale_remote_from_a_killed_worker_is_stopped(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        started = processes.start_time(proc.pid)
        processes.record_path(state).write_text(
            f'{{"pid": {proc.pid}, "pgid": {proc.pid}, "started": "{started}"}}'
        )
        (state / processes.PIDFILE).write_text('{"pid": 1, "pgid": 1, "started": null}')  # the session's own
        assert processes.reap_stale_remote(state)
        assert proc.wait(timeout=10) == -9
        assert not processes.record_path(state).exists()
        assert (state / processes.PIDFILE).exists()  # a file of the session's is not the worker's record
    finally:
        proc.kill()
        proc.wait()


def test_stale_pidfile_with_a_reused_pid_is_ignored(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        record = f'{{"pid": {proc.pid}, "pgid": {proc.pid}, "started": "1"}}'
        processes.record_path(tmp_path).write_text(record)
        assert not processes.reap_stale_remote(tmp_path)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


# --- claiming against a queue that moves while a claim is in flight --------------------------------


class RacingFleet:
    """Claims as the simulator does: a 409 for a row someone holds, otherwise the row as it is now.

    Its claim of ``first`` loses, and while that request is in flight another worker serves ``second``
    to the end: the feed hears that it was claimed, then that it was terminated and released.
    """

    def __init__(self, feed: QueueFeed, first: str, second: str) -> None:
        self.feed, self.first, self.second = feed, first, second
        self.calls: list[tuple[str, str]] = []
        self.ended: set[str] = set()

    async def claim(self, session_id: str, acceptor_id: str) -> QueueEntry:
        from devin_outposts.api.errors import FleetConflict

        self.calls.append(("claim", session_id))
        if session_id == self.first:
            self.feed.upsert(
                entry(
                    self.second,
                    2,
                    phase="claimed",
                    acceptor_id="other",
                    claim_deadline=2**31,
                )
            )
            await asyncio.sleep(0)
            self.ended.add(self.second)
            self.feed.upsert(entry(self.second, 2, session_status="terminated"))
            raise FleetConflict(f"claim session {session_id}", "Session is already claimed", 409)
        status = "terminated" if session_id in self.ended else "pending"
        return entry(
            session_id,
            0,
            phase="claimed",
            acceptor_id=acceptor_id,
            session_status=status,
        )

    async def release(self, session_id: str, acceptor_id: str) -> None:
        self.calls.append(("release", session_id))


def test_claim_next_never_claims_a_row_that_ended_during_an_earlier_attempt(tmp_path: Path) -> None:
    started: list[str] = []

    def server_for(claim: QueueEntry, slot: int) -> Any:
        started.append(claim.session_id)
        return FakeServer(claim.session_id, slot)

    async def scenario() -> tuple[RacingFleet, ClaimLoop, str]:
        feed = QueueFeed(object(), "o", "me")  # type: ignore[arg-type]
        feed.replace_all([entry("a", 1), entry("b", 2), entry("c", 3)])
        fleet = RacingFleet(feed, "a", "b")
        metrics = Metrics()
        pool = SessionPool(1, metrics, drain_timeout=1.0)
        config = WorkerConfig(token=TOKEN, poll_interval=5.0)
        host = WorkerHost(config, acceptor_id="me", metrics=metrics, server_for=server_for)
        mode = ClaimLoop(config, fleet, pool, metrics, "me", host)  # type: ignore[arg-type]
        mode.feed = feed
        outcome = await mode.claim_next()
        await pool.drain()
        return fleet, mode, outcome

    fleet, mode, outcome = run(scenario())
    assert outcome == "claimed"
    # "b" was served, terminated and released by another worker while our claim of "a" was in flight:
    # it must not be claimed (docs/fleet-api.md §5.2), not even to be released at once.
    assert fleet.calls == [("claim", "a"), ("claim", "c")]
    assert started == ["c"]
    assert mode.metrics.counters["claim_conflicts"] == 1


def test_a_session_given_back_whose_release_the_watch_showed_first_is_offered_again_after_its_cool_down() -> (
    None
):
    """The release's watch event may reach the feed before the claim loop hears the session ended. Its copy
    is then the server's latest word: dropped, no further word would come, and the session would wait for
    the next full list (300 s) instead of its 60 s cool-down. A copy that still shows our claim is stale
    and is dropped, as is any copy of a session served here."""

    async def scenario() -> dict[str, bool]:
        feed = QueueFeed(object(), "o", "me")  # type: ignore[arg-type]
        feed.replace_all([
            entry("released-first", 1),  # the watch showed our release already
            entry("still-ours", 2, phase="claimed", acceptor_id="me"),  # our claim: the release not seen
            entry("served", 3),
        ])  # fmt: skip
        metrics = Metrics()
        config = WorkerConfig(token=TOKEN, poll_interval=5.0)
        host = WorkerHost(config, acceptor_id="me", metrics=metrics, server_for=lambda claim, slot: None)
        pool = SessionPool(1, metrics, drain_timeout=1.0)
        mode = ClaimLoop(config, object(), pool, metrics, "me", host)  # type: ignore[arg-type]
        mode.feed = feed
        mode._finished(SessionResult("released-first", FAILED, "the machine could not be made"))
        mode._finished(SessionResult("still-ours", FAILED, "the machine could not be made"))
        mode._finished(SessionResult("served", SERVED, "session terminated"))
        offered_now = feed.next_candidate() is not None
        feed._penalties["released-first"] = 0.0  # the cool-down ran out
        candidate = feed.next_candidate()
        return {
            "kept": "released-first" in feed.entries,
            "stale dropped": "still-ours" not in feed.entries,
            "served dropped": "served" not in feed.entries,
            "not offered during the cool-down": not offered_now,
            "offered after it": candidate is not None and candidate.session_id == "released-first",
        }

    assert run(scenario()) == dict.fromkeys(
        ["kept", "stale dropped", "served dropped", "not offered during the cool-down", "offered after it"],
        True,
    )


class FakeServer:
    """What the pool runs: a session that is served at once."""

    def __init__(self, session_id: str, slot: int) -> None:
        self.session_id, self.slot = session_id, slot
        self.fatal = None
        self.stopping = False

    async def serve(self) -> SessionResult:
        return SessionResult(self.session_id, SERVED, "served at once")

    def notify(self, entry: Any) -> None:
        pass

    def request_stop(self, grace: Any = None) -> None:
        self.stopping = True


def test_next_candidate_matches_the_full_sorted_view() -> None:
    now = 1_000_000.0
    feed = make_feed(clock=lambda: now)
    rows = [entry(f"s{i:03d}", 1 + (i * 7919) % 50) for i in range(120)]
    rows += [
        entry("ended", 0, session_status="terminated"),
        entry(
            "theirs-expired",
            0,
            phase="claimed",
            acceptor_id="other",
            claim_deadline=int(now - 5),
        ),
        entry(
            "theirs",
            0,
            phase="claimed",
            acceptor_id="other",
            claim_deadline=int(now + 60),
        ),
    ]
    feed.replace_all(rows)
    feed.penalize("s000", 30)
    taken: list[str] = []
    while (candidate := feed.next_candidate(exclude=taken)) is not None:
        assert next(e.session_id for e in feed.candidates(exclude=taken)) == candidate.session_id
        taken.append(candidate.session_id)
        if len(taken) % 3 == 0:  # another worker takes the next oldest row meanwhile
            others = feed.candidates(exclude=taken)
            if others:
                feed.upsert(
                    entry(
                        others[0].session_id,
                        others[0].metadata.created_at or 0,
                        phase="claimed",
                        acceptor_id="other",
                        claim_deadline=int(now + 60),
                    )
                )
    assert taken[0] == "theirs-expired"
    assert "ended" not in taken and "theirs" not in taken and "s000" not in taken
    # a row released back to the queue is offered again
    feed.upsert(entry("theirs", 0))
    again = feed.next_candidate(exclude=taken)
    assert again is not None and again.session_id == "theirs"


def test_conflict_pause_is_bounded_and_grows_with_conflicts_in_a_row() -> None:
    assert conflict_pause(1, rng=lambda: 1.0) == pytest.approx(CONFLICT_PAUSE)
    assert conflict_pause(2, rng=lambda: 1.0) == pytest.approx(2 * CONFLICT_PAUSE)
    assert conflict_pause(50, rng=lambda: 1.0) == pytest.approx(CONFLICT_PAUSE_CAP)
    assert conflict_pause(3, rng=lambda: 0.0) == 0.0


def test_terminated_notice_during_the_remote_start_is_not_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watch reports "terminated" while RemoteProcess.start is awaited: no status poll may be needed."""
    from devin_outposts.worker import session as session_module

    remote = FakeRemote(tmp_path / "remote")
    fleet = FakeFleet(ttl=600.0)  # no renewal (which would also report "terminated") for minutes
    servers: list[SessionServer] = []
    real_start = session_module.RemoteProcess.start

    async def start_and_hear_terminated(
        binary: Path, *, cwd: Path, env: Any, state_dir: Path, session_id: str, wrap: Any = None
    ) -> Any:
        started = await real_start(
            binary, cwd=cwd, env=env, state_dir=state_dir, session_id=session_id, wrap=wrap
        )
        fleet.statuses["devin-1"] = "terminated"
        servers[0].notify(fleet.entry("devin-1"))  # the watch event, delivered while start was awaited
        return started

    monkeypatch.setattr(session_module.RemoteProcess, "start", start_and_hear_terminated)
    # a poll would also see "terminated", but only after 30 s (and a "get")
    result, dummy_metrics = serve_once(tmp_path, fleet, remote, servers=servers, poll_interval=30.0)
    assert (result.outcome, result.session_status) == (SERVED, "terminated")
    # noticed from the notice itself, not from a status poll or a renewal
    assert fleet.count("get") == 0
    assert fleet.count("renew") == 0
    assert fleet.calls[-1] == ("release", "devin-1")


def test_run_out_penalties_of_rows_nobody_offers_again_are_dropped() -> None:
    """A penalised row the winner claimed is never met again: its run-out penalty must not wake the loop."""
    feed = make_feed()
    feed.replace_all([entry("won-by-other", 1, phase="claimed", acceptor_id="other")])
    feed.penalize("won-by-other", 0.0)  # already run out
    assert feed.next_candidate() is None
    assert feed.next_wakeup() is None
    feed.penalize("won-by-other", 30)
    wakeup = feed.next_wakeup()
    assert wakeup is not None and 25 < wakeup <= 30


def test_the_pending_heap_stays_bounded_when_nobody_asks_for_candidates() -> None:
    """A worker whose slots stay busy never asks for a candidate: the heap must not grow with history."""
    feed = make_feed()
    for i in range(2000):
        sid = f"s{i:04d}"
        feed.upsert(entry(sid, i))
        feed.upsert(entry(sid, i, phase="claimed", acceptor_id="other", claim_deadline=2**31))
        feed.upsert(entry(sid, i, session_status="terminated"))
    assert len(feed._pending) <= 2 * 64 + 1
    feed.upsert(entry("fresh", 5000))
    candidate = feed.next_candidate()
    assert candidate is not None and candidate.session_id == "fresh"


def test_worker_start_path_loads_no_cli_or_plugin_scanning_modules() -> None:
    """What ``worker start`` imports: not httpx's CLI (rich/click/pygments), not the simulator, and not
    importlib.metadata (pydantic's plugin scan); models still validate."""
    code = (
        "import sys\n"
        "from devin_outposts.cli import build_parser\n"
        "build_parser('worker')\n"
        "import devin_outposts.worker.runner\n"
        "from devin_outposts.api.models import QueueEntry\n"
        "QueueEntry.model_validate({'metadata': {'session_id': 's', 'outpost_id': 'o'}, 'status': {}})\n"
        "heavy = ('rich', 'click', 'pygments', 'importlib.metadata', 'zipfile', 'starlette', 'uvicorn',\n"
        "         'sqlite3', 'devin_outposts_sim')\n"
        "print(sorted(m for m in sys.modules if m in heavy or m.startswith(tuple(h + '.' for h in heavy))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_pydantic_loader_stand_in_hands_unknown_names_to_the_real_loader() -> None:
    """A later pydantic that imports another name from its plugin loader gets the real one, not an error."""
    code = (
        "import sys\n"
        "import devin_outposts.api.models\n"
        "from pydantic.plugin._loader import get_plugins\n"
        "assert list(get_plugins()) == [], 'the stand-in reports no plugins'\n"
        "assert 'importlib.metadata' not in sys.modules\n"
        "from pydantic.plugin._loader import PYDANTIC_ENTRY_POINT_GROUP\n"
        "print(PYDANTIC_ENTRY_POINT_GROUP, 'importlib.metadata' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["pydantic", "True"]


def test_states_read_as_their_values_in_logs() -> None:
    # Operators grep journals for "session X served: ..." (the upgrade scenario does): a state logs as
    # its value, whatever the Python version's default for str-mixin enums.
    from devin_outposts.core.claiming import ClaimOutcome
    from devin_outposts.worker.session import Stop

    assert "%s %s" % (SERVED, Stop.LAPSED) == "served lapsed"  # noqa: UP031 - the logging style
    assert f"{LOST} {ClaimOutcome.DEFER}" == "lost defer"
    assert [str(outcome) for outcome in (SERVED, FAILED, LOST)] == ["served", "failed", "lost"]
