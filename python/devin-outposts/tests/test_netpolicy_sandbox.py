"""The session sandbox (core/netpolicy: sandbox, launcher, entry, view, init, namespace, shim, stubdns,
probe), with real processes: the launcher as root and once as ``nobody``, a session that tries every way out
(netpolicy_session_checks.py), and on the host side a stand-in for the egress proxy behind a doorway and
upstreams on 127.0.0.1 that record what reaches them (netpolicy_harness.py). The tests judge by those
records and by what the session saw, only on loopback and in the namespaces the launcher makes.

Needs root (as CI runs), iproute2 and nftables; without them a test is skipped, and fails in CI
(``CI=true``).
"""

from __future__ import annotations

import ipaddress
import json
import os
import pwd
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Optional

import pytest

from devin_outposts.core.netpolicy import namespace, stubdns
from devin_outposts.core.netpolicy.policy import Policy
from devin_outposts.core.netpolicy.probe import probe_host
from devin_outposts.core.netpolicy.sandbox import (
    LAUNCHER_MODULE,
    SandboxExit,
    SandboxSpec,
    read_spec,
    sandbox_command,
    write_spec,
)

from netpolicy_harness import WHY_NOT, ConnectServer, UDPListener, Upstream, cannot_run, listening

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
CHECKS = HERE / "netpolicy_session_checks.py"
#: The unprivileged user of the one run that proves no privilege is needed, and a python3 every session can
#: run (this venv's may be under /tmp, which a session does not see, or under /root).
UNPRIVILEGED = "nobody"
NFT = shutil.which("nft", path="/usr/sbin:/sbin:/usr/bin") or "/usr/sbin/nft"
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
POLICY = {
    "enabled": True,
    "allow": [{"hostname": "allowed.test"}, {"hostname": None, "ipv4": "203.0.113.0/24"}],
}
RUN_SECONDS = 90


@pytest.fixture(scope="module")
def prerequisites() -> None:
    if WHY_NOT:
        cannot_run(f"sessions cannot be confined here: {WHY_NOT}")


@pytest.fixture(scope="module")
def shared_dir() -> Iterator[Path]:
    """A directory every test user can enter (pytest's tmp_path is root's alone)."""
    directory = Path(tempfile.mkdtemp(prefix="devin-outposts-sandbox-test-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class Launch:
    """One launcher's command line and the descriptors it inherits (closed by :meth:`close`)."""

    def __init__(self, argv: list[str], fds: Sequence[int]) -> None:
        self.argv, self.fds = argv, tuple(fds)

    def close(self) -> None:
        os.close(self.fds[0])  # the spec; the doorway's end is the scenario's


class Scenario:
    """The host side of one confined run: upstreams, the CONNECT stand-in behind a doorway, a UDP listener,
    the session's working and state directories."""

    def __init__(self, parent: Path, owner: Optional[str] = None) -> None:
        self.directory = Path(tempfile.mkdtemp(dir=parent, prefix="s"))
        self.directory.chmod(0o755)
        self.allowed, self.denied, self.gateway = Upstream("allowed"), Upstream("denied"), Upstream("gateway")
        self.udp = UDPListener()
        routes = {
            f"allowed.test:{self.allowed.port}": self.allowed.port,
            f"127.0.0.1:{self.gateway.port}": self.gateway.port,
        }
        self.proxy = ConnectServer(routes)
        self.work, self.state = self.directory / "work", self.directory / "state"
        for path, mode in ((self.work, 0o755), (self.state, 0o700)):
            path.mkdir()
            path.chmod(mode)
        for name, mode in (("home", 0o700), ("tmp", 0o1777), ("var-tmp", 0o1777)):
            (self.state / name).mkdir()
            (self.state / name).chmod(mode)
        if owner is not None:
            user = pwd.getpwnam(owner)
            for path in (self.work, self.state, *self.state.iterdir()):
                os.chown(path, user.pw_uid, user.pw_gid)

    def spec(self, **changes: Any) -> SandboxSpec:
        fields: dict[str, Any] = {
            "network_policy": POLICY,
            "gateway_url": f"ws://127.0.0.1:{self.gateway.port}/gateway",
            "workdir": str(self.work),
            "state_dir": str(self.state),
            **changes,
        }
        return SandboxSpec(**fields)

    def ports(self) -> str:
        return json.dumps(
            {
                "allowed": self.allowed.port,
                "denied": self.denied.port,
                "gateway": self.gateway.port,
                "host_udp": self.udp.port,
            }
        )

    def close(self) -> None:
        for closing in (self.proxy, self.allowed, self.denied, self.gateway, self.udp):
            closing.close()


def launcher_argv(
    scenario: Scenario,
    argv: list[str],
    *,
    python: Optional[str] = None,
    prelude: str = "",
    spec: Optional[SandboxSpec] = None,
) -> Launch:
    """The launcher's command line as the worker builds it. With ``python`` or ``prelude``, the interpreter
    is swapped: one that finds this checkout's package without the venv (``-I`` ignores PYTHONPATH) and runs
    ``prelude`` (test-only changes to the launcher, such as breaking the namespace) before its ``main``."""
    spec_fd, doorway_fd = write_spec(spec or scenario.spec()), scenario.proxy.launcher_end.fileno()
    full = sandbox_command(argv, spec_fd=spec_fd, doorway_fd=doorway_fd)
    if python is None and not prelude:
        return Launch(full, (spec_fd, doorway_fd))
    module = full.index(LAUNCHER_MODULE)  # after python -I -m
    code = (
        f"import sys; sys.path.insert(0, {str(SRC)!r})\n{prelude}\n"
        "from devin_outposts.core.netpolicy.sandbox import main\nsys.exit(main(sys.argv[1:]))"
    )
    return Launch([python or sys.executable, "-I", "-c", code, *full[module + 1 :]], (spec_fd, doorway_fd))


def run_confined(
    launch: Launch, user: Optional[str] = None, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    argv = launch.argv
    if user is not None:
        argv = ["setpriv", f"--reuid={user}", f"--regid={pwd.getpwnam(user).pw_gid}", "--clear-groups", *argv]
    try:
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=RUN_SECONDS,
            check=False,
            pass_fds=launch.fds,
            **kwargs,
        )
    finally:
        launch.close()


def session_checks(shared_dir: Path, user: Optional[str]) -> tuple[Scenario, dict[str, Any]]:
    scenario = Scenario(shared_dir, owner=user)
    python = SYSTEM_PYTHON if user else None
    shutil.copy(
        CHECKS, scenario.work / CHECKS.name
    )  # the session's /tmp is its own: it runs from its workdir
    checks = [SYSTEM_PYTHON, str(scenario.work / CHECKS.name), scenario.ports()]
    done = run_confined(
        launcher_argv(scenario, checks, python=python),
        user,
        env={**os.environ, "SANDBOX_TEST_MARKER": "kept"},
    )
    assert done.returncode == 0, f"the confined session failed ({done.returncode}): {done.stderr[-3000:]}"
    return scenario, json.loads(done.stdout)


@pytest.fixture(scope="module", params=["root", UNPRIVILEGED])
def confined(
    request: pytest.FixtureRequest, prerequisites: None, shared_dir: Path
) -> Iterator[tuple[Scenario, dict[str, Any], str]]:
    """One confined run of netpolicy_session_checks.py per user (root, then nobody)."""
    user = None if request.param == "root" else request.param
    if user is not None and not os.access(SYSTEM_PYTHON, os.X_OK):
        cannot_run(f"no {SYSTEM_PYTHON} for the unprivileged run")
    scenario, results = session_checks(shared_dir, user)
    try:
        yield scenario, results, request.param
    finally:
        scenario.close()


# --- what the confined session got ------------------------------------------------------------------------


def test_session_sees_its_own_ids_and_environment(confined: tuple[Scenario, dict[str, Any], str]) -> None:
    dummy_scenario, results, user = confined
    expected = pwd.getpwnam(user)
    assert (results["uid"], results["gid"]) == (expected.pw_uid, expected.pw_gid)
    assert results["marker"] == "kept"  # the launcher's environment reaches the session
    assert results["proxy_env"] == {
        "HTTPS_PROXY": "http://127.0.0.1:3128",
        "HTTP_PROXY": "http://127.0.0.1:3128",
        "ALL_PROXY": "http://127.0.0.1:3128",
        "https_proxy": "http://127.0.0.1:3128",
        "NO_PROXY": "localhost,127.0.0.1,::1",
        "no_proxy": "localhost,127.0.0.1,::1",
    }
    assert results["links"] == ["lo"]
    assert results["home"] == str(dummy_scenario.state / "home")  # its own, in its state directory


def test_a_proxy_aware_client_reaches_an_allowed_upstream(
    confined: tuple[Scenario, dict[str, Any], str],
) -> None:
    scenario, results, dummy_user = confined
    assert results["explicit_allowed"]["status"].startswith("HTTP/1.1 200")
    assert results["explicit_allowed"]["reply"] == "allowed:explicit-hello"
    assert f"CONNECT allowed.test:{scenario.allowed.port} HTTP/1.1" in scenario.proxy.connects()
    assert b"explicit-hello" in scenario.allowed.received


def test_a_refused_connect_comes_back_to_a_proxy_aware_client(
    confined: tuple[Scenario, dict[str, Any], str],
) -> None:
    scenario, results, dummy_user = confined
    assert results["explicit_denied"]["status"].startswith("HTTP/1.1 403")
    assert scenario.denied.received == []


def test_proxy_unaware_clients_are_redirected_as_connect_name_port(
    confined: tuple[Scenario, dict[str, Any], str],
) -> None:
    """By the stub DNS's fake address, by the SNI of a ClientHello and by an HTTP Host, all to an address the
    session chose (192.0.2.10): each arrives as CONNECT allowed.test:<port>, and the bytes reach the
    upstream."""
    scenario, results, dummy_user = confined
    port = scenario.allowed.port
    assert results["transparent_by_name"] == "allowed:transparent-hello"
    assert results["transparent_http_host"].startswith("allowed:GET / HTTP/1.1\r\nHost: allowed.test")
    assert results["transparent_sni"].startswith("allowed:\x16\x03")  # the ClientHello, passed on whole
    assert scenario.proxy.connects().count(f"CONNECT allowed.test:{port} HTTP/1.1") >= 5
    received = scenario.allowed.received
    assert b"transparent-hello" in received
    assert any(data.startswith(b"\x16\x03") for data in received)
    assert any(data.startswith(b"GET / HTTP/1.1\r\nHost: allowed.test") for data in received)


def test_an_ip_literal_with_nothing_to_peek_is_asked_for_as_that_literal(
    confined: tuple[Scenario, dict[str, Any], str],
) -> None:
    scenario, results, dummy_user = confined
    assert f"CONNECT 192.0.2.10:{scenario.allowed.port} HTTP/1.1" in scenario.proxy.connects()
    assert results["transparent_ip_literal"] == ""  # refused by the stand-in: the shim closed the client
    assert not any(data.startswith(b"SSH-2.0") for data in scenario.allowed.received)


def test_the_gateway_on_the_hosts_loopback_is_reached(confined: tuple[Scenario, dict[str, Any], str]) -> None:
    """The simulator's gateway is on the host's 127.0.0.1; a client that skips the proxy (NO_PROXY names
    127.0.0.1) still reaches it, through the redirect and the egress proxy."""
    scenario, results, dummy_user = confined
    assert results["gateway_direct"] == "gateway:gateway-hello"
    assert f"CONNECT 127.0.0.1:{scenario.gateway.port} HTTP/1.1" in scenario.proxy.connects()


def test_ipv6_connections_are_redirected_too(confined: tuple[Scenario, dict[str, Any], str]) -> None:
    dummy_scenario, results, dummy_user = confined
    if isinstance(results["ipv6_fake"], dict):
        cannot_run(f"no IPv6 in the session's namespace here: {results['ipv6_fake']}")
    assert results["ipv6_fake"] == "allowed:transparent-v6-hello"


def test_udp_raw_and_direct_connections_do_not_leave(confined: tuple[Scenario, dict[str, Any], str]) -> None:
    scenario, results, dummy_user = confined
    assert results["udp_out"]["error"] == "PermissionError"
    assert results["raw_socket"]["error"] == "PermissionError"
    # The session's 127.0.0.1 is its own: the host's upstream there is out of reach.
    assert results["direct_to_host_loopback"]["error"] == "ConnectionRefusedError"
    assert scenario.denied.received == []
    # A datagram to the host listener's port stays on the session's own loopback.
    assert results["dns_to_host_port"] == "sent"
    assert scenario.udp.datagrams == []


def test_dns_answers_allowed_names_only_and_never_forwards(
    confined: tuple[Scenario, dict[str, Any], str],
) -> None:
    scenario, results, dummy_user = confined
    answer = results["dns_allowed_a"]
    assert answer["rcode"] == stubdns.NOERROR and answer["same_id"]
    assert ipaddress.ip_address(answer["address"]) in namespace.FAKE_POOL_V4
    assert results["dns_denied"]["rcode"] == stubdns.REFUSED and results["dns_denied"]["answers"] == 0
    assert results["getaddrinfo_denied"]["error"] == "gaierror"
    assert not any("denied" in line for line in scenario.proxy.connects() if "denied.test:" not in line)
    assert scenario.udp.datagrams == []


def test_the_session_cannot_change_the_namespace(confined: tuple[Scenario, dict[str, Any], str]) -> None:
    dummy_scenario, results, dummy_user = confined
    for attempt in ("nft_flush", "ip_route_add", "ip_link_add"):
        assert results[attempt]["returncode"] not in (0, None), (attempt, results[attempt])
    assert results["udp_out_after"]["error"] == "PermissionError"
    assert results["transparent_after"] == "allowed:transparent-hello"


def test_host_services_that_act_outside_are_hidden(confined: tuple[Scenario, dict[str, Any], str]) -> None:
    """systemd, D-Bus, the users' buses and the container engines resolve names and start processes outside
    the namespace, and they keep their sockets in /run: the session's /run holds only the launcher's own
    files (the host's does not)."""
    dummy_scenario, results, dummy_user = confined
    assert results["run"] == ["devin-outposts-session"]
    assert len(os.listdir("/run")) > 1


# --- the launcher's own behaviour -------------------------------------------------------------------------


@pytest.fixture
def scenario(prerequisites: None, shared_dir: Path) -> Iterator[Scenario]:
    made = Scenario(shared_dir)
    try:
        yield made
    finally:
        made.close()


def test_the_exit_status_passes_through(scenario: Scenario) -> None:
    done = run_confined(launcher_argv(scenario, ["sh", "-c", "exit 7"]))
    assert done.returncode == 7, done.stderr
    done = run_confined(launcher_argv(scenario, ["sh", "-c", "kill -TERM $$"]))
    assert done.returncode == -signal.SIGTERM, done.stderr


@pytest.mark.parametrize("to_group", [True, False], ids=["group", "launcher-alone"])
def test_sigterm_ends_the_session_once(scenario: Scenario, to_group: bool) -> None:
    """The worker signals the process group; systemd's KillMode=mixed signals the launcher alone. Either
    way the session gets SIGTERM, once, and its exit status is the launcher's."""
    record = scenario.work / "signals"
    session = (
        "import signal, sys, time\n"
        f"record = open({str(record)!r}, 'a')\n"
        "def on_term(signum, frame):\n"
        "    record.write('TERM\\n'); record.flush()\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
        "print('ready', flush=True)\n"
        "signal.sigwait({signal.SIGTERM})\n"
        "on_term(signal.SIGTERM, None)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})\n"  # a second one pending comes now
        "time.sleep(0.5)\n"  # or meanwhile
        "sys.exit(3)\n"
    )
    launch = launcher_argv(scenario, [SYSTEM_PYTHON, "-c", session])
    proc = subprocess.Popen(
        launch.argv,
        pass_fds=launch.fds,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    launch.close()
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        if to_group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(RUN_SECONDS) == 3
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert record.read_text() == "TERM\n"


def test_the_shim_and_init_end_with_the_session(scenario: Scenario) -> None:
    """Beside the session run the launcher's two other processes: the shim and the session's init. Both are
    gone once the launcher has exited, and so is a process the session left running."""
    left = scenario.work / "left.pid"
    session = f"sleep 300 & echo $! > {left}; read line"
    launch = launcher_argv(scenario, ["sh", "-c", session])
    proc = subprocess.Popen(
        launch.argv,
        pass_fds=launch.fds,
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    launch.close()
    try:
        _wait_for(lambda: left.exists() and left.read_text().strip() != "", "the session to start")
        children = _children(proc.pid)
        assert len(children) == 2, children  # the shim and init
        # The shim, which reads the session's bytes, holds no capability and can gain none.
        statuses = [_status(pid) for pid in children]
        shims = [st for st in statuses if st.get("NoNewPrivs") == "1"]
        assert len(shims) == 1 and shims[0]["CapEff"] == shims[0]["CapPrm"] == "0000000000000000", statuses
        assert proc.stdin is not None
        proc.stdin.write(b"end\n")
        proc.stdin.close()
        assert proc.wait(RUN_SECONDS) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for pid in children:
        _wait_for(lambda pid=pid: not Path(f"/proc/{pid}").exists(), f"pid {pid} to end")
    sleepers = [pid for pid in _pids() if _command(pid).startswith("sleep\x00300")]
    assert sleepers == []  # the session's own leftover ended with its namespace


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict((key, value.strip()) for key, dummy, value in (line.partition(":") for line in lines))


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


def _children(parent: int) -> list[int]:
    found = []
    for pid in _pids():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            found.append(pid)
    return found


def _wait_for(condition: Any, what: str, seconds: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("prelude", "found"),
    [
        pytest.param(
            "import subprocess\n"
            "from devin_outposts.core.netpolicy import namespace\n"
            "made = namespace.set_up\n"
            "def set_up(*args, **kwargs):\n"
            "    layout = made(*args, **kwargs)\n"
            "    for command in (['ip', 'link', 'add', 'leak0', 'type', 'veth', 'peer', 'name', 'leak1'],\n"
            "                    ['ip', 'link', 'set', 'leak0', 'up'],\n"
            "                    ['ip', 'link', 'set', 'leak1', 'up'],\n"
            "                    ['ip', 'route', 'add', '192.0.2.0/24', 'dev', 'leak0']):\n"
            "        subprocess.run(command, check=True)\n"
            "    return layout\n"
            "namespace.set_up = set_up\n",
            "links other than lo",
            id="a-link-with-a-route-out",
        ),
        pytest.param(
            "from devin_outposts.core.netpolicy import namespace\n"
            "made = namespace.ruleset\n"
            "namespace.ruleset = lambda port: made(port).replace('fib daddr type local accept', 'accept')\n",
            "could be sent",
            id="no-drop",
        ),
        pytest.param(
            "from devin_outposts.core.netpolicy import namespace\n"
            "made = namespace.ruleset\n"
            "namespace.ruleset = lambda port: made(port).replace('meta l4proto tcp redirect',\n"
            "                                                    'meta l4proto tcp "
            "return #')\n",
            "did not reach the redirect",
            id="no-redirect",
        ),
    ],
)
def test_the_preflight_refuses_a_namespace_with_a_way_out(
    scenario: Scenario, prelude: str, found: str
) -> None:
    marker = scenario.work / "session-ran"
    done = run_confined(launcher_argv(scenario, ["touch", str(marker)], prelude=prelude))
    assert done.returncode == SandboxExit.NOT_ISOLATED, done.stderr
    assert found in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not marker.exists()


def test_the_launcher_refuses_the_hosts_own_namespace(scenario: Scenario) -> None:
    """A launcher whose namespaces were not made (here: the step skipped, root in the host's namespaces)
    changes nothing of the host's."""
    before = subprocess.run([NFT, "list", "ruleset"], capture_output=True, text=True, check=True).stdout
    prelude = (
        "from devin_outposts.core.netpolicy import entry\nentry.enter = lambda *a, **k: entry.Ids(0, 0)\n"
    )
    done = run_confined(
        launcher_argv(scenario, ["touch", str(scenario.work / "session-ran")], prelude=prelude)
    )
    assert done.returncode == SandboxExit.SETUP_FAILED, done.stderr
    assert "not a fresh one" in done.stderr
    assert (
        subprocess.run([NFT, "list", "ruleset"], capture_output=True, text=True, check=True).stdout == before
    )
    assert not (scenario.work / "session-ran").exists()


def test_a_hidden_host_socket_cannot_be_reached_even_if_made_after_launch(scenario: Scenario) -> None:
    """A host service's socket under a hidden path (here a test directory named in the spec), one that
    exists before the session starts and one made while it runs, and one in a hidden directory that did not
    exist at the start (its parent is frozen): the session connects to none of them, the services see no
    connection, and the host still has every socket."""
    service_dir, late_dir = scenario.directory / "service", scenario.directory / "late" / "engine"
    service_dir.mkdir()
    early = listening(service_dir / "early.sock")
    client = (
        "import os, socket, sys, time\n"
        "print('started', flush=True)\n"
        "sys.stdin.readline()\n"
        "for path in sys.argv[1:]:\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        "    try:\n"
        "        s.connect(path)\n"
        "        print(path, 'connected')\n"
        "    except OSError as exc:\n"
        "        print(path, type(exc).__name__)\n"
    )
    paths = [service_dir / "early.sock", service_dir / "late.sock", late_dir / "engine.sock"]
    spec = scenario.spec(hide=[str(service_dir), str(late_dir)])
    launch = launcher_argv(scenario, [SYSTEM_PYTHON, "-c", client, *map(str, paths)], spec=spec)
    proc = subprocess.Popen(
        launch.argv, pass_fds=launch.fds, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    launch.close()
    services = [early]
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "started"
        services.append(listening(service_dir / "late.sock"))
        late_dir.mkdir(parents=True)
        services.append(listening(late_dir / "engine.sock"))
        proc.stdin.write("go\n")
        proc.stdin.close()
        output = proc.stdout.read()
        assert proc.wait(RUN_SECONDS) == 0
        for service in services:
            with pytest.raises(BlockingIOError):
                service.accept()  # nobody connected
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for service in services:
            service.close()
    assert sorted(output.split("\n")[:-1]) == sorted(f"{path} FileNotFoundError" for path in paths), output
    assert all(path.exists() for path in paths)


def test_the_launcher_needs_a_mount_namespace_of_its_own(scenario: Scenario) -> None:
    prelude = "from devin_outposts.core.netpolicy import entry\nentry.CLONE_NEWNS = 0\n"
    done = run_confined(
        launcher_argv(scenario, ["touch", str(scenario.work / "session-ran")], prelude=prelude)
    )
    assert done.returncode == SandboxExit.NAMESPACES, done.stderr
    assert "private" in done.stderr
    assert not (scenario.work / "session-ran").exists()


def test_system_paths_are_never_hidden_nor_a_sessions_own(scenario: Scenario) -> None:
    """A worker whose home is ``/`` would ask to hide ``/``: the session still runs, and sees the system. A
    worker started in ``/`` without ``--workdir`` would give the session ``/`` to write: refused, and nothing
    runs."""
    done = run_confined(
        launcher_argv(scenario, ["ls", "/usr/bin/env"], spec=scenario.spec(hide=("/", "/usr")))
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "/usr/bin/env"
    marker = scenario.work / "session-ran"
    done = run_confined(launcher_argv(scenario, ["touch", str(marker)], spec=scenario.spec(workdir="/")))
    assert done.returncode == SandboxExit.SETUP_FAILED, done.stderr
    assert "/ cannot be a session's own directory" in done.stderr
    assert not marker.exists()


def test_a_missing_program_is_reported_and_nothing_runs(scenario: Scenario) -> None:
    done = run_confined(launcher_argv(scenario, ["/nonexistent/devin-remote"]))
    assert done.returncode == SandboxExit.SESSION_NOT_STARTED
    assert "/nonexistent/devin-remote" in done.stderr


def _fake_python(tmp_path: Path, body: str) -> str:
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\n{body}\n")
    fake.chmod(0o755)
    return str(fake)


def test_probe_says_yes_here_and_why_not_elsewhere(prerequisites: None, tmp_path: Path) -> None:
    assert probe_host() is None
    refusing = _fake_python(
        tmp_path,
        "echo \"devin-outposts sandbox: cannot create the session's namespaces: unshare(user, mount, ipc, "
        'net): Operation not permitted" >&2; exit 246',
    )
    reason = probe_host(python=refusing)
    assert reason is not None and "Operation not permitted" in reason and "namespace" in reason


@pytest.mark.parametrize(
    ("body", "names"),
    [
        # What a worker unit's hardening does to the trial session (seen under systemd on Debian 12 and 13).
        ("kill -SYS $$", ["SIGSYS", "SystemCallFilter=", "@mount"]),
        (
            "echo 'devin-outposts sandbox: cannot set up the network namespace: OSError: [Errno 97] "
            "Address family not supported by protocol' >&2; exit 242",
            ["RestrictAddressFamilies=", "AF_NETLINK", "Errno 97"],
        ),
    ],
)
def test_probe_names_the_systemd_directive_that_stops_it(tmp_path: Path, body: str, names: list[str]) -> None:
    reason = str(probe_host(python=_fake_python(tmp_path, body)))
    assert all(name in reason for name in names), reason


# --- the pure parts -----------------------------------------------------------------------------------------


def test_spec_round_trip() -> None:
    spec = SandboxSpec(
        POLICY, "wss://gw.example.com/x", workdir="/w", state_dir="/s", hide=("/h",), session_uid=7
    )
    read = read_spec(write_spec(spec))
    assert read == spec
    policy = read.policy()
    assert policy.enforced and policy.gateway == ("gw.example.com", 443)
    assert policy.check_name("allowed.test", 1).allowed and not policy.check_name("denied.test", 1).allowed
    for bad in (
        "[]",
        '{"workdir": "relative", "state_dir": "/s"}',
        '{"network_policy": 3, "workdir": "/w", "state_dir": "/s"}',
        '{"workdir": "/w", "state_dir": "/s", "hide": ["relative"]}',
    ):
        descriptor = os.memfd_create("bad")
        os.write(descriptor, bad.encode())
        os.lseek(descriptor, 0, os.SEEK_SET)
        with pytest.raises(ValueError, match="sandbox spec"):
            read_spec(descriptor)


def _query(name: str, qtype: int, *, ident: int = 0x1234, qclass: int = 1) -> bytes:
    labels = b"".join(bytes([len(part)]) + part.encode() for part in name.split(".")) + b"\0"
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 1) + labels + struct.pack("!HH", qtype, qclass)


def test_stub_resolver_answers() -> None:
    policy = Policy.from_spec(POLICY, "wss://gateway.example.com/g")
    book = stubdns.FakeAddressBook(namespace.FAKE_POOL_V4, namespace.FAKE_POOL_V6)
    refused: list[str] = []
    resolver = stubdns.StubResolver(policy, book, on_refused=lambda name, decision: refused.append(name))

    def ask(name: str, qtype: int, **kwargs: int) -> tuple[int, int, bytes]:
        reply = resolver.answer(_query(name, qtype, **kwargs))
        assert reply is not None
        dummy_id, flags, dummy_qd, answers, dummy_ns, dummy_ar = struct.unpack_from("!HHHHHH", reply)
        return flags & 0xF, answers, reply

    rcode, answers, reply = ask("Allowed.Test", stubdns.TYPE_A)
    assert (rcode, answers) == (stubdns.NOERROR, 1)
    assert b"Allowed" in reply  # the question as asked (0x20 case randomisation)
    first = ipaddress.IPv4Address(reply[-4:])
    assert first in namespace.FAKE_POOL_V4 and book.name_for(first) == "allowed.test"
    assert ipaddress.IPv4Address(ask("allowed.test", stubdns.TYPE_A)[2][-4:]) == first  # stable
    six = ipaddress.IPv6Address(ask("allowed.test", stubdns.TYPE_AAAA)[2][-16:])
    assert book.name_for(six) == "allowed.test"
    assert ask("gateway.example.com", stubdns.TYPE_A)[:2] == (stubdns.NOERROR, 1)  # the gateway's name
    assert ask("allowed.test", 16)[:2] == (stubdns.NOERROR, 0)  # TXT: no records, no error
    assert ask("secret.attacker.test", stubdns.TYPE_A)[:2] == (stubdns.REFUSED, 0)
    assert ask("secret.attacker.test", stubdns.TYPE_A)[:2] == (stubdns.REFUSED, 0)
    assert refused == ["secret.attacker.test"]  # logged once
    assert ask("allowed.test", stubdns.TYPE_A, qclass=3)[0] == stubdns.REFUSED
    assert resolver.answer(b"\x00\x01") is None
    assert book.name_for(namespace.FAKE_POOL_V4[500]) is None


def test_ruleset_redirects_loopback_only_for_a_loopback_gateway() -> None:
    assert "dport" not in namespace.ruleset(None)
    assert "ip daddr 127.0.0.0/8 tcp dport 8080 redirect to :3129" in namespace.ruleset(8080)
    assert namespace.loopback_gateway(("127.0.0.1", 80)) == ("127.0.0.1", 80)
    assert namespace.loopback_gateway(("localhost", 80)) == ("localhost", 80)
    assert namespace.loopback_gateway(("gateway.example.com", 443)) is None
    assert namespace.loopback_gateway(None) is None
