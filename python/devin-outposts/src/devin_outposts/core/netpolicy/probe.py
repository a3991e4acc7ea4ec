"""Can this host confine sessions to their network policy? :func:`probe` runs the real thing once (the
launcher of :mod:`.sandbox` around ``true``) and says why not, in one line, or None when it can.

A worker that gets a reason does not serve sessions whose policy is enforced (it releases them so that a
worker that can enforce takes them), unless it runs with ``--network-policy ignore``.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from .sandbox import SandboxExit, SandboxSpec, sandbox_command, write_spec

#: A cold interpreter, ``ip`` and ``nft``: well under a second on an idle host.
PROBE_TIMEOUT_SECONDS = 60.0


@functools.lru_cache(maxsize=1)
def probe() -> Optional[str]:
    """None when sessions can be confined here, else why not (one line). Run once per process: the answer
    depends on the host and on how this service was started, which do not change while it runs."""
    return probe_host()


def probe_host(*, python: Optional[str] = None, timeout: float = PROBE_TIMEOUT_SECONDS) -> Optional[str]:
    """:func:`probe` without the cache, with the interpreter to use (tests give another)."""
    system = sys.platform  # (a plain value: mypy's other platform runs check the rest)
    if not system.startswith("linux"):
        return f"sessions can only be confined on Linux (this is {system})"
    if sys.platform == "linux":
        return _trial(python, timeout)
    else:  # an else, so that neither of mypy's platform passes calls the rest unreachable
        return f"sessions can only be confined on Linux (this is {system})"


if sys.platform == "linux":

    def _trial(python: Optional[str], timeout: float) -> Optional[str]:
        """The trial session (Linux)."""
        from . import doorway

        true = shutil.which("true") or "/bin/true"
        with tempfile.TemporaryDirectory(prefix="devin-outposts-probe-") as directory:
            state, work = Path(directory) / "state", Path(directory) / "work"
            for path in (state / "home", state / "tmp", state / "var-tmp", work):
                path.mkdir(parents=True)
            spec = SandboxSpec({"enabled": True, "allow": []}, None, workdir=str(work), state_dir=str(state))
            spec_fd = write_spec(spec)
            proxy_end, launcher_end = doorway.pair()
            fds = (spec_fd, launcher_end.fileno())
            argv = sandbox_command([true], spec_fd=spec_fd, doorway_fd=launcher_end.fileno(), python=python)
            try:
                result = subprocess.run(  # noqa: S603
                    argv, capture_output=True, text=True, timeout=timeout, check=False, pass_fds=fds, cwd=work
                )
            except OSError as exc:
                return f"cannot run {argv[0]}: {exc}"
            except subprocess.TimeoutExpired:
                return f"a trial session did not finish within {timeout:.0f} s"
            finally:
                os.close(spec_fd)
                launcher_end.close()
                proxy_end.close()
        if result.returncode == 0:
            return None
        said = _last_line(result.stderr)
        if (
            result.returncode == SandboxExit.NAMESPACES
            or result.returncode < 0
            or "Address family not" in said
        ):
            return _namespace_reason(said, result.returncode)
        if result.returncode in {int(code) for code in SandboxExit}:
            return _launcher_reason(SandboxExit(result.returncode), said)
        return f"the trial session failed (exit {result.returncode}): {said}"

else:

    def _trial(python: Optional[str], timeout: float) -> Optional[str]:
        return "sessions can only be confined on Linux"


def _launcher_reason(code: SandboxExit, said: str) -> str:
    if code is SandboxExit.SETUP_FAILED and "nft" in said and "not permitted" in said.lower():
        return f"nft is refused inside a user namespace (a kernel without nftables there?): {said}"
    return f"the trial session's launcher failed ({code.name}): {said}"


def _namespace_reason(said: str, returncode: int) -> str:
    """Why the launcher could not make the session's namespaces: the first setting of this host that forbids
    it, else its words. The systemd directives named are the ones a worker unit's hardening can break
    confinement with (each one tried on Debian 12 and 13: docs/roles.md, "Hardening")."""
    if returncode == -_SIGSYS:
        # systemd's SystemCallFilter= kills (SIGSYS) by default: nothing is said on stderr.
        return (
            "a seccomp filter killed the trial session (SIGSYS: systemd SystemCallFilter= on this service "
            "must allow @mount as well as @system-service)"
        )
    if returncode < 0:
        return f"the trial session was killed by signal {-returncode}: {said}"
    if "Address family not supported" in said:
        return (
            "netlink sockets are refused (systemd RestrictAddressFamilies= on this service must allow "
            f"AF_NETLINK, which ip and nft use): {said}"
        )
    unprivileged = _euid() != 0
    settings = (
        ("/proc/sys/user/max_user_namespaces", "0", True, "user namespaces are disabled"),
        (
            "/proc/sys/kernel/unprivileged_userns_clone",
            "0",
            unprivileged,
            "unprivileged user namespaces are disabled",
        ),
        (
            "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
            "1",
            unprivileged,
            "AppArmor restricts unprivileged user namespaces",
        ),
    )
    for path, forbidding, applies, meaning in settings:
        if applies and _read(path) == forbidding:
            sysctl = path[len("/proc/sys/") :].replace("/", ".")
            return f"{meaning} ({sysctl} = {forbidding}): {said}"
    if _read_status("Seccomp") not in ("", "0"):
        return (
            "cannot create a user and network namespace under a seccomp filter (systemd RestrictNamespaces= "
            f"on this service must allow user, net and mnt, SystemCallFilter= unshare and @mount): {said}"
        )
    return f"cannot create a user and network namespace: {said}"


if sys.platform == "win32":
    _SIGSYS = 0  # (no such signal there; Windows never gets this far)

    def _euid() -> int:
        return -1

else:
    _SIGSYS = int(signal.SIGSYS)

    def _euid() -> int:
        return os.geteuid()


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    last = lines[-1] if lines else "(nothing on stderr)"
    return last.removeprefix("devin-outposts sandbox: ")


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _read_status(field: str) -> str:
    for line in _read("/proc/self/status").splitlines():
        if line.startswith(f"{field}:"):
            return line.split(":", 1)[1].strip()
    return ""
