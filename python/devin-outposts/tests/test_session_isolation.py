"""Confined sessions kept apart from each other, from the worker and from the host (issue 37), end to end:
real workers (root, and one run as ``nobody``), the simulator's stand-in ``devin-remote``, and a session that
runs isolation_probes.py, trying every way out a review tried: direct TCP on IPv4, IPv6 and mapped addresses,
proxy and CONNECT tricks, UDP, DNS, ICMP, namespace calls, every Unix socket it can find (a neighbour's egress
proxy above all), a host socket made after it started, the other session's directories and processes, and
the worker's own files.

The neighbour D's policy allows an upstream on 127.0.0.3 that the prober C's policy denies; C must reach it
by no route, and that upstream must record nothing. The tests judge by what the upstreams, the services and
the files on the host saw, and by what C got.

The workers' directories live under /var/lib here, not /tmp (every session has a /tmp of its own, which
would hide them anyway): so the hiding of the worker's data and working directories is what is tested.
Needs root and what the sandbox needs; skipped without, failed in CI.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devin_outposts_sim.remote import tools

from netpolicy_harness import WHY_NOT, UDPListener, Upstream, cannot_run, listening
from standin_harness import SESSION_PYTHON, Harness, running_harness

PROBES = Path(__file__).resolve().parent / "isolation_probes.py"
#: Where these tests keep the workers' directories (outside /tmp, see the module's docstring).
BASE = Path("/var/lib/devin-outposts-tests")
NEIGHBOUR_ONLY = "127.0.0.3"
#: Where the old egress sockets went when a session's directory had a path too long for one.
TMP = Path("/tmp")  # noqa: S108
#: Where a ``.pth`` file would run in every later start of the worker's Python.
SITE_PACKAGES = sysconfig.get_paths()["purelib"]


@dataclass
class Pair:
    """The prober C and its neighbour D, each with its policy, and what the tests need of them."""

    h: Harness
    prober: str
    neighbour: str
    allowed: Upstream
    neighbour_only: Upstream
    udp: UDPListener = field(default_factory=UDPListener)

    def connection(self, session_id: str) -> dict[str, Any]:
        return self.h.connection(session_id)


def policy_of(*addresses: str) -> dict[str, Any]:
    return {"enabled": True, "allow": [{"ipv4": f"{address}/32"} for address in addresses]}


def probe(
    h: Harness, session_id: str, plan: list[list[Any]], python: str = SESSION_PYTHON
) -> list[dict[str, Any]]:
    """Run isolation_probes.py in the session (copied into its working directory); its JSON lines."""
    h.sim.admin.add_calls(
        session_id,
        [
            tools.write("isolation_probes.py", PROBES.read_text()),
            tools.run([python, "isolation_probes.py", json.dumps(plan)], timeout=240),
        ],
    )
    calls = h.calls_done(session_id, timeout=300)
    output = str(calls[-1]["result"]["output"])
    assert calls[-1]["result"]["exit_code"] == 0, calls[-1]
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def by_kind(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The probes' results by a short key: the kind and its first argument."""
    return {" ".join(str(part) for part in line["probe"][:2]): line for line in lines}


def requirements() -> None:
    if WHY_NOT:
        cannot_run(f"sessions cannot be confined here: {WHY_NOT}")
    if os.geteuid() != 0:
        cannot_run("the isolation tests start workers as root and as nobody")


@pytest.fixture
def base() -> Iterator[Path]:
    requirements()
    BASE.mkdir(mode=0o755, exist_ok=True)
    directory = Path(tempfile.mkdtemp(dir=BASE, prefix="t"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def upstreams() -> Iterator[tuple[Upstream, Upstream]]:
    allowed, neighbour_only = Upstream("allowed"), Upstream("neighbour", host=NEIGHBOUR_ONLY)
    try:
        yield allowed, neighbour_only
    finally:
        allowed.close()
        neighbour_only.close()


def escape_plan(pair: Pair, worker_pid: int) -> list[list[Any]]:
    """What the prober tries (see isolation_probes.py)."""
    h = pair.h
    neighbour = pair.connection(pair.neighbour)
    own = pair.connection(pair.prober)
    port = pair.neighbour_only.port
    target = f"{NEIGHBOUR_ONLY}:{port}"
    data_dirs = sorted({str(Path(c["state_dir"]).parent.parent) for c in (neighbour, own)})
    binary = own["argv"][0] if own["argv"][0].startswith("/") else own["executable"]
    return [
        ["identity"],
        ["proxy", NEIGHBOUR_ONLY, port],
        ["proxy", "127.0.0.1", pair.allowed.port],
        ["connect_trick", "userinfo", f"CONNECT 127.0.0.1@{target} HTTP/1.1\r\nHost: {target}\r\n\r\n"],
        [
            "connect_trick",
            "host-header",
            f"GET http://127.0.0.1:{pair.allowed.port}/ HTTP/1.1\r\nHost: {target}\r\n\r\n",
        ],
        ["connect_trick", "absolute-denied", f"GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n\r\n"],
        [
            "connect_trick",
            "pipelined",
            f"CONNECT 127.0.0.1:{pair.allowed.port} HTTP/1.1\r\n\r\nCONNECT {target} HTTP/1.1\r\n\r\n",
        ],
        ["direct", NEIGHBOUR_ONLY, port],
        ["direct", f"::ffff:{NEIGHBOUR_ONLY}", port],
        ["direct", "::1", port],
        ["udp", "192.0.2.1", 53],
        ["udp", "127.0.0.1", pair.udp.port],
        ["resolve", "neighbour.invalid"],
        ["icmp", NEIGHBOUR_ONLY],
        ["namespace"],
        ["sockets", target],
        ["read", neighbour["state_dir"], neighbour["cwd"], *data_dirs, "/etc/shadow", "/run"],
        ["write", neighbour["state_dir"], neighbour["cwd"], *data_dirs, binary, SITE_PACKAGES, "/etc/passwd"],
        ["environ", pair.neighbour, h.token],
        ["signal", worker_pid, 1],
        ["direct", "127.0.0.1", int(neighbour["env"]["DEVIN_PTY_BRIDGE_PORT"])],
    ]


def start_pair(h: Harness, allowed: Upstream, neighbour_only: Upstream, *, workers: int, **how: Any) -> Pair:
    """D (allowed 127.0.0.1 and 127.0.0.3) and C (127.0.0.1 only), on one worker or on two (``how``: how
    :meth:`Harness.worker` starts them)."""
    if workers == 1:
        h.worker("w1", "--max-sessions", "2", **how)
    else:
        h.worker("w1", **how)
        h.worker("w2", **how)
    neighbour = h.sim.admin.enqueue(
        h.outpost.outpost_id, network_policy=policy_of("127.0.0.1", NEIGHBOUR_ONLY)
    )
    h.connection(neighbour.session_id)
    prober = h.sim.admin.enqueue(h.outpost.outpost_id, network_policy=policy_of("127.0.0.1"))
    h.connection(prober.session_id)
    return Pair(h, prober.session_id, neighbour.session_id, allowed, neighbour_only)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def holder(h: Harness, session_id: str) -> str:
    return str(h.claims(session_id, "claim")[0]["acceptor_id"])


def assert_apart(pair: Pair, results: dict[str, dict[str, Any]]) -> None:
    """What C got, and what the host saw: no way to the neighbour's upstream, its files, its processes."""
    neighbour = pair.connection(pair.neighbour)
    assert results[f"proxy {NEIGHBOUR_ONLY}"]["status"] == 403, results
    assert results["proxy 127.0.0.1"]["status"] == 200, results  # its own policy works
    tricks = [line for key, line in results.items() if key.startswith("connect_trick")]
    assert len(tricks) == 4 and all("neighbour:" not in line.get("reply", "") for line in tricks), tricks
    assert [line["status"] for line in tricks[:3]] == [403, 403, 403], tricks
    for key in (f"direct {NEIGHBOUR_ONLY}", f"direct ::ffff:{NEIGHBOUR_ONLY}", "direct ::1"):
        assert "neighbour:" not in results[key].get("reply", ""), results[key]
    assert "error" in results["udp 192.0.2.1"] and "error" in results[f"icmp {NEIGHBOUR_ONLY}"]
    assert pair.udp.datagrams == []  # the session's 127.0.0.1 is its own
    assert "error" in results["resolve neighbour.invalid"]
    namespace = results["namespace"]
    assert all(namespace[k] not in (0, "joined") for k in namespace), namespace
    assert results["upstream"]["neighbour_only_received"] == []  # by no route at all, while C probed
    sockets = results[f"sockets {NEIGHBOUR_ONLY}:{pair.neighbour_only.port}"]
    assert sockets["answered"] == [], sockets  # no socket it can find leads to the neighbour's proxy
    assert not any("egress" in path for path in sockets["found"]), sockets
    reads = results[f"read {neighbour['state_dir']}"]["read"]
    for path in (neighbour["state_dir"], neighbour["cwd"]):
        # Hidden (this worker's directories), or not its uid's to enter (another worker's).
        assert reads[path] in ("FileNotFoundError", "PermissionError"), reads
    assert reads["/run"] == "listed 1", reads  # the launcher's own files only
    assert reads["/etc/shadow"] == "PermissionError", reads
    writes = results[f"write {neighbour['state_dir']}"]["write"]
    assert "written" not in writes.values(), writes
    assert not (Path(SITE_PACKAGES) / "written-by-a-session").exists()  # no .pth the worker would run
    binary = Path(pair.connection(pair.prober)["argv"][0])
    assert digest(binary) == results["worker"]["binary_sha256"], binary  # what later sessions run
    assert results[f"environ {pair.neighbour}"]["carrying"] == [], results  # no neighbour's, no worker's
    pty = results["direct 127.0.0.1"]
    assert "error" in pty or not pty.get("reply"), pty
    worker_pid = results["worker"]["pid"]
    signals = results[f"signal {worker_pid}"]["signal"]  # no pid outside its namespace means anything
    assert signals[str(worker_pid)] == "ProcessLookupError", signals
    # Pid 1 is the session's own init: signals from inside its namespace do not reach it.
    assert signals["1"] in ("PermissionError", "signalled"), signals
    identity = results["identity"]
    assert identity["uid"] != 0 and identity["home"].endswith("/home"), identity
    assert max(identity["pids"]) < 100, identity  # its own process namespace: a handful of processes


def run_pair(
    h: Harness, allowed: Upstream, neighbour_only: Upstream, workers: int, **how: Any
) -> tuple[Pair, dict[str, Any]]:
    pair = start_pair(h, allowed, neighbour_only, workers=workers, **how)
    worker_pid = h.workers[0].pid
    before = digest(Path(pair.connection(pair.prober)["argv"][0]))
    try:
        results = by_kind(probe(h, pair.prober, escape_plan(pair, worker_pid)))
    finally:
        pair.udp.close()
    results["upstream"] = {"neighbour_only_received": list(neighbour_only.received)}
    results["worker"] = {"pid": worker_pid, "binary_sha256": before}
    # The neighbour still works, through its own proxy, to what only it may reach.
    [line] = probe(h, pair.neighbour, [["proxy", NEIGHBOUR_ONLY, neighbour_only.port]])
    assert line["status"] == 200 and line["reply"].startswith("neighbour:GET /from-session"), line
    return pair, results


@pytest.fixture
def harness(base: Path) -> Iterator[Harness]:
    with running_harness(base) as h:
        yield h


def test_two_confined_sessions_of_one_worker_are_apart(
    harness: Harness, upstreams: tuple[Upstream, Upstream]
) -> None:
    pair, results = run_pair(harness, *upstreams, workers=1)
    assert holder(harness, pair.prober) == holder(harness, pair.neighbour)
    assert_apart(pair, results)


def test_two_confined_sessions_of_two_workers_are_apart(
    harness: Harness, upstreams: tuple[Upstream, Upstream]
) -> None:
    pair, results = run_pair(harness, *upstreams, workers=2)
    assert holder(harness, pair.prober) != holder(harness, pair.neighbour)
    assert_apart(pair, results)


def test_a_non_root_workers_sessions_are_apart_and_cannot_touch_the_worker(
    harness: Harness, upstreams: tuple[Upstream, Upstream], base: Path
) -> None:
    """The worker role's default: a worker that is not root (here ``nobody``). Its sessions run as its own
    uid, kept apart by namespaces: the same probes find nothing of the neighbour's, and nothing of the
    worker's (its data directory with the binary cache and the other session's state is hidden, the
    binary it runs is read-only, its processes are out of reach)."""
    how = as_unprivileged(harness, base, "nobody")
    pair, results = run_pair(harness, *upstreams, workers=1, **how)
    assert_apart(pair, results)
    assert results["identity"]["uid"] == pwd.getpwnam("nobody").pw_uid


def as_unprivileged(h: Harness, base: Path, user: str) -> dict[str, Any]:
    """What runs the harness's workers as ``user``: an interpreter it can run (the system's, in a venv that
    loads this checkout's packages: this venv's interpreter lives under /root), ``setpriv``, and
    directories of its own."""
    account = pwd.getpwnam(user)
    venv = base / "venv"
    subprocess.run([SESSION_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    [site_packages] = venv.glob("lib/python3*/site-packages")
    (site_packages / "devin_outposts_checkout.pth").write_text(
        f"import site; site.addsitedir({SITE_PACKAGES!r})\n"
    )
    home = base / "w1" / "home"
    for path in (base / "w1", home, h.tmp / "tmpdir"):
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, account.pw_uid, account.pw_gid)
    prefix = ("setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--clear-groups")
    return {"python": str(venv / "bin" / "python"), "prefix": prefix, "env": {"HOME": str(home)}}


def test_a_host_socket_made_under_run_after_the_session_started_is_out_of_its_reach(harness: Harness) -> None:
    """A container engine started after the session, its socket under /run: the whole of /run is hidden, so
    the session does not find it, and the service sees no connection."""
    h = harness
    h.worker("w1")
    sid = h.sim.admin.enqueue(h.outpost.outpost_id, network_policy=policy_of("127.0.0.1")).session_id
    h.connection(sid)
    run_dir = Path(tempfile.mkdtemp(dir="/run", prefix="devin-outposts-test-engine-"))
    try:
        assert_unreachable(h, sid, [run_dir / "engine.sock"])
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def test_a_hidden_path_missing_when_the_session_started_stays_hidden(harness: Harness, base: Path) -> None:
    """A hidden directory (``--session-hide``) that did not exist when the session started, made later with
    a socket in it: its parent is frozen for the session, which does not find it."""
    h = harness
    engines = base / "engines"
    engines.mkdir()
    h.worker("w1", "--session-hide", str(engines / "late"))
    sid = h.sim.admin.enqueue(h.outpost.outpost_id, network_policy=policy_of("127.0.0.1")).session_id
    h.connection(sid)
    (engines / "late").mkdir()
    assert_unreachable(h, sid, [engines / "late" / "engine.sock"])


def assert_unreachable(h: Harness, session_id: str, paths: list[Path]) -> None:
    """Services listening on ``paths`` now: the session cannot connect to any, and none sees a connection."""
    services = [listening(path) for path in paths]
    try:
        [line] = probe(h, session_id, [["connect", *map(str, paths)]])
        for service in services:
            with pytest.raises(BlockingIOError):
                service.accept()  # nobody connected
    finally:
        for service in services:
            service.close()
    assert line["connect"] == {str(path): "FileNotFoundError" for path in paths}, line


def test_a_root_worker_without_ids_for_sessions_refuses_policy_sessions(harness: Harness) -> None:
    """Root, and neither --session-uid-range nor a subordinate range for root: a session whose policy is
    enforced is released with one line that says how to fix it (it would otherwise run with root's power
    over the host's files); a session without a policy is served."""
    subuid = Path("/etc/subuid")
    if subuid.exists() and any(line.startswith(("root:", "0:")) for line in subuid.read_text().splitlines()):
        pytest.skip("this host gives root subordinate ids (/etc/subuid)")
    h = harness
    worker = h.worker("w1", env={"DEVIN_WORKER_SESSION_UID_RANGE": ""})
    refused = h.sim.admin.enqueue(h.outpost.outpost_id, network_policy=policy_of("127.0.0.1")).session_id
    h.wait(lambda: h.released(refused), f"{refused} to be released")
    assert not h.sim.admin.connections(refused), "the refused session's remote must never start"
    served = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
    h.connection(served)
    lines = [line for line in worker.log().splitlines() if "cannot enforce it" in line]
    assert len(lines) == 1 and refused in lines[0], worker.log()
    assert "this worker runs as root" in lines[0] and "--session-uid-range" in lines[0], lines[0]


def test_no_egress_socket_or_directory_exists_anywhere(harness: Harness, base: Path) -> None:
    """A worker whose data directory's path is long (the egress socket's path used to be too long for a
    Unix socket there, so it went to /tmp/devin-egress-*, and a kill -9 left that directory behind): the
    proxy has no name, so nothing is made, neither while the session runs nor after the worker is killed and
    its successor takes the session back."""
    h = harness
    deep = base / ("d" * 60) / ("e" * 60)
    args = ("--cache-dir", str(deep / "cache"), "--acceptor-id", "vm-egress-test")
    before = set(TMP.glob("devin-egress-*"))
    worker = h.worker("w1", *args)
    sid = h.sim.admin.enqueue(h.outpost.outpost_id, network_policy=policy_of("127.0.0.1")).session_id
    first = h.connection(sid)
    made = sorted(p for p in deep.rglob("*") if p.is_socket())
    assert made == [] and set(TMP.glob("devin-egress-*")) == before, made
    worker.kill9()
    h.worker("w2", *args)
    h.wait(lambda: len(h.sim.admin.connections(sid)) > 1, f"{sid} to be taken back")
    assert h.sim.admin.connections(sid)[-1]["connection_id"] != first["connection_id"]
    assert sorted(p for p in deep.rglob("*") if p.is_socket()) == []
    assert set(TMP.glob("devin-egress-*")) == before
