"""The ``podman`` orchestrator driver, for real: rootful podman, the session image, the fleet simulator.

The image is the Debian test-host root filesystem plus this checkout's worker wheel
(scripts/test-hosts/build-session-image.sh, cached by content hash). Each session's container runs
``devin-outposts worker start --session <id>`` in direct-serve mode with a real claim's connect token; the
worker downloads the simulator's stand-in ``devin-remote``, which connects to the simulator's gateway over
the host's loopback (``network: host``) and runs the tool calls the test scripts as the brain. Every
assertion is on observed state: ``podman inspect`` and listings, the simulator's connection and call
records, files in the volumes, and ``/proc`` of every process on the machine.

Needs podman and root (shared/reference/test-hosts.md, Recipe A); scripts/bootstrap.sh installs and
configures podman. Skipped without them on a developer's machine, failed in CI (a green CI run means these
ran).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import httpx
import pytest

from devin_outposts.api.models import Outpost
from devin_outposts.orchestrator.drivers import driver_class
from devin_outposts.orchestrator.drivers.base import (
    LABEL_ACCEPTOR,
    LABEL_MANAGED_BY,
    DriverContext,
    DriverError,
    Machine,
    SessionSpec,
    WorkerLaunch,
    WorkerState,
    WorkerStatus,
    machine_name,
)
from devin_outposts.orchestrator.drivers.podman import LABEL_KIND, OPTIONS, WORKDIR, PodmanDriver
from devin_outposts.orchestrator.drivers.podman.objects import Result
from devin_outposts_sim.remote import tools
from devin_outposts_sim.testing import SimHandle
from devin_outposts_sim.testing.remote import claim_session

from netpolicy_harness import (
    LOOPBACK_POLICY,
    Upstream,
    assert_confined,
    client_calls_in_a_machine,
    confinement_plan,
)

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[3]
BUILD_IMAGE = ROOT / "scripts" / "test-hosts" / "build-session-image.sh"
PODMAN = shutil.which("podman") or "podman"
BASH = shutil.which("bash") or "/bin/bash"
IN_CI = os.environ.get("CI", "") in ("true", "TRUE", "True", "1", "yes")
#: What the tests give every machine; each is checked in ``podman inspect``.
LIMITS = {"cpus": "1.5", "memory": "512m", "pids_limit": 256}
KEPT = "kept/notes.txt"
KEPT_TEXT = "written before the suspend\n"


def _why_not() -> Optional[str]:
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/bootstrap.sh installs it: apt-get install podman runc)"
    if os.geteuid() != 0:
        return "the podman driver's tests use rootful podman: run them as root (test-hosts.md, Recipe A)"
    return None


WHY_NOT = _why_not()


def needs_podman(test: Callable[..., None]) -> Callable[..., None]:
    """A test against real podman. In CI it runs (and fails when podman is missing): a skip there would
    make a green run mean less. 300 s, not 120: whichever test comes first builds the session image in
    its set-up, in CI the test-host root filesystem too (debootstrap, about a minute)."""
    marked: Callable[..., None] = pytest.mark.timeout(300)(test)
    marked = pytest.mark.skipif(WHY_NOT is not None and not IN_CI, reason=WHY_NOT or "")(marked)
    return marked


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([PODMAN, *args], capture_output=True, text=True, timeout=120, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed ({result.returncode}): {result.stderr[-2000:]}")
    return result


def podman_json(*args: str) -> Any:
    return json.loads(podman(*args, "--format", "json").stdout or "null")


def inspect_container(name: str) -> dict[str, Any]:
    data = podman_json("container", "inspect", name)
    assert isinstance(data, list) and len(data) == 1
    return dict(data[0])


def exists(kind: str, name: str) -> bool:
    return podman(kind, "exists", name, check=False).returncode == 0


def processes_holding(secret: str, *, where: str) -> list[str]:
    """``pid (command)`` of every process on the machine whose ``where`` (cmdline, environ) holds
    ``secret``; this test process itself is left out for environ (its own environment is the test's)."""
    found = []
    needle = secret.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or (where == "environ" and int(entry.name) == os.getpid()):
            continue
        try:
            data = (entry / where).read_bytes()
            comm = (entry / "comm").read_text().strip()
        except OSError:  # gone meanwhile, or a kernel thread
            continue
        if needle in data:
            found.append(f"{entry.name} ({comm})")
    return found


@pytest.fixture(scope="module")
def session_image() -> str:
    """The session image of this checkout (built on the first run, found in about a second after)."""
    if WHY_NOT:
        if IN_CI:
            pytest.fail(f"{WHY_NOT} (CI=true: the podman driver's tests must run in CI)")
        pytest.skip(WHY_NOT)
    try:
        done = subprocess.run(
            [BASH, str(BUILD_IMAGE)], capture_output=True, text=True, timeout=900, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail("scripts/test-hosts/build-session-image.sh took more than 900 s")
    if done.returncode != 0:
        pytest.fail(f"build-session-image.sh failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


@dataclass
class Podman:
    """One test's driver, its acceptor id (unique, so that the test's label queries see only its own
    objects), and the simulator."""

    driver: PodmanDriver
    state_dir: Path
    acceptor: str
    sim: SimHandle
    outpost: Outpost
    token: str = field(repr=False)

    def leftovers(self) -> dict[str, list[str]]:
        """Every container and volume labelled with this test's acceptor id, and every file under the
        driver's directory."""
        label = f"label={LABEL_ACCEPTOR}={self.acceptor}"
        containers = podman("ps", "--all", "--filter", label, "--format", "{{.Names}}").stdout.split()
        volumes = podman("volume", "ls", "--filter", label, "--format", "{{.Name}}").stdout.split()
        files = [str(p) for p in self.state_dir.rglob("*") if not p.is_dir()]
        return {"containers": containers, "volumes": volumes, "files": files}

    def claim(self, session_id: str) -> WorkerLaunch:
        entry = claim_session(self.sim.url, self.token, session_id, self.acceptor)
        assert entry.status.connect_token is not None and entry.status.gateway_url
        policy = entry.spec.network_policy
        return WorkerLaunch(
            session_id=session_id,
            connect_token=entry.status.connect_token.get_secret_value(),
            gateway_url=entry.status.gateway_url,
            static_base_url=self.sim.static_base_url,
            # As the orchestrator hands it over (machine.py): the worker in the container enforces it.
            network_policy=policy.model_dump(mode="json") if policy is not None else None,
        )

    def release(self, session_id: str) -> None:
        response = httpx.post(
            f"{self.sim.url}/opbeta/outposts/devins/{session_id}/release",
            json={"acceptor_id": self.acceptor},
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=10,
        )
        response.raise_for_status()

    def spec(self, session_id: str, kind: str = "new") -> SessionSpec:
        return SessionSpec(session_id, self.outpost.outpost_id, self.acceptor, platform="linux", kind=kind)

    def status(self, machine: Machine) -> WorkerStatus:
        return run(self.driver.status(machine))

    def wait_exited(self, machine: Machine, wait_until: Callable[..., Any]) -> WorkerStatus:
        status: WorkerStatus = wait_until(
            lambda: (s := self.status(machine)).state is WorkerState.EXITED and s, timeout=60
        )
        return status


@pytest.fixture
def pod(
    session_image: str, sim: SimHandle, outpost: Outpost, machine_token: str, tmp_path: Path
) -> Iterator[Podman]:
    state_dir = tmp_path / "orchestrator"
    state_dir.mkdir(mode=0o700)
    options = {"image": session_image, "network": "host", "stop_grace": 5, **LIMITS}
    driver = driver_class("podman").from_options(DriverContext(state_dir=state_dir), options)
    assert isinstance(driver, PodmanDriver)
    acceptor = f"podman-test-{os.urandom(4).hex()}"
    harness = Podman(driver, state_dir / "podman", acceptor, sim, outpost, machine_token)
    try:
        yield harness
    finally:
        # Whatever the test left (it failed half-way): removed by label, so nothing outlives the test.
        label = f"label={LABEL_ACCEPTOR}={acceptor}"
        for name in podman(
            "ps", "--all", "--filter", label, "--format", "{{.Names}}", check=False
        ).stdout.split():
            podman("rm", "--force", "--time", "1", name, check=False)
        for name in podman(
            "volume", "ls", "--filter", label, "--format", "{{.Name}}", check=False
        ).stdout.split():
            podman("volume", "rm", name, check=False)


# --- options -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"imag": "x"}, "unknown podman driver option imag; known: image, network"),
        ({"memory": "lots"}, "podman driver option memory must be a size such as 2g or 512m, or none"),
        ({"cap_add": "ALL"}, "podman driver option cap_add names no single capability: 'ALL'"),
        ({"cap_add": "net_raw, sys-admin"}, "podman driver option cap_add names no single capability: 'SYS-"),
        ({"memory": "none", "cpus": "none", "pids_limit": "none", "cap_add": "net_raw"}, None),
        ({"cpus": "two"}, "podman driver option cpus must be a number, got 'two'"),
        ({"cpus": 0}, "podman driver option cpus must be positive, got '0'"),
        ({"pids_limit": "1.5"}, "podman driver option pids_limit must be a number, got '1.5'"),
        ({"init": "maybe"}, "podman driver option init must be true or false, got 'maybe'"),
        ({"worker_command": " "}, None),  # blank: the context's command
    ],
)
def test_options_are_checked_when_the_driver_is_made(
    options: dict[str, Any], message: Optional[str], tmp_path: Path
) -> None:
    context = DriverContext(state_dir=tmp_path)
    if message is None:
        driver = PodmanDriver.from_options(context, options)
        assert driver.settings.worker_command == ("devin-outposts",)
        return
    with pytest.raises(DriverError) as caught:
        PodmanDriver.from_options(context, options)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_every_option_is_documented() -> None:
    # docs/orchestrator-podman.md until it is merged into docs/orchestrator.md: either may hold the table.
    docs = [ROOT / "docs" / "orchestrator-podman.md", ROOT / "docs" / "orchestrator.md"]
    text = "".join(path.read_text() for path in docs if path.is_file())
    missing = [key for key in OPTIONS if f"| `{key}` |" not in text]
    assert not missing, f"podman driver options missing from the docs' options table: {missing}"


# --- against a fake podman: what the driver hands podman -------------------------------------------

FAKE_PODMAN = """#!{python}
import json, os, sys, time
args = sys.argv[1:]
record = {{"argv": args, "devin_env": sorted(k for k in os.environ if k.startswith("DEVIN_"))}}
if "--env-file" in args:
    path = args[args.index("--env-file") + 1]
    record["env_file_mode"] = oct(os.stat(path).st_mode & 0o777)
    record["env_file"] = open(path).read()
if args[:2] == ["secret", "create"]:
    record["stdin"] = sys.stdin.read()
with open(os.environ["FAKE_PODMAN_LOG"], "a") as log:
    log.write(json.dumps(record) + "\\n")
if os.environ.get("FAKE_PODMAN_SLEEP"):
    time.sleep(float(os.environ["FAKE_PODMAN_SLEEP"]))
if args[:2] == ["image", "exists"]:
    sys.exit(1)
if args[0] == "run" and args[-1] == "-u":
    print("1000")
if args[:2] == ["volume", "create"]:
    sys.stderr.write("Error: creating volume: disk full\\nSee 'podman volume create --help'\\n")
    sys.exit(125)
if args[:2] == ["container", "inspect"] and os.environ.get("FAKE_PODMAN_EMPTY"):
    sys.stderr.write("Error: inspecting object: no such container " + args[-1] + "\\n")
    sys.exit(125)
if args[:2] == ["container", "inspect"]:
    labels = {{
        "app.kubernetes.io/managed-by": "devin-outposts-orchestrator",
        "outposts.devin.ai/kind": "machine",
        "outposts.devin.ai/state-volume": "state-1",
    }}
    print(json.dumps([{{"Config": {{"Labels": labels}}, "State": {{"Status": "created"}}}}]))
"""


@pytest.fixture
def fake_podman(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., PodmanDriver]:
    script = tmp_path / "podman"
    script.write_text(FAKE_PODMAN.format(python=sys.executable))
    script.chmod(0o755)
    monkeypatch.setenv("FAKE_PODMAN_LOG", str(tmp_path / "podman.log"))

    def make(**options: Any) -> PodmanDriver:
        context = DriverContext(state_dir=tmp_path / "orchestrator")
        return PodmanDriver.from_options(context, {"podman": str(script), **options})

    return make


def fake_calls(tmp_path: Path) -> list[dict[str, Any]]:
    log = tmp_path / "podman.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_the_launch_reaches_podman_in_a_0600_env_file_that_is_gone_after(
    fake_podman: Callable[..., PodmanDriver], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEVIN_OUTPOSTS_TOKEN", "account-token-canary")
    driver = fake_podman(cpus=2, memory="1g", pids_limit="64", network="host")
    machine = Machine("outpost-worker-x", "devin-x", "outpost_env-1", "acceptor-1")
    launch = WorkerLaunch(
        "devin-x", "connect-token-canary", "ws://gateway.invalid/", static_base_url="http://s/"
    )
    run(driver.start(machine, launch))
    calls = fake_calls(tmp_path)
    assert [c["argv"][:2] for c in calls] == [
        ["container", "inspect"], ["kill", "--signal"], ["rm", "--force"], ["run", "--rm"],
        ["secret", "create"], ["create", "--name"], ["secret", "rm"], ["start", "outpost-worker-x"],
    ]  # fmt: skip
    assert all(c["devin_env"] == [] for c in calls)  # the account token never reaches podman
    assert not any("canary" in arg for c in calls for arg in c["argv"])
    # The connect token reaches podman on stdin only, as the secret the container mounts.
    [secret] = [c for c in calls if c["argv"][:2] == ["secret", "create"]]
    assert secret["stdin"] == "connect-token-canary"
    secret_name = secret["argv"][-2]
    assert [c["argv"] for c in calls if c["argv"][:2] == ["secret", "rm"]] == [["secret", "rm", secret_name]]
    [create] = [c for c in calls if c["argv"][0] == "create"]
    assert create["env_file_mode"] == "0o600"
    assert "DEVIN_REMOTE_SESSION_TOKEN" not in create["env_file"]
    assert "DEVIN_OUTPOST_GATEWAY_URL=ws://gateway.invalid/\n" in create["env_file"]
    assert "DEVIN_WORKER_CACHE_DIR=/var/lib/devin-worker/worker/cache\n" in create["env_file"]
    assert "account-token-canary" not in create["env_file"]
    argv = create["argv"]
    assert argv[argv.index("--cpus") + 1 :][:1] == ["2"]
    assert argv[argv.index("--memory") + 1 :][:1] == ["1g"]
    assert argv[argv.index("--pids-limit") + 1 :][:1] == ["64"]
    assert argv[argv.index("--network") + 1 :][:1] == ["host"]
    assert argv[argv.index("--volume") + 1 :][:1] == ["state-1:/var/lib/devin-worker"]
    assert argv[argv.index("--secret") + 1 :][:1] == [
        f"{secret_name},type=mount,target=session-token,uid=1000,mode=0400"
    ]
    assert argv[argv.index("--security-opt") + 1 :][:1] == ["no-new-privileges"]
    assert argv[argv.index("--cap-drop") + 1 :][:1] == ["ALL"] and "--cap-add" not in argv
    entrypoint = json.loads(argv[argv.index("--entrypoint") + 1])
    assert entrypoint[:2] == ["/bin/sh", "-c"]
    assert entrypoint[3:] == ["devin-outposts-session", "devin-outposts"]
    assert argv[argv.index("--entrypoint") + 2 :] == [driver.image, "worker", "start", "--session=devin-x"]
    assert [p for p in (tmp_path / "orchestrator").rglob("*") if p.is_file()] == []


def test_podman_failures_are_one_line_driver_errors(
    fake_podman: Callable[..., PodmanDriver], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = fake_podman(image="localhost/missing:1")
    with pytest.raises(DriverError, match=r"^podman image localhost/missing:1 not found"):
        run(driver.check())
    monkeypatch.setenv("FAKE_PODMAN_EMPTY", "1")
    with pytest.raises(DriverError) as caught:
        run(driver.provision(SessionSpec("devin-y", "outpost_env-1", "acceptor-1")))
    assert re.fullmatch(
        r"Could not create volume outpost-state-devin-y-\w+-\w+: creating volume: disk full",
        str(caught.value),
    )
    monkeypatch.setenv("FAKE_PODMAN_SLEEP", "30")
    slow = fake_podman(command_timeout="0.5")
    with pytest.raises(DriverError, match=r"^podman did not report its version within 0.5 s$"):
        run(slow.check())


# --- against podman --------------------------------------------------------------------------------


@needs_podman
def test_check_accepts_the_session_image_and_names_a_missing_one(pod: Podman, tmp_path: Path) -> None:
    run(pod.driver.check())
    assert pod.state_dir.is_dir() and (pod.state_dir.stat().st_mode & 0o777) == 0o700
    missing = PodmanDriver.from_options(
        DriverContext(state_dir=tmp_path / "other"), {"image": "localhost/devin-outposts-no-such-image:x"}
    )
    with pytest.raises(DriverError, match=r"podman image localhost/devin-outposts-no-such-image:x not found"):
        run(missing.check())
    no_network = PodmanDriver.from_options(
        DriverContext(state_dir=tmp_path / "other"), {"image": pod.driver.image, "network": "no-such-net-x1"}
    )
    with pytest.raises(DriverError, match=r"podman network no-such-net-x1 not found"):
        run(no_network.check())


@needs_podman
def test_a_session_is_served_in_a_container_with_its_limits_and_no_token_in_argv(
    pod: Podman, wait_until: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The orchestrator's own environment holds the account token; podman must not be handed it.
    monkeypatch.setenv("DEVIN_OUTPOSTS_TOKEN", pod.token)
    sid = pod.sim.admin.enqueue(pod.outpost.outpost_id).session_id
    launch = pod.claim(sid)
    spec = pod.spec(sid)

    machine = run(pod.driver.provision(spec))
    assert run(pod.driver.provision(spec)) == machine  # idempotent: the same machine
    created = inspect_container(machine.name)
    assert created["State"]["Status"] == "created"
    assert spec.labels().items() <= created["Config"]["Labels"].items()
    assert pod.status(machine) == WorkerStatus(WorkerState.STARTING, detail="container created")
    [volume] = [m["Name"] for m in created["Mounts"] if m["Destination"] == "/var/lib/devin-worker"]
    assert podman_json("volume", "inspect", volume)[0]["Labels"][LABEL_ACCEPTOR] == pod.acceptor
    assert [m.name for m in run(pod.driver.list_owned(pod.acceptor, pod.outpost.outpost_id))] == [
        machine.name
    ]
    assert run(pod.driver.list_owned("someone-else", pod.outpost.outpost_id)) == []

    run(pod.driver.start(machine, launch))
    conn = pod.sim.admin.wait_connection(sid, timeout=60)
    assert conn["acceptor_id"] == pod.acceptor  # the claim whose connect token it used
    assert conn["cwd"] == WORKDIR
    assert conn["env"]["USER"] == "devin" and conn["env"]["HOME"] == "/home/devin"  # not root
    assert not any(pod.token in value for value in conn["env"].values())
    assert pod.status(machine).state is WorkerState.RUNNING

    # The connect token is in no process's argv (podman, conmon, the init, the worker, the remote), and
    # the account token in no process's environment; the env file is gone.
    assert processes_holding(launch.connect_token, where="cmdline") == []
    assert processes_holding(pod.token, where="environ") == []
    assert pod.leftovers()["files"] == []
    running = inspect_container(machine.name)
    assert not any(pod.token in entry for entry in running["Config"]["Env"])
    host = running["HostConfig"]
    assert (host["NanoCpus"], host["Memory"], host["PidsLimit"]) == (1_500_000_000, 512 * 2**20, 256)
    assert host["NetworkMode"] == "host"
    assert running["Config"]["User"] in ("", "devin")  # the image's user, not overridden

    pod.sim.admin.add_calls(sid, [tools.write(KEPT, KEPT_TEXT), tools.run("id -u; pwd")])
    calls = pod.sim.admin.wait_calls(sid, timeout=60)
    assert [(c["state"], c["result"]["ok"]) for c in calls] == [("done", True), ("done", True)]
    assert calls[1]["result"]["output"] == f"1000\n{WORKDIR}\n"
    mountpoint = Path(podman_json("volume", "inspect", volume)[0]["Mountpoint"])
    assert (mountpoint / "repos" / KEPT).read_text() == KEPT_TEXT  # on the state volume, not in the layer

    pod.sim.admin.end_session(sid, "suspended")
    assert pod.wait_exited(machine, wait_until) == WorkerStatus(WorkerState.EXITED, exit_code=0)
    assert inspect_container(machine.name)["State"]["ExitCode"] == 0

    run(pod.driver.teardown(machine))
    run(pod.driver.teardown(machine))  # idempotent
    assert pod.status(machine).state is WorkerState.MISSING
    assert not exists("container", machine.name) and not exists("volume", volume)
    assert pod.leftovers() == {"containers": [], "volumes": [], "files": []}


@needs_podman
def test_a_session_with_a_network_policy_is_confined_in_its_container(
    pod: Podman, wait_until: Callable[..., Any]
) -> None:
    """The worker in the container confines the session as on a host (its own user and network namespace
    inside the container's, out only through the worker's egress proxy), under the driver's lock-down
    (no capabilities, no-new-privileges): what the policy allows is reached on the host's loopback, the
    rest is refused, and the denied upstream records nothing."""
    allowed, denied = Upstream("allowed"), Upstream("denied", host="127.0.0.2")
    try:
        # localhost: resolved by the worker's proxy in the container, to the host's loopback (the container
        # shares the host's network here).
        policy = LOOPBACK_POLICY
        sid = pod.sim.admin.enqueue(pod.outpost.outpost_id, network_policy=policy).session_id
        launch = pod.claim(sid)
        assert launch.network_policy is not None and launch.network_policy["enabled"] is True
        machine = run(pod.driver.provision(pod.spec(sid)))
        run(pod.driver.start(machine, launch))
        pod.sim.admin.wait_connection(sid, timeout=90)
        pod.sim.admin.add_calls(sid, client_calls_in_a_machine(confinement_plan(allowed, denied)))
        calls = pod.sim.admin.wait_calls(sid, timeout=90)
        assert [c["state"] for c in calls] == ["done", "done"], calls
        assert_confined(calls[1]["result"]["output"], allowed, denied)
        # The denial is in the worker's log (the container's), with the rule that applied.
        logs = podman("logs", machine.name).stderr + podman("logs", machine.name).stdout
        assert f"session {sid}" in logs and "denied 127.0.0.2:" in logs, logs[-3000:]
        # It still reaches its gateway, and ends cleanly.
        pod.sim.admin.end_session(sid, "terminated")
        assert pod.wait_exited(machine, wait_until) == WorkerStatus(WorkerState.EXITED, exit_code=0)
        run(pod.driver.teardown(machine))
        assert pod.leftovers() == {"containers": [], "volumes": [], "files": []}
    finally:
        allowed.close()
        denied.close()


@needs_podman
def test_a_snapshot_keeps_the_repos_for_a_resume_and_start_fresh_does_not(
    pod: Podman, wait_until: Callable[..., Any]
) -> None:
    sid = pod.sim.admin.enqueue(pod.outpost.outpost_id).session_id
    first = run(pod.driver.provision(pod.spec(sid)))
    run(pod.driver.start(first, pod.claim(sid)))
    pod.sim.admin.wait_connection(sid, timeout=60)
    pod.sim.admin.add_calls(sid, [tools.write(KEPT, KEPT_TEXT)])
    assert pod.sim.admin.wait_calls(sid, timeout=60)[0]["result"]["ok"] is True
    pod.sim.admin.end_session(sid, "suspended")
    assert pod.wait_exited(first, wait_until).exit_code == 0

    snapshot = run(pod.driver.snapshot(first))
    kept_volume = first.details["volume"]
    assert snapshot.ref == kept_volume and snapshot.session_id == sid
    assert run(pod.driver.list_snapshots(pod.acceptor, pod.outpost.outpost_id)) == [snapshot]
    run(pod.driver.teardown(first))
    assert not exists("container", first.name)
    assert exists("volume", kept_volume)  # teardown kept what the snapshot names
    assert pod.leftovers()["containers"] == []

    def resume() -> WorkerLaunch:
        """The session comes back: released, swept from the queue, queued again as a resume, claimed."""
        pod.release(sid)
        pod.sim.admin.tombstone(sid)
        pod.sim.admin.enqueue(pod.outpost.outpost_id, session_id=sid, kind="resume")
        return pod.claim(sid)

    def read_kept(machine: Machine, connections: int) -> dict[str, Any]:
        pod.sim.admin.wait_connection(sid, count=connections, timeout=60)
        pod.sim.admin.add_calls(sid, [tools.read(KEPT)])
        result: dict[str, Any] = pod.sim.admin.wait_calls(sid, timeout=60)[-1]["result"]
        pod.sim.admin.end_session(sid, "suspended")
        assert pod.wait_exited(machine, wait_until).exit_code == 0
        return result

    # Resume with the snapshot: the new machine runs on the kept volume and sees the file.
    launch = resume()
    second = run(pod.driver.provision(pod.spec(sid, kind="resume")))
    fresh_volume = second.details["volume"]
    assert fresh_volume != kept_volume
    run(pod.driver.restore(second, snapshot))
    assert not exists("volume", fresh_volume)
    assert run(pod.driver.list_snapshots(pod.acceptor, pod.outpost.outpost_id)) == []  # consumed
    with pytest.raises(DriverError, match="is gone"):
        run(pod.driver.restore(second, snapshot))
    run(pod.driver.delete_snapshot(snapshot))  # consumed: a no-op that must not take the machine's volume
    assert exists("volume", kept_volume)
    run(pod.driver.start(second, launch))
    mounts = inspect_container(second.name)["Mounts"]
    assert [m["Name"] for m in mounts if m["Destination"] == "/var/lib/devin-worker"] == [kept_volume]
    restored = read_kept(second, connections=2)
    assert (restored["ok"], restored["output"]) == (True, KEPT_TEXT)
    run(pod.driver.teardown(second))
    assert not exists("volume", kept_volume)

    # Resume without it (start_fresh): a new, empty volume.
    launch = resume()
    third = run(pod.driver.provision(pod.spec(sid, kind="resume")))
    run(pod.driver.start(third, launch))
    fresh = read_kept(third, connections=3)
    assert fresh["ok"] is False
    run(pod.driver.teardown(third))
    assert pod.leftovers() == {"containers": [], "volumes": [], "files": []}


@needs_podman
def test_exit_codes_snapshots_and_orphans_without_a_session(
    pod: Podman, wait_until: Callable[..., Any]
) -> None:
    """What needs no simulator: a failing worker's exit code, delete_snapshot, and the orphan sweep."""
    failing = PodmanDriver.from_options(
        DriverContext(state_dir=pod.state_dir.parent),
        {"image": pod.driver.image, "network": "none", "worker_command": "sh -c 'exit 3'"},
    )
    spec = pod.spec("devin-podman-exit-code")
    machine = run(failing.provision(spec))
    run(failing.start(machine, WorkerLaunch(spec.session_id, "not-a-real-token", "ws://127.0.0.1:9/")))
    status = wait_until(lambda: (s := run(failing.status(machine))).state is WorkerState.EXITED and s)
    assert status.exit_code == 3

    snapshot = run(failing.snapshot(machine))
    assert run(failing.snapshot(machine)) == snapshot  # again: the same snapshot
    run(failing.teardown(machine))
    assert exists("volume", snapshot.ref)
    run(failing.delete_snapshot(snapshot))
    run(failing.delete_snapshot(snapshot))  # idempotent
    assert pod.leftovers()["volumes"] == []

    # An orphan: a machine's state volume whose container went away outside the driver.
    orphan = run(failing.provision(pod.spec("devin-podman-orphan")))
    podman("rm", orphan.name)
    assert exists("volume", orphan.details["volume"])
    assert run(failing.sweep_orphans(pod.acceptor, pod.outpost.outpost_id, {"devin-podman-orphan"})) == 0
    assert exists("volume", orphan.details["volume"])  # its session is live: kept
    assert run(failing.sweep_orphans(pod.acceptor, pod.outpost.outpost_id, set())) == 1
    assert pod.leftovers() == {"containers": [], "volumes": [], "files": []}


@needs_podman
def test_a_sweep_during_a_provision_keeps_the_new_state_volume(pod: Podman) -> None:
    """A sweep whose list of live sessions was read before a claim runs while that claim's machine is being
    made: the state volume exists, its container not yet. The sweep must leave the volume alone (it once
    removed it, and the container create then failed: seen in a loaded suite run)."""
    driver = pod.driver
    spec = pod.spec("devin-podman-in-flight")
    real_run = driver.cli.run

    async def scenario() -> tuple[int, Machine]:
        volume_made, go_on = asyncio.Event(), asyncio.Event()

        async def held_run(*args: str, what: str, stdin: Optional[bytes] = None) -> Result:
            if args and args[0] == "create":  # the container create: after the volume's
                volume_made.set()
                await go_on.wait()
            return await real_run(*args, what=what, stdin=stdin)

        driver.cli.run = held_run  # type: ignore[method-assign]
        try:
            provision = asyncio.ensure_future(driver.provision(spec))
            await asyncio.wait_for(volume_made.wait(), timeout=60)
            removed = await driver.sweep_orphans(pod.acceptor, pod.outpost.outpost_id, set())
            go_on.set()
            return removed, await provision
        finally:
            driver.cli.run = real_run  # type: ignore[method-assign]

    removed, machine = run(scenario())
    assert removed == 0
    assert inspect_container(machine.name)["State"]["Status"] == "created"
    assert exists("volume", machine.details["volume"])
    run(driver.teardown(machine))
    assert pod.leftovers() == {"containers": [], "volumes": [], "files": []}


@needs_podman
def test_start_replaces_a_running_worker_on_the_same_volume(
    pod: Podman, wait_until: Callable[..., Any]
) -> None:
    """A re-claim starts the worker again: the running one is stopped and replaced, the machine (its name,
    volume, creation time, labels) stays."""
    sleeper = PodmanDriver.from_options(
        DriverContext(state_dir=pod.state_dir.parent),
        {
            "image": pod.driver.image,
            "network": "none",
            "worker_command": "sh -c 'sleep 600'",
            "stop_grace": 2,
        },
    )
    spec = pod.spec("devin-podman-restart")
    machine = run(sleeper.provision(spec))
    launch = WorkerLaunch(spec.session_id, "first-token", "ws://127.0.0.1:9/")
    run(sleeper.start(machine, launch))
    first = inspect_container(machine.name)
    assert run(sleeper.status(machine)).state is WorkerState.RUNNING
    run(sleeper.start(machine, WorkerLaunch(spec.session_id, "second-token", "ws://127.0.0.1:9/")))
    second = inspect_container(machine.name)
    assert second["Id"] != first["Id"]
    assert run(sleeper.status(machine)).state is WorkerState.RUNNING
    # The new token reached the new worker (its environment, through the secret file), and is in no
    # container configuration.
    # Polled: right after the start, the container's entry may still be reading the secret file (a process
    # listed by `podman top` can be gone before its environ is read). The bound only catches a hang.
    wait_until(
        lambda: any(
            b"DEVIN_REMOTE_SESSION_TOKEN=second-token\0" in env for env in container_environs(machine.name)
        ),
        timeout=60,
        interval=0.2,
    )
    assert "second-token" not in json.dumps(second) and "first-token" not in json.dumps(second)
    assert (
        [m["Name"] for m in second["Mounts"]]
        == [m["Name"] for m in first["Mounts"]]
        == [machine.details["volume"]]
    )
    assert spec.labels().items() <= second["Config"]["Labels"].items()
    assert run(sleeper.list_owned(pod.acceptor, pod.outpost.outpost_id)) == [machine]
    run(sleeper.teardown(machine))
    assert pod.leftovers() == {"containers": [], "volumes": [], "files": []}


def container_environs(name: str) -> list[bytes]:
    """The environments of a container's processes, as the host sees them (pids gone meanwhile skipped)."""
    environs = []
    for pid in podman("top", name, "hpid").stdout.split()[1:]:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            environs.append(Path(f"/proc/{int(pid)}/environ").read_bytes())
    return environs


ORCHESTRATOR_STAND_IN = """
import asyncio, json, sys, time
from pathlib import Path
from devin_outposts.orchestrator.drivers.base import DriverContext, SessionSpec, WorkerLaunch
from devin_outposts.orchestrator.drivers.podman import PodmanDriver

state_dir, image, session_id, outpost_id, acceptor_id = sys.argv[1:]
options = {"image": image, "network": "none", "worker_command": "sh -c 'sleep 600'", "stop_grace": 2}
driver = PodmanDriver.from_options(DriverContext(state_dir=Path(state_dir)), options)

async def main():
    machine = await driver.provision(SessionSpec(session_id, outpost_id, acceptor_id))
    await driver.start(machine, WorkerLaunch(session_id, "a-token", "ws://127.0.0.1:9/"))
    print(json.dumps({"name": machine.name}), flush=True)

asyncio.run(main())
time.sleep(600)
"""


@needs_podman
def test_a_worker_outlives_a_killed_orchestrator_and_is_found_again(pod: Podman) -> None:
    """kill -9 of the process that started a machine: the container keeps running (conmon is not its
    child), and a new driver finds it by label and reads its state."""
    sid = "devin-podman-adopt"
    proc = subprocess.Popen(
        [sys.executable, "-c", ORCHESTRATOR_STAND_IN, str(pod.state_dir.parent), pod.driver.image, sid,
         pod.outpost.outpost_id, pod.acceptor],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        started = json.loads(proc.stdout.readline() or "{}")
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -9
    [machine] = run(pod.driver.list_owned(pod.acceptor, pod.outpost.outpost_id))
    assert (machine.name, machine.session_id) == (started["name"], sid)
    assert pod.status(machine).state is WorkerState.RUNNING
    assert inspect_container(machine.name)["State"]["Running"] is True
    run(pod.driver.teardown(machine))
    assert pod.leftovers() == {"containers": [], "volumes": [], "files": []}


@needs_podman
def test_nothing_it_did_not_make_is_touched(pod: Podman) -> None:
    """A container of the session's name that is not ours is refused, and left alone by teardown."""
    spec = pod.spec("devin-podman-not-ours")
    name = machine_name("outpost-worker", spec.session_id)
    podman("create", "--name", name, "--label", f"{LABEL_ACCEPTOR}={pod.acceptor}", pod.driver.image)
    try:
        with pytest.raises(DriverError, match=f"container {name} exists and is not one of ours"):
            run(pod.driver.provision(spec))
        stranger = Machine(name, spec.session_id, spec.outpost_id, spec.acceptor_id)
        with pytest.raises(DriverError, match="is not one of ours"):
            run(pod.driver.teardown(stranger))
        assert exists("container", name)
        labels = inspect_container(name)["Config"]["Labels"]
        assert LABEL_MANAGED_BY not in labels and LABEL_KIND not in labels
        assert run(pod.driver.list_owned(pod.acceptor, pod.outpost.outpost_id)) == []
    finally:
        podman("rm", "--force", name, check=False)
    # Another orchestrator's machine for the session (another acceptor id) is not adopted either.
    theirs = run(pod.driver.provision(SessionSpec(spec.session_id, spec.outpost_id, f"{pod.acceptor}-other")))
    try:
        with pytest.raises(
            DriverError, match=f"container {name} belongs to acceptor {pod.acceptor}-other on"
        ):
            run(pod.driver.provision(spec))
    finally:
        run(pod.driver.teardown(theirs))
    assert (
        podman(
            "volume",
            "ls",
            "--filter",
            f"label={LABEL_ACCEPTOR}={pod.acceptor}-other",
            "--format",
            "{{.Name}}",
        ).stdout
        == ""
    )
