"""The orchestrator's ``ansible`` driver, for real: docs/examples/orchestrator/'s playbooks make a
systemd-nspawn host for a claimed session, the worker role's one-session mode serves the session there, and
the host is destroyed. The session's connect token (and the account token in the orchestrator's environment)
must appear in no runner artifact and no job event.

The session's network policy is enabled, so its worker (devin-outposts-session@<id>.service, under the role's
hardening) confines it: two upstreams in the host's network namespace record what reaches them, 127.0.0.1
(allowed by the policy) and 127.0.0.2 (denied), and the session's command tries both (issue 26).

Needs root, systemd-nspawn and the test-host images (scripts/test-hosts/build-images.sh):
scripts/stages/molecule.sh runs this file right after it builds them. Without them the test is skipped, or
fails when CI=true.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from devin_outposts.orchestrator.drivers.ansible import AnsibleDriver
from devin_outposts.orchestrator.drivers.base import DriverContext, SessionSpec, WorkerLaunch, WorkerState
from devin_outposts_sim.remote import tools
from devin_outposts_sim.testing import SimHandle
from devin_outposts_sim.testing.remote import claim_session

from prerequisites import ROOT, cannot_run
from prerequisites import TEST_HOSTS_CACHE as CACHE

EXAMPLE = ROOT / "docs" / "examples" / "orchestrator"
#: Run by the session: tries each way out and prints what happened (python/devin-outposts/tests).
CLIENT = ROOT / "python" / "devin-outposts" / "tests" / "netpolicy_session_client.py"
#: The upstreams, run in the host's network namespace (the Molecule scenarios copy it onto their hosts).
UPSTREAMS = ROOT / "extensions" / "molecule" / "resources" / "files" / "recording_upstream.py"
UPSTREAM_PORT = 18080
POLICY = {"enabled": True, "allow": [{"ipv4": "127.0.0.1/32"}]}
PLAN = [
    ["proxy", "127.0.0.1", UPSTREAM_PORT],
    ["proxy", "127.0.0.2", UPSTREAM_PORT],
    ["direct", "127.0.0.2", UPSTREAM_PORT],
    ["udp", "192.0.2.1", 53],
]


@pytest.fixture
def prerequisites(nspawn_host_prerequisites: None) -> None:
    """A test host (tests/conftest.py), and ansible-runner, which the driver runs the playbooks with."""
    try:
        import ansible_runner  # noqa: F401
    except ImportError:
        cannot_run("the ansible driver's host test needs ansible-runner (pip install devin-outposts[ansible])")


def _leader_processes(name: str) -> list[int]:
    """PIDs of systemd-nspawn processes (and relays) of the host ``name``, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"--machine={name}".encode() in argv or any(f"/{name}/relay-".encode() in a for a in argv):
            found.append(int(entry.name))
    return found


def _in_host(host_dir: Path, *args: str) -> list[str]:
    """``nsenter`` into the nspawn host's namespaces (``-a``: all, ``-n``: its network), then ``args``."""
    leader = (host_dir / "leader.pid").read_text().strip()
    return [str(shutil.which("nsenter")), "-t", leader, *args]


def _journal(host_dir: Path, sid: str) -> str:
    """The session unit's journal and state on the host, for a failure message."""
    command = f"systemctl status --no-pager devin-outposts-session@{sid}.service; journalctl --no-pager -n 60"
    out = subprocess.run(  # noqa: S603 - a fixed command
        _in_host(host_dir, "-a", "sh", "-c", command),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return out.stdout + out.stderr


def _on_host(host_dir: Path, sid: str) -> dict[str, str]:
    """What the host shows of the session's worker, place by place (read as root through nsenter)."""
    unit = f"devin-outposts-session@{sid}.service"
    places = {
        "env file": f"cat /etc/devin-outposts/session-{sid}.env",
        "env file mode": f"stat -c '%a %U' /etc/devin-outposts/session-{sid}.env",
        "systemctl show": f"systemctl show {unit}",
        "systemctl cat": f"systemctl cat {unit}",
        "ps": "ps -eo args",
        "journal": "journalctl --no-pager -o verbose",
    }
    return {
        place: subprocess.run(  # noqa: S603 - a fixed command
            _in_host(host_dir, "-a", "sh", "-c", command),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
        for place, command in places.items()
    }


def _start_upstreams(host_dir: Path, record_dir: Path) -> subprocess.Popen[bytes]:
    """The recording upstreams on the host's 127.0.0.1 and 127.0.0.2 (its network namespace, this machine's
    files: each records to ``record_dir/<address>_<port>.jsonl``), once both listen."""
    process = subprocess.Popen(  # noqa: S603 - a fixed command
        _in_host(
            host_dir,
            "-n",
            sys.executable,
            str(UPSTREAMS),
            str(record_dir),
            f"127.0.0.1:{UPSTREAM_PORT}",
            f"127.0.0.2:{UPSTREAM_PORT}",
        )
    )
    records = [_record(record_dir, address) for address in ("127.0.0.1", "127.0.0.2")]
    for dummy in range(300):  # a record file is made once its server listens
        if all(record.exists() for record in records) or process.poll() is not None:
            break
        time.sleep(0.1)
    if not all(record.exists() for record in records):
        _stop(process)
        pytest.fail(f"the upstreams did not start (exit {process.returncode})")
    return process


def _record(record_dir: Path, address: str) -> Path:
    return record_dir / f"{address}_{UPSTREAM_PORT}.jsonl"


def _received(record_dir: Path, address: str) -> list[str]:
    """What each connection to an upstream sent, in order."""
    lines = _record(record_dir, address).read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["data"] for line in lines if line]


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _files_containing(root: Path, needles: list[str]) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            hits += [f"{path} holds secret #{i}" for i, n in enumerate(needles) if n.encode() in data]
    return hits


@pytest.mark.timeout(600)
def test_the_example_playbooks_serve_a_session_on_an_nspawn_host(
    prerequisites: None,
    make_sim: Callable[..., SimHandle],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    # A claim TTL longer than the test: this test plays the orchestrator's claim but not its renewals (a
    # host's first provisioning, with the role's install, takes minutes on a loaded machine).
    sim = make_sim(claim_ttl=3600.0)
    outpost = sim.admin.create_outpost("ansible-driver", "linux")
    machine_token = sim.create_token("machine")
    # The orchestrator holds an account token in its environment; it must not reach any run.
    account_token = sim.create_token("orchestrator")
    monkeypatch.setenv("DEVIN_OUTPOSTS_TOKEN", account_token)
    sid = sim.admin.enqueue(outpost.outpost_id, network_policy=POLICY).session_id
    acceptor = f"orch-test-{secrets.token_hex(4)}"
    claimed = claim_session(sim.url, machine_token, sid, acceptor)
    connect_token = claimed.connect_token_value()
    assert connect_token
    assert claimed.status.gateway_url

    # Short: the relays' unix sockets live under it, and a socket path has at most 107 bytes.
    run_dir = Path(tempfile.mkdtemp(prefix="do-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(run_dir, ignore_errors=True))
    extra_vars = yaml.safe_load((EXAMPLE / "vars.yml").read_text(encoding="utf-8"))
    extra_vars.update(
        nspawn_example_checkout=str(ROOT),
        nspawn_example_cache=str(CACHE),
        nspawn_example_run_dir=str(run_dir),
        nspawn_example_relay_ports=[sim.port],
        devin_outposts_worker_wheelhouse=str(CACHE / "wheelhouse-py311"),
        devin_outposts_worker_controller_cache_dir=str(tmp_path / "controller-cache"),
    )
    vars_file = tmp_path / "vars.yml"
    vars_file.write_text(yaml.safe_dump(extra_vars), encoding="utf-8")
    options = yaml.safe_load((EXAMPLE / "driver.yml").read_text(encoding="utf-8"))
    options.update(
        provision_playbook=str(EXAMPLE / "provision-nspawn.yml"),
        teardown_playbook=str(EXAMPLE / "teardown-nspawn.yml"),
        extra_vars_file=str(vars_file),
        keep_artifacts=True,
        # This checkout as devin.outposts (scripts/lib.sh makes the link), never a stale installed copy.
        env={"ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".cache" / "collections")},
    )
    link = ROOT / ".cache" / "collections" / "ansible_collections" / "devin" / "outposts"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(ROOT)
    state_dir = tmp_path / "state"
    driver = AnsibleDriver.from_options(DriverContext(state_dir=state_dir), options)
    spec = SessionSpec(
        session_id=sid,
        outpost_id=outpost.outpost_id,
        acceptor_id=acceptor,
        platform="linux",
        network_policy=POLICY,
    )
    launch = WorkerLaunch(
        session_id=sid,
        connect_token=connect_token,
        gateway_url=claimed.status.gateway_url,
        static_base_url=sim.static_base_url,
        network_policy=POLICY,
    )
    record_dir = tmp_path / "upstreams"

    async def serve() -> tuple[str, dict[str, Any], dict[str, str], list[Any], Any, Any, list[Any]]:
        await driver.check()
        machine = await driver.provision(spec)
        try:
            assert [m.name for m in await driver.list_owned(acceptor, outpost.outpost_id)] == [machine.name]
            assert _leader_processes(machine.name), (
                "the provision playbook reported a host that is not running"
            )
            upstreams = _start_upstreams(run_dir / machine.name, record_dir)
            request.addfinalizer(lambda: _stop(upstreams))
            await driver.start(machine, launch)
            try:
                connection = await asyncio.to_thread(sim.admin.wait_connection, sid, timeout=120)
            except Exception as exc:
                pytest.fail(f"no remote connection: {exc}\n{_journal(run_dir / machine.name, sid)}")
            running = await driver.status(machine)
            on_host = _on_host(run_dir / machine.name, sid)
            sim.admin.add_calls(
                sid,
                [
                    tools.run("hostname; pwd"),
                    tools.write(CLIENT.name, CLIENT.read_text(encoding="utf-8")),
                    tools.run(["python3", CLIENT.name, json.dumps(PLAN)]),
                ],
            )
            calls = await asyncio.to_thread(sim.admin.wait_calls, sid, 60)
            # The denial is logged by the session's worker, in its unit's journal.
            on_host["session journal"] = _on_host(run_dir / machine.name, sid)["journal"]
            sim.admin.end_session(sid)
            for dummy in range(60):
                ended = await driver.status(machine)
                if ended.state is WorkerState.EXITED:
                    break
                await asyncio.sleep(1)
        finally:
            await driver.teardown(machine)
        return (
            machine.name,
            connection,
            on_host,
            calls,
            running,
            ended,
            await driver.list_owned(acceptor, outpost.outpost_id),
        )

    name, connection, on_host, calls, running, ended, owned_after = asyncio.run(serve())

    # The stand-in devin-remote connected with the session's token from the session's working directory on
    # the host (the worker keeps its own token variable out of the remote's environment), and ran the call
    # there: the host's name, that directory.
    assert connection["cwd"] == f"/srv/devin-outposts/session-{sid}", connection
    assert "DEVIN_REMOTE_SESSION_TOKEN" not in connection["env"], sorted(connection["env"])
    assert calls[0]["state"] == "done", calls
    output = calls[0]["result"]["output"].split()
    assert output == [name, f"/srv/devin-outposts/session-{sid}"], calls[0]["result"]
    # Confined to its policy by the session unit's worker: through the proxy, the allowed upstream got the
    # one request and the denied one nothing (not even from a direct connection); UDP does not leave; the
    # denial is in the journal with its rule.
    assert [call["state"] for call in calls] == ["done"] * 3, calls
    assert calls[2]["result"]["exit_code"] == 0, calls[2]
    attempts = {
        " ".join(map(str, line["attempt"][:2])): line
        for line in map(json.loads, calls[2]["result"]["output"].splitlines())
    }
    assert attempts["proxy 127.0.0.1"]["status"] == 200, attempts
    assert attempts["proxy 127.0.0.2"]["status"] == 403, attempts
    assert "error" in attempts["direct 127.0.0.2"], attempts
    assert "error" in attempts["udp 192.0.2.1"], attempts
    assert [data.split("\r\n", 1)[0] for data in _received(record_dir, "127.0.0.1")] == [
        "GET /from-session HTTP/1.1"
    ]
    assert _received(record_dir, "127.0.0.2") == []
    assert f"session {sid} (outpost " in on_host["session journal"]
    assert f"denied 127.0.0.2:{UPSTREAM_PORT} by " in on_host["session journal"]
    assert running.state is WorkerState.RUNNING, running
    # On the host the token is in the 0600 root env file only: not in the unit, systemctl show, argv or the
    # journal.
    assert on_host["env file mode"] == "600 root"
    assert connect_token in on_host["env file"]
    leaks = [place for place, text in on_host.items() if place != "env file" and connect_token in text]
    assert leaks == []
    assert (ended.state, ended.exit_code) == (WorkerState.EXITED, 0), ended
    # Nothing is left: no host or relay process, no host files, no record, no token file.
    assert owned_after == []
    assert _leader_processes(name) == []
    assert not (run_dir / name).exists()
    assert list((state_dir / "ansible" / "secrets").iterdir()) == []
    assert list((state_dir / "ansible" / "runs").iterdir()) == []
    # The tokens are in no artifact and no job event of any run (provision, start, status, teardown).
    artifacts = state_dir / "ansible" / "artifacts" / name
    phases = sorted(p.name.split("-")[1] for p in artifacts.iterdir() if p.is_dir() and p.name != "status")
    assert phases == ["provision", "start", "teardown"], phases
    assert list((artifacts / "status").iterdir()), "no status run kept its artifacts"
    assert list(artifacts.rglob("job_events/*.json")), "no job events were written"
    assert _files_containing(state_dir, [connect_token, account_token]) == []
