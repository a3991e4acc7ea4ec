"""Helpers for the worker tests: a fake ``devin-remote``, a tiny distribution server, worker processes.

* :class:`FakeRemote` writes a Python script that stands in for ``devin-remote``. Every run records its
  argv, cwd, pid and *complete* environment to ``<records>/run-*.json`` (after installing its SIGTERM
  handler, so a test may signal it as soon as the record exists) and then behaves as scripted per
  session (``<control>/<session_id>``: one behaviour per line, consumed one per run; the last one
  repeats): ``wait`` (run until SIGTERM, then exit 0), ``exit:N``, ``ignore-term`` (run, ignoring
  SIGTERM, until SIGKILL), ``marker:NAME`` (write ``<records>/NAME`` and wait).
* :class:`DistServer` serves ``latest_<suffix>``, ``devin-remote_<sha>_<suffix>`` and ``.sha256`` from
  a thread, with switches to tamper with a binary, answer 500s or stall a download, and counts requests.
* :class:`WorkerProcess` runs ``python -m devin_outposts worker start`` as a subprocess with the token in
  its environment (never argv), and stops it (and its process group) when the test ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Optional

from devin_outposts.worker.binary import platform_suffix
from devin_outposts_sim.testing import wait_until

SUFFIX = platform_suffix()
#: Seconds a fake remote lives at most: far beyond any test (and pytest.ini's per-test timeout).
REMOTE_LIFETIME = 900.0

_REMOTE = r"""#!{python}
import json, os, signal, sys, time
RECORDS = {records!r}
CONTROL = {control!r}
TAG = {tag!r}
LIFETIME = {lifetime!r}
sid = os.environ.get("DEVIN_OUTPOST_SESSION_ID", "unknown")
counter = os.path.join(CONTROL, ".count-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in sid))
try:
    n = int(open(counter).read())
except (OSError, ValueError):
    n = 0
open(counter, "w").write(str(n + 1))
plan_file = os.path.join(CONTROL, "".join(c if c.isalnum() or c in "-_." else "_" for c in sid))
if not os.path.exists(plan_file):
    plan_file = os.path.join(CONTROL, "default")
try:
    plan = [line.strip() for line in open(plan_file) if line.strip()] or ["wait"]
except OSError:
    plan = ["wait"]
action = plan[min(n, len(plan) - 1)]

def stopped(signum, frame):
    with open(os.path.join(RECORDS, "stopped-%d" % os.getpid()), "w") as f:
        f.write(sid)
    sys.exit(0)

# The SIGTERM handler goes in before the run record is written: a test that sees the record may signal at
# once, and must find the behaviour it scripted (ignore-term really ignoring, wait really recording the stop).
if action == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif not action.startswith("exit:"):
    signal.signal(signal.SIGTERM, stopped)
record = {{"tag": TAG, "argv": sys.argv, "cwd": os.getcwd(), "pid": os.getpid(), "env": dict(os.environ),
          "run": n, "action": action, "time": time.time()}}
name = os.path.join(RECORDS, "run-%s-%d-%d.json" % (TAG, os.getpid(), n))
with open(name + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(name + ".tmp", name)

if action.startswith("exit:"):
    sys.exit(int(action.split(":", 1)[1]))
if action.startswith("marker:"):
    open(os.path.join(RECORDS, action.split(":", 1)[1]), "w").write(sid)
# A safety net, not part of any test: a remote that a killed test run left behind (pytest-timeout ends the
# whole run with os._exit) goes away by itself instead of running forever.
end_of_life = time.monotonic() + LIFETIME
while time.monotonic() < end_of_life:
    time.sleep(0.2)
"""


class FakeRemote:
    """A scriptable stand-in for ``devin-remote`` (see the module docstring)."""

    def __init__(self, root: Path, tag: str = "good") -> None:
        self.records = root / "records"
        self.control = root / "control"
        self.records.mkdir(parents=True, exist_ok=True)
        self.control.mkdir(parents=True, exist_ok=True)
        self.tag = tag
        self.script = _REMOTE.format(
            python=sys.executable,
            records=str(self.records),
            control=str(self.control),
            tag=tag,
            lifetime=REMOTE_LIFETIME,
        ).encode()

    def plan(self, session_id: str, *actions: str) -> None:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in session_id)
        (self.control / safe).write_text("\n".join(actions) + "\n")

    def default(self, *actions: str) -> None:
        (self.control / "default").write_text("\n".join(actions) + "\n")

    def runs(self, session_id: Optional[str] = None, tag: Optional[str] = None) -> list[dict[str, Any]]:
        found = []
        for path in sorted(self.records.glob("run-*.json")):
            with contextlib.suppress(OSError, ValueError):
                record = json.loads(path.read_text())
                if session_id is not None and record["env"].get("DEVIN_OUTPOST_SESSION_ID") != session_id:
                    continue
                if tag is not None and record["tag"] != tag:
                    continue
                found.append(record)
        return sorted(found, key=lambda r: r["time"])

    def stopped_pids(self) -> set[int]:
        return {int(p.name.split("-", 1)[1]) for p in self.records.glob("stopped-*")}


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class DistServer:
    """The ``devin-remote`` distribution endpoints, served from a thread on loopback."""

    def __init__(self, sha: str, binary: bytes, *, digest_format: str = "{digest}") -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[str] = []
        self.fail_statuses: list[int] = []
        #: name -> (the Content-Length announced, the bytes sent): after them the answer stalls until the
        #: server stops, a download that never ends.
        self.stalls: dict[str, tuple[int, bytes]] = {}
        self._closing = threading.Event()
        self.publish(sha, binary, digest_format=digest_format, latest=True)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    def publish(
        self, sha: str, binary: bytes, *, digest_format: str = "{digest}", latest: bool = False
    ) -> None:
        name = f"devin-remote_{sha}_{SUFFIX}"
        self.files[name] = binary
        self.files[name + ".sha256"] = (
            digest_format.format(digest=sha256_hex(binary), name=name) + "\n"
        ).encode()
        if latest:
            self.files[f"latest_{SUFFIX}"] = f"{sha}\n".encode()

    def tamper(self, sha: str, binary: bytes) -> None:
        """Serve ``binary`` for ``sha`` while keeping the old published checksum."""
        self.files[f"devin-remote_{sha}_{SUFFIX}"] = binary

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/remote/"

    def count(self, suffix: str) -> int:
        return sum(1 for path in self.requests if path.endswith(suffix))

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        dist = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                dist.requests.append(self.path)
                if dist.fail_statuses:
                    self.send_response(dist.fail_statuses.pop(0))
                    self.end_headers()
                    return
                name = self.path.rsplit("/", 1)[-1]
                if name in dist.stalls:
                    self._stall(*dist.stalls[name])
                    return
                body = dist.files.get(name) if self.path.startswith("/remote/") else None
                if body is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _stall(self, announced: int, sent: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(announced))
                self.end_headers()
                with contextlib.suppress(OSError):  # the client may hang up
                    self.wfile.write(sent)
                    self.wfile.flush()
                dist._closing.wait(120)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def __enter__(self) -> DistServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def wait_for(
    predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    try:
        return wait_until(predicate, timeout=timeout, interval=interval, what=what or repr(predicate))
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None


class WorkerProcess:
    """``devin-outposts worker start`` (or another ``command``, e.g. ``orchestrate``) in a subprocess (own
    process group), stopped at the end of the test."""

    def __init__(
        self,
        args: list[str],
        env: Mapping[str, str],
        log_path: Path,
        command: tuple[str, ...] = ("worker", "start"),
        prefix: tuple[str, ...] = (),
        python: str = sys.executable,
    ) -> None:
        self.args = args
        self.env = dict(env)
        self.log_path = log_path
        self.command = command
        #: What the worker's command line is run under (a program that execs it).
        self.prefix = prefix
        self.python = python
        self.proc: Optional[subprocess.Popen[bytes]] = None

    def start(self) -> WorkerProcess:
        argv = [*self.prefix, self.python, "-m", "devin_outposts", *self.command, *self.args]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(
                f"worker did not exit within {timeout}s; log:\n{self.log()[-3000:]}"
            ) from exc

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def kill9(self) -> None:
        """SIGKILL the worker only (its remotes keep running, as after a real crash)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop the worker gracefully, then kill its whole process group if anything is left."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def kill_pids(pids: Iterator[int]) -> None:
    """Kill leftover fake remotes (their own process groups) after a test."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not alive
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return True


__all__ = ["DistServer", "FakeRemote", "WorkerProcess", "alive", "kill_pids", "sha256_hex", "wait_for"]


class FakeFleet:
    """An in-memory stand-in for :class:`FleetClient`'s session calls (claim/renew/get/release).

    ``statuses[sid]`` is the session_status served by ``get_devin``; ``gone`` holds tombstoned ids;
    ``renew_error`` (an exception) is raised by the next renewal; while ``outage`` is set every renewal
    and read fails with a 503; every call is logged in ``calls``.
    """

    def __init__(self, ttl: float = 30.0, outpost_id: str = "outpost_env-1") -> None:
        self.ttl = ttl
        self.outpost_id = outpost_id
        self.statuses: dict[str, str] = {}
        self.holders: dict[str, str] = {}
        self.gone: set[str] = set()
        self.renew_error: Optional[Exception] = None
        self.outage = False
        #: session_id -> the claim_deadline of the last claim or renewal that succeeded.
        self.deadlines: dict[str, int] = {}
        self.calls: list[tuple[str, str]] = []
        self.tokens = 0

    def entry(self, sid: str, **status: Any) -> Any:
        from devin_outposts.api.models import QueueEntry

        holder = self.holders.get(sid)
        data = {
            "metadata": {"session_id": sid, "outpost_id": self.outpost_id, "created_at": 1, "updated_at": 1},
            "spec": {"kind": "new", "platform": None, "remote_binary_sha": None},
            "status": {
                "phase": "claimed" if holder else "pending",
                "acceptor_id": holder,
                "claim_deadline": int(time.time() + self.ttl) if holder else None,
                "session_status": self.statuses.get(sid, "pending"),
                **status,
            },
        }
        return QueueEntry.model_validate(data)

    async def claim(self, session_id: str, acceptor_id: str) -> Any:
        from devin_outposts.api.errors import FleetConflict, FleetNotFound

        renewal = self.holders.get(session_id) == acceptor_id
        self.calls.append(("renew" if renewal else "claim", session_id))
        if renewal and self.renew_error is not None:
            error, self.renew_error = self.renew_error, None
            # pylint only sees the None assignments here; the tests set an exception, checked just above.
            raise error  # pylint: disable=raising-bad-type
        self._fail_in_outage(f"claim session {session_id}")
        if session_id in self.gone:
            raise FleetNotFound(f"claim session {session_id}", "Session not found in queue", 404)
        if self.holders.get(session_id) not in (None, acceptor_id):
            raise FleetConflict(f"claim session {session_id}", "Session is already claimed", 409)
        self.holders[session_id] = acceptor_id
        self.tokens += 1
        entry = self.entry(
            session_id,
            connect_token=f"ct_fake_connect_token_{self.tokens:04d}",
            gateway_url="ws://127.0.0.1:9/gw",
        )
        self.deadlines[session_id] = entry.status.claim_deadline
        return entry

    async def get_devin(self, session_id: str) -> Any:
        from devin_outposts.api.errors import FleetNotFound

        self.calls.append(("get", session_id))
        self._fail_in_outage(f"get session {session_id}")
        if session_id in self.gone:
            raise FleetNotFound(f"get session {session_id}", "not found", 404)
        return self.entry(session_id)

    async def release(self, session_id: str, acceptor_id: str, *, missing_ok: bool = True) -> Any:
        self.calls.append(("release", session_id))
        if self.holders.get(session_id) == acceptor_id:
            del self.holders[session_id]
        return None

    def _fail_in_outage(self, what: str) -> None:
        from devin_outposts.api.errors import FleetServerError

        if self.outage:
            raise FleetServerError(what, "Service Unavailable", 503)

    def count(self, call: str) -> int:
        return sum(1 for name, dummy in self.calls if name == call)


# --- helpers for the tests with the simulator's stand-in devin-remote --------------------------------


def make_git_repo(path: Path, files: Mapping[str, str]) -> Path:
    """A git repository at ``path`` with ``files`` in one commit (``git init`` + commit, no user config)."""
    path.mkdir(parents=True)
    for name, content in files.items():
        (path / name).write_text(content)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com"]
    git += ["-c", "init.defaultBranch=main"]
    for args in (["init", "-q"], ["add", "--", *files], ["commit", "-q", "-m", "first"]):
        subprocess.run([*git, *args], cwd=path, check=True, capture_output=True)
    return path


def pids_working_under(root: Path) -> list[int]:
    """Live processes of this user whose working directory is ``root`` or below it (Linux ``/proc``).

    A worker runs every ``devin-remote`` (and the commands it starts) in a working directory under the
    test's ``tmp_path``, so this finds whatever a test left running, whatever the process group.
    """
    base = str(root.resolve())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cwd = os.readlink(entry / "cwd")
            if (cwd == base or cwd.startswith(base + os.sep)) and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def kill_pids_working_under(root: Path) -> list[int]:
    """SIGKILL every process :func:`pids_working_under` finds; returns their pids."""
    pids = pids_working_under(root)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids


def metrics_from_log(log: str) -> str:
    """The /metrics of a worker or orchestrator started with ``--metrics-addr 127.0.0.1:0`` (the address
    it listens on is in its log)."""
    marker = "serving /metrics and /healthz on "
    line = next(line for line in log.splitlines() if marker in line)
    address = line.split(marker, 1)[1].split()[0].rstrip(".,")
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        return str(reply.read().decode())
