"""The session sandbox (core/netpolicy: sandbox, launcher, namespace, shim, stubdns, probe), with real
processes: the launcher under ``unshare``, as root and once as ``nobody``, a session that tries every way out
(netpolicy_session_checks.py), and on the host side a stand-in for the egress proxy on a Unix socket and
upstreams on 127.0.0.1 that record what reaches them (netpolicy_harness.py). The tests judge by those
records and by what the session saw, only on loopback and in the namespaces the launcher makes.

Needs root (as CI runs), util-linux's unshare, iproute2 and nftables; without them a test is skipped, and
fails in CI (``CI=true``).
"""

from __future__ import annotations

import ipaddress
import json
import os
import pwd
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from devin_outposts.core.netpolicy import namespace, stubdns
from devin_outposts.core.netpolicy.policy import Policy
from devin_outposts.core.netpolicy.probe import probe_host
from devin_outposts.core.netpolicy.sandbox import (
    LAUNCHER_MODULE,
    SandboxExit,
    read_policy_file,
    sandbox_argv,
    write_policy_file,
)

from netpolicy_harness import WHY_NOT, ConnectServer, UDPListener, Upstream, cannot_run

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
CHECKS = HERE / "netpolicy_session_checks.py"
#: The unprivileged user of the one run that proves no privilege is needed, and a python3 it can run.
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
    shutil.copy(CHECKS, directory / CHECKS.name)
    (directory / CHECKS.name).chmod(0o644)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class Scenario:
    """The host side of one confined run: upstreams, the CONNECT stand-in, a UDP listener, the policy file."""

    def __init__(self, parent: Path, owner: Optional[str] = None) -> None:
        directory = Path(
            tempfile.mkdtemp(dir=parent, prefix="s")
        )  # short: a Unix socket's path is < 108 bytes
        self.directory = directory
        self.allowed, self.denied, self.gateway = Upstream("allowed"), Upstream("denied"), Upstream("gateway")
        self.udp = UDPListener()
        routes = {
            f"allowed.test:{self.allowed.port}": self.allowed.port,
            f"127.0.0.1:{self.gateway.port}": self.gateway.port,
        }
        self.proxy = ConnectServer(directory / "egress.sock", routes)
        self.policy_file = write_policy_file(
            directory / "policy.json", POLICY, f"ws://127.0.0.1:{self.gateway.port}/gateway"
        )
        if owner is not None:
            user = pwd.getpwnam(owner)
            for path in (directory, self.proxy.path, self.policy_file):
                os.chown(path, user.pw_uid, user.pw_gid)

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
    scenario: Scenario, argv: list[str], *, python: Optional[str] = None, prelude: str = ""
) -> list[str]:
    """``sandbox_argv`` as the worker builds it. With ``python`` or ``prelude``, the interpreter is swapped:
    one that finds this checkout's package without the venv (``-I`` ignores PYTHONPATH) and runs ``prelude``
    (test-only changes to the launcher, such as breaking the namespace) before the launcher's ``main``."""
    full = sandbox_argv(argv, scenario.proxy.path, scenario.policy_file)
    if python is None and not prelude:
        return full
    module = full.index(LAUNCHER_MODULE)  # after python -I -m
    code = (
        f"import sys; sys.path.insert(0, {str(SRC)!r})\n{prelude}\n"
        "from devin_outposts.core.netpolicy.sandbox import main\nsys.exit(main(sys.argv[1:]))"
    )
    return [*full[: module - 3], python or sys.executable, "-I", "-c", code, *full[module + 1 :]]


def run_confined(
    argv: list[str], user: Optional[str] = None, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    if user is not None:
        argv = ["setpriv", f"--reuid={user}", f"--regid={pwd.getpwnam(user).pw_gid}", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=RUN_SECONDS, check=False, **kwargs)


def session_checks(shared_dir: Path, user: Optional[str]) -> tuple[Scenario, dict[str, Any]]:
    scenario = Scenario(shared_dir, owner=user)
    python = SYSTEM_PYTHON if user else None
    checks = [python or sys.executable, str(shared_dir / CHECKS.name), scenario.ports()]
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
    127.0.0.1) still reaches it, through the redirect and the egress socket."""
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
    """systemd, D-Bus and the users' buses resolve names and start processes outside the namespace: the
    session finds their directories empty (the host's are not)."""
    dummy_scenario, results, dummy_user = confined
    assert results["hidden"] == {path: [] for path in results["hidden"]}
    assert os.path.isdir("/run/systemd") == ("/run/systemd" in results["hidden"])


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
    record = scenario.directory / "signals"
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
    proc = subprocess.Popen(
        launcher_argv(scenario, [sys.executable, "-c", session]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
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


def test_the_shim_ends_with_the_session(scenario: Scenario) -> None:
    """The session lists the launcher's other children (the shim); once the launcher has exited, none is
    left."""
    siblings = (
        "import os\n"
        "def parent(pid):\n"
        "    try:\n"
        "        return int(open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1])\n"
        "    except (OSError, ValueError, IndexError):\n"
        "        return None\n"
        "launcher = os.getppid()\n"
        "print(' '.join(e for e in os.listdir('/proc') if e.isdigit() and int(e) != os.getpid()"
        " and parent(e) == launcher))\n"
    )
    done = run_confined(launcher_argv(scenario, [sys.executable, "-c", siblings]))
    assert done.returncode == 0, done.stderr
    shim_pids = [int(pid) for pid in done.stdout.split()]
    assert len(shim_pids) == 1  # the shim was running beside the session
    assert not Path(f"/proc/{shim_pids[0]}").exists()


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
    marker = scenario.directory / "session-ran"
    done = run_confined(launcher_argv(scenario, ["touch", str(marker)], prelude=prelude))
    assert done.returncode == SandboxExit.NOT_ISOLATED, done.stderr
    assert found in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not marker.exists()


def test_the_launcher_refuses_the_hosts_own_namespace(scenario: Scenario) -> None:
    """Started without ``unshare`` (here: root in the host's namespaces), it changes nothing."""
    before = subprocess.run([NFT, "list", "ruleset"], capture_output=True, text=True, check=True).stdout
    argv = sandbox_argv(["true"], scenario.proxy.path, scenario.policy_file)
    done = run_confined(argv[argv.index("--") + 1 :])
    assert done.returncode == SandboxExit.SETUP_FAILED, done.stderr
    assert "not a fresh one" in done.stderr
    assert (
        subprocess.run([NFT, "list", "ruleset"], capture_output=True, text=True, check=True).stdout == before
    )


def test_a_hidden_host_socket_cannot_be_reached(scenario: Scenario) -> None:
    """A host service's socket under a hidden path (here a test directory in place of /run/dbus) is covered
    for the session, and the service sees no connection; the host still sees the socket."""
    service_dir = scenario.directory / "service"
    service_dir.mkdir()
    service = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    service.bind(str(service_dir / "bus.sock"))
    service.listen(4)
    service.setblocking(False)
    prelude = (
        "from devin_outposts.core.netpolicy import namespace\n"
        "made = namespace.hide_host_services\n"
        f"namespace.hide_host_services = lambda keep: made(keep, hidden=[{str(service_dir)!r}])\n"
    )
    client = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        "    s.connect(sys.argv[1])\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    try:
        done = run_confined(
            launcher_argv(
                scenario, [sys.executable, "-c", client, str(service_dir / "bus.sock")], prelude=prelude
            )
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "FileNotFoundError"
        with pytest.raises(BlockingIOError):
            service.accept()
        assert (service_dir / "bus.sock").exists()
    finally:
        service.close()


def test_the_launcher_needs_a_mount_namespace_of_its_own(scenario: Scenario) -> None:
    argv = launcher_argv(scenario, ["touch", str(scenario.directory / "session-ran")])
    argv.remove("--mount")
    done = run_confined(argv)
    assert done.returncode == SandboxExit.SETUP_FAILED, done.stderr
    assert "unshare --mount" in done.stderr
    assert not (scenario.directory / "session-ran").exists()


def test_a_missing_program_is_reported_and_nothing_runs(scenario: Scenario) -> None:
    done = run_confined(launcher_argv(scenario, ["/nonexistent/devin-remote"]))
    assert done.returncode == SandboxExit.SESSION_NOT_STARTED
    assert "/nonexistent/devin-remote" in done.stderr


def test_probe_says_yes_here_and_why_not_elsewhere(prerequisites: None, tmp_path: Path) -> None:
    assert probe_host() is None
    assert "unshare is not installed" in str(probe_host(unshare=str(tmp_path / "none")))
    refusing = tmp_path / "unshare"
    refusing.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    refusing.chmod(0o755)
    reason = probe_host(unshare=str(refusing))
    assert reason is not None and "Operation not permitted" in reason and "namespace" in reason


def _fake_unshare(tmp_path: Path, body: str) -> str:
    fake = tmp_path / "unshare"
    fake.write_text(f"#!/bin/sh\n{body}\n")
    fake.chmod(0o755)
    return str(fake)


@pytest.mark.parametrize(
    ("body", "names"),
    [
        # What a worker unit's hardening does to the trial session (seen under systemd on Debian 12 and 13).
        ("kill -SYS $$", ["SIGSYS", "SystemCallFilter=", "@mount"]),
        (
            "echo 'OSError: [Errno 97] Address family not supported by protocol' >&2; exit 1",
            ["RestrictAddressFamilies=", "AF_NETLINK", "Errno 97"],
        ),
    ],
)
def test_probe_names_the_systemd_directive_that_stops_it(tmp_path: Path, body: str, names: list[str]) -> None:
    reason = str(probe_host(unshare=_fake_unshare(tmp_path, body)))
    assert all(name in reason for name in names), reason


# --- the pure parts -----------------------------------------------------------------------------------------


def test_policy_file_round_trip(tmp_path: Path) -> None:
    path = write_policy_file(tmp_path / "policy.json", POLICY, "wss://gw.example.com/x")
    assert path.stat().st_mode & 0o777 == 0o600
    policy = read_policy_file(path)
    assert policy.enforced and policy.gateway == ("gw.example.com", 443)
    assert policy.check_name("allowed.test", 1).allowed and not policy.check_name("denied.test", 1).allowed
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(ValueError, match="does not hold an object"):
        read_policy_file(tmp_path / "bad.json")


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
