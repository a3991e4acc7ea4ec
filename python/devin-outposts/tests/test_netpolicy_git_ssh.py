"""Git over SSH to an allowed host works from a confined session, end to end, and to a host the policy does
not allow it does not: a real ``devin-outposts worker start``, the simulator's stand-in ``devin-remote``
running ``git clone`` and ``git push`` over ``ssh://`` as a brain's command, and a real ``sshd`` that the
test starts on the host's loopback (its own configuration, host key, authorized key and bare repository).

How the session reaches the SSH host, and the name it uses: ``git.test``. The worker runs in a mount
namespace of the test's own whose ``/etc/hosts`` says ``127.0.0.1 git.test`` (nothing on the machine
changes). The session does not see that line (it gets the host's loopback lines only, see
``core/netpolicy/hostsfile.py``), so it asks the stub DNS, which answers the allowed name with a fake
address; ``ssh`` connects there with plain TCP, the namespace's nat table redirects it to the shim, which
knows the name behind the fake address and sends ``CONNECT git.test:<port>`` at once (SSH's server speaks
first: nothing is waited for). The egress proxy allows the name by the hostname rule, resolves it on the
host (the worker's ``/etc/hosts``: 127.0.0.1), and connects there because the policy also has the rule
``{"ipv4": "127.0.0.1/32"}``: without it the rebinding guard refuses a name that resolves to loopback,
which the second test shows.

What is asserted is what was observed: the clone's files in the session's working directory, the pushed
commit in the bare repository, ``sshd``'s own log (a connection, or none), the worker's log of denials.

Needs what the sandbox needs (root, as in CI; util-linux, iproute2, nftables) and Debian's openssh-server
and openssh-client (scripts/bootstrap.sh installs them): skipped without them, failed in CI. ``sshd``
needs its privilege separation directory, ``/run/sshd``; the test makes it when it is missing (as the ssh
service would) and removes it again.
"""

from __future__ import annotations

import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devin_outposts_sim.remote import tools

from netpolicy_harness import WHY_NOT, cannot_run
from standin_harness import Harness, running_harness
from worker_fakes import WorkerProcess

SSHD = "/usr/sbin/sshd"
NAME = "git.test"
OTHER = "other.test"
PRIVSEP_DIR = Path("/run/sshd")


class Sshd:
    """``sshd -D -e`` on 127.0.0.1, logging to a file: a key pair for the session's user, a host key, a
    bare repository with one commit."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.log_path = root / "sshd.log"
        self.repo = root / "repo.git"
        self.client_key = root / "client_key"
        self.host_key = root / "host_key"
        for key in (self.client_key, self.host_key):
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", key.name, "-f", str(key)])
        (root / "authorized_keys").write_text(Path(f"{self.client_key}.pub").read_text())
        self.port = _free_port()
        config = root / "sshd_config"
        config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.host_key}\n"
            f"AuthorizedKeysFile {root / 'authorized_keys'}\nPidFile none\nStrictModes no\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "UsePAM no\nLogLevel VERBOSE\nPrintMotd no\n"
        )
        self._made_privsep = not PRIVSEP_DIR.exists()
        if self._made_privsep:
            PRIVSEP_DIR.mkdir(mode=0o755)
        self._seed_repository()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)], stdout=self._log, stderr=subprocess.STDOUT
        )
        _wait_listening(self.port, self.proc, self.log_path)

    def _seed_repository(self) -> None:
        _run(["git", "init", "-q", "--bare", "-b", "main", str(self.repo)])
        seed = self.root / "seed"
        _run(["git", "init", "-q", "-b", "main", str(seed)])
        (seed / "README.md").write_text("cloned over ssh\n")
        _git(seed, "add", "README.md")
        _git(seed, "commit", "-q", "-m", "seed")
        _git(seed, "push", "-q", str(self.repo), "main")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def connections(self) -> list[str]:
        return [line for line in self.log().splitlines() if "Connection from" in line]

    def known_hosts(self, *names: str) -> str:
        key = " ".join(Path(f"{self.host_key}.pub").read_text().split()[:2])
        return "".join(f"[{name}]:{self.port} {key}\n" for name in names)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()
        if self._made_privsep:
            shutil.rmtree(PRIVSEP_DIR, ignore_errors=True)


class WorkerWithHosts(WorkerProcess):
    """The worker in a mount namespace of its own whose ``/etc/hosts`` is ``hosts``."""

    def __init__(self, hosts: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hosts = hosts

    def start(self) -> WorkerWithHosts:
        inner = [sys.executable, "-m", "devin_outposts", *self.command, *self.args]
        argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                'mount --bind "$0" /etc/hosts && exec "$@"', str(self.hosts), *inner]  # fmt: skip
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        return self


@pytest.fixture
def confinable() -> None:
    if WHY_NOT:
        cannot_run(f"sessions cannot be confined here: {WHY_NOT}")
    for tool in (SSHD, "ssh", "ssh-keygen", "git"):
        if shutil.which(tool) is None:
            cannot_run(f"{tool} is not installed (Debian packages openssh-server, openssh-client, git)")


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    with running_harness(tmp_path) as h:
        yield h


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    root = tmp_path / "sshd"
    root.mkdir()
    server = Sshd(root)
    try:
        yield server
    finally:
        server.close()


def _harness_worker(h: Harness, hosts: Path, sshd: Sshd) -> WorkerProcess:
    """What ``Harness.worker`` starts, inside the mount namespace with ``hosts``; the session's ssh key and
    known hosts in its working directory (they become its own when it starts)."""
    session_ssh = h.tmp / "w1" / "work" / "ssh"
    session_ssh.mkdir(parents=True)
    for name in ("client_key", "known_hosts"):
        shutil.copy(sshd.root / name, session_ssh / name)
        (session_ssh / name).chmod(0o600)
    args = [
        "--outpost", h.outpost.name, "--static-base-url", h.sim.static_base_url,
        "--cache-dir", str(h.tmp / "w1" / "data" / "cache"), "--workdir", str(h.tmp / "w1" / "work"),
        "--poll-interval-secs", "0.5", "--confirm-interval-secs", "0.1", "--stop-grace-secs", "5",
        "--backoff-max-secs", "2", "--drain-timeout", "1",
    ]  # fmt: skip
    process = WorkerWithHosts(hosts, args, h.env(), h.tmp / "w1.log")
    h.workers.append(process)
    return process.start()


def git_over_ssh(sshd: Sshd, host: str, script: str) -> str:
    """A shell command for the session: ``GIT_SSH_COMMAND`` with the test's key and known hosts (copied
    into its working directory: the session sees no other directory of the test's), then ``script`` with
    ``$URL`` the repository's ``ssh://`` URL on ``host``."""
    ssh = (
        'ssh -F /dev/null -i "$KEYS/client_key" -o IdentitiesOnly=yes -o BatchMode=yes '
        '-o StrictHostKeyChecking=yes -o UserKnownHostsFile="$KEYS/known_hosts" -o ConnectTimeout=20'
    )
    url = f"ssh://root@{host}:{sshd.port}{sshd.repo}"
    return f'export KEYS="$PWD/ssh" GIT_SSH_COMMAND={shlex.quote(ssh)} URL={shlex.quote(url)}; {script}'


def run_in_session(h: Harness, session_id: str, command: str) -> dict[str, Any]:
    """Run ``command`` as the session's next call; its result."""
    h.sim.admin.add_calls(session_id, [tools.run(command, timeout=120)])
    return dict(h.calls_done(session_id, timeout=180)[-1]["result"])


def end(h: Harness, session_id: str) -> None:
    h.sim.admin.set_status(session_id, "terminated")
    h.wait(lambda: h.released(session_id), f"{session_id} to be released")


def test_git_clone_and_push_over_ssh_to_an_allowed_host(
    confinable: None, harness: Harness, sshd: Sshd
) -> None:
    h = harness
    (sshd.root / "known_hosts").write_text(sshd.known_hosts(NAME, OTHER))
    worker = _harness_worker(h, _hosts_file(h), sshd)
    policy = {"enabled": True, "allow": [{"hostname": NAME}, {"ipv4": "127.0.0.1/32"}]}
    sid = h.sim.admin.enqueue(h.outpost.outpost_id, network_policy=policy).session_id
    script = (
        'git clone -q "$URL" clone && cd clone && pwd && git config user.email s@test '
        '&& git config user.name session && echo "pushed from the session" > PUSHED.md '
        '&& git add PUSHED.md && git commit -q -m "from the session" && git push -q origin main'
    )
    result = run_in_session(h, sid, git_over_ssh(sshd, NAME, script))
    assert result["exit_code"] == 0, (result["stderr"], result, sshd.log(), worker.log())
    # The clone, in the session's working directory (its path is the first line the command printed).
    clone = Path(result["output"].splitlines()[0].strip())
    assert (clone / "README.md").read_text() == "cloned over ssh\n", result
    # The push, in the bare repository on the "remote" host.
    log = _run(["git", "--git-dir", str(sshd.repo), "log", "--format=%s", "main"])
    assert log.splitlines() == ["from the session", "seed"], log
    shown = _run(["git", "--git-dir", str(sshd.repo), "show", "main:PUSHED.md"])
    assert shown == "pushed from the session\n"
    # sshd saw the session's connections (clone and push) and let its key in.
    assert len(sshd.connections()) >= 2, sshd.log()
    assert "Accepted publickey for root" in sshd.log(), sshd.log()
    # A host the policy does not allow: the stub DNS does not answer its name, nothing reaches sshd.
    before = len(sshd.connections())
    denied = run_in_session(h, sid, git_over_ssh(sshd, OTHER, 'git clone -q "$URL" denied'))
    assert denied["exit_code"] != 0, denied
    assert "Could not resolve hostname" in denied["stderr"], denied
    assert len(sshd.connections()) == before, sshd.log()
    end(h, sid)


def test_git_over_ssh_to_a_name_that_resolves_to_loopback_is_refused_without_an_address_rule(
    confinable: None, harness: Harness, sshd: Sshd
) -> None:
    """The rebinding guard: the name is allowed, but it resolves to 127.0.0.1 on the host and no ipv4 rule
    covers that; the egress proxy refuses it, logs why, and sshd never sees a connection."""
    h = harness
    (sshd.root / "known_hosts").write_text(sshd.known_hosts(NAME))
    worker = _harness_worker(h, _hosts_file(h), sshd)
    policy = {"enabled": True, "allow": [{"hostname": NAME}]}
    sid = h.sim.admin.enqueue(h.outpost.outpost_id, network_policy=policy).session_id
    result = run_in_session(h, sid, git_over_ssh(sshd, NAME, 'git clone -q "$URL" clone'))
    assert result["exit_code"] != 0, result
    assert sshd.connections() == [], sshd.log()
    end(h, sid)
    assert f"session {sid}" in worker.log() and f"denied {NAME}:{sshd.port}" in worker.log(), worker.log()


def _hosts_file(h: Harness) -> Path:
    hosts = h.tmp / "worker-hosts"
    hosts.write_text(f"127.0.0.1 localhost\n127.0.0.1 {NAME} {OTHER}\n")
    return hosts


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    """Until sshd says it listens (connecting to find out would put a connection in its log); fails if it
    exits first."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"sshd exited with {proc.returncode}: {log_path.read_text()}")
        if f"Server listening on 127.0.0.1 port {port}" in log_path.read_text(errors="replace"):
            return
        time.sleep(0.1)
    raise AssertionError(f"sshd did not listen on {port}: {log_path.read_text()}")


def _git(repo: Path, *args: str) -> str:
    return _run(["git", "-C", str(repo), "-c", "user.email=t@test", "-c", "user.name=test", *args])


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return done.stdout
