"""One ansible-runner run in a child process, and what its job events say.

ansible-runner is run as a command (``python -m ansible_runner run``), not imported, for two reasons:

* **the environment.** ansible-runner seeds a run's environment with its own process's whole environment and
  writes it to the run's ``command`` artifact. The orchestrator's environment holds the account token
  (``DEVIN_OUTPOSTS_TOKEN``), which must reach neither a playbook nor an artifact. A child process gets only
  the environment given here (:func:`runner_environment`), so nothing else can leak into either.
* **stopping.** A run that times out or whose caller is cancelled is stopped with its whole process group
  (ansible-playbook and its forks), which a thread inside this process could not do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

#: Variables of the orchestrator's environment a run keeps (besides every ``ANSIBLE_*``): what ansible and
#: ssh need to find their tools, keys and locale. Everything else, the account token included, is dropped.
PASSTHROUGH = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "SSH_AUTH_SOCK",
)

#: Variables the driver's ``env`` option may not set: the credentials that must never reach a playbook.
FORBIDDEN_ENV = ("DEVIN_OUTPOSTS_TOKEN", "DEVIN_REMOTE_SESSION_TOKEN", "DEVIN_OUTPOST_CONNECT_TOKEN")

#: Seconds between SIGTERM and SIGKILL to a run's process group.
STOP_GRACE = 10.0


def runner_environment(extra: Mapping[str, str], base: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """The environment of a run: :data:`PASSTHROUGH` and ``ANSIBLE_*`` from ``base`` (the orchestrator's
    environment), this Python's ``bin`` first on ``PATH`` (so ansible-runner finds the ``ansible-playbook``
    installed beside it), then ``extra`` (the driver's ``env`` option)."""
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items() if k in PASSTHROUGH or k.startswith("ANSIBLE_")}
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = (
        os.pathsep.join([bindir, env["PATH"]]) if env.get("PATH") else f"{bindir}{os.pathsep}/usr/bin:/bin"
    )
    env.update(extra)
    return env


@dataclass
class RunResult:
    """How a run ended and the events it wrote (``job_events/*.json``, in order)."""

    status: str  # ansible-runner's: successful, failed, timeout, canceled, or "error" if it did not start
    rc: Optional[int]
    artifact_dir: Path
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "successful" and self.rc == 0

    def stats(self) -> dict[str, Any]:
        """What the playbook set with ``ansible.builtin.set_stats`` (global, not per host)."""
        for event in reversed(self.events):
            if event.get("event") == "playbook_on_stats":
                data = event.get("event_data", {}).get("artifact_data") or {}
                return dict(data) if isinstance(data, dict) else {}
        return {}

    def host_results(self, host: str) -> list[dict[str, Any]]:
        """The ``event_data`` of every per-host result event of ``host`` (ok, failed, unreachable, ...)."""
        return [
            dict(event.get("event_data", {}), event=event.get("event"))
            for event in self.events
            if str(event.get("event", "")).startswith("runner_on_")
            and event.get("event_data", {}).get("host") == host
        ]

    def failure(self) -> str:
        """One line about what failed: the first failed or unreachable task and its message, else how the
        run ended."""
        for event in self.events:
            kind = event.get("event")
            if kind in ("runner_on_failed", "runner_on_unreachable") and not event.get("event_data", {}).get(
                "ignore_errors"
            ):
                data = event.get("event_data", {})
                res = data.get("res") or {}
                message = str(res.get("msg") or res.get("stderr") or res.get("reason") or "").strip()
                message = " ".join(message.split())[:300]
                what = "unreachable" if kind == "runner_on_unreachable" else "failed"
                return f"task {data.get('task', '?')!r} {what} on {data.get('host', '?')}: {message}"
        return f"ansible-runner status {self.status}, rc {self.rc}"


async def run(
    command: Sequence[str],
    *,
    artifact_root: Path,
    work_root: Path,
    ident: str,
    env: Mapping[str, str],
    extravars: Mapping[str, Any],
    timeout: float,
    cmdline: Optional[str] = None,
    playbook: Optional[str] = None,
    module: Optional[str] = None,
    module_args: Optional[str] = None,
    hosts: Optional[str] = None,
    inventory: Optional[str] = None,
    inventory_hosts: Optional[Mapping[str, Mapping[str, Any]]] = None,
    rotate: int = 0,
    forks: Optional[int] = None,
) -> RunResult:
    """Run a playbook (or one module on ``hosts``) through ansible-runner; its artifacts go to
    ``artifact_root/ident``, its private data directory is a fresh one under ``work_root``.
    ``inventory_hosts`` (host -> connection variables) is written as the run's own inventory, else
    ``inventory`` (a path) is used, else ansible's implicit localhost. Never raises for a failed run: the
    result says how it ended (``timeout`` after ``timeout`` seconds)."""
    # The private data directory holds the extra variables and the inventory (no secret: the connect token
    # travels in a file of its own, see AnsibleDriver.start); it is removed after the run.
    private = _prepare(work_root, artifact_root, ident, extravars, inventory_hosts)
    try:
        argv = [*command, "run", str(private), "--ident", ident, "--artifact-dir", str(artifact_root), "-q"]
        if rotate:
            argv += ["--rotate-artifacts", str(rotate)]
        if forks:
            argv += ["--forks", str(forks)]
        if cmdline:
            argv += ["--cmdline", cmdline]
        if inventory_hosts is not None:
            argv += ["--inventory", str(private / "inventory" / "hosts.json")]
        elif inventory:
            argv += ["--inventory", inventory]
        if playbook is not None:
            argv += ["-p", playbook]
        else:
            argv += ["-m", str(module), "-a", str(module_args or ""), "--hosts", str(hosts)]
        rc = await _wait(argv, env=env, cwd=private, timeout=timeout)
        return _collect(artifact_root / ident, rc)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _prepare(
    work_root: Path,
    artifact_root: Path,
    ident: str,
    extravars: Mapping[str, Any],
    inventory_hosts: Optional[Mapping[str, Mapping[str, Any]]],
) -> Path:
    artifact_root.mkdir(parents=True, exist_ok=True, mode=0o700)
    work_root.mkdir(parents=True, exist_ok=True, mode=0o700)
    private = Path(tempfile.mkdtemp(prefix=f"{ident}-", dir=work_root))
    (private / "env").mkdir(mode=0o700)
    _write_private(private / "env" / "extravars", extravars)
    if inventory_hosts is not None:
        (private / "inventory").mkdir(mode=0o700)
        _write_private(private / "inventory" / "hosts.json", {"all": {"hosts": dict(inventory_hosts)}})
    return private


def _collect(run_dir: Path, rc: Optional[int]) -> RunResult:
    status = "timeout" if rc is None else (_read_text(run_dir / "status") or "error")
    recorded_rc = _read_text(run_dir / "rc")
    return RunResult(
        status=status,
        rc=int(recorded_rc) if recorded_rc.lstrip("-").isdigit() else rc,
        artifact_dir=run_dir,
        events=_read_events(run_dir / "job_events"),
    )


async def run_version(command: Sequence[str], *, env: Mapping[str, str]) -> Optional[str]:
    """ansible-runner's version, or None when ``command`` cannot run it."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *command,
            "--version",
            env=dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        out, dummy = await asyncio.wait_for(proc.communicate(), 60)
    except (OSError, asyncio.TimeoutError):
        return None
    return out.decode(errors="replace").strip() if proc.returncode == 0 else None


def _write_private(path: Path, data: Any) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def _read_events(directory: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for path in directory.glob("*.json") if directory.is_dir() else ():
        with contextlib.suppress(OSError, ValueError):
            event = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(event, dict):
                events.append(event)
    events.sort(key=lambda e: int(e.get("counter", 0)))
    return events


async def _wait(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float) -> Optional[int]:
    """Run ``argv`` in its own process group; its exit code, or None after ``timeout`` (the group is then
    stopped). A cancelled caller stops the group too before the cancellation goes on."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=str(cwd),
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        # ansible-runner's own errors (a bad option, a missing playbook) are in its artifacts' stderr too.
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        return await asyncio.wait_for(proc.wait(), timeout)
    except asyncio.TimeoutError:
        await _stop_group(proc)
        return None
    except asyncio.CancelledError:
        await asyncio.shield(_stop_group(proc))
        raise


async def _stop_group(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM to the run's process group, SIGKILL after :data:`STOP_GRACE` seconds."""
    if sys.platform == "win32":  # ansible has no Windows controller; this keeps the module importable there
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
    else:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if proc.returncode is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), STOP_GRACE)
