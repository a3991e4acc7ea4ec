"""Running a session confined to its network policy: the launcher's command line and the worker's seam.

The worker (or an orchestrator driver) starts a session whose policy is enforced as::

    sandbox_argv(argv, egress_socket, policy_file)
    # = unshare --user --map-root-user --net --mount -- python -I -m devin_outposts.core.netpolicy.sandbox \\
    #       --socket <session dir>/egress.sock --policy-file <0600 json> -- <argv...>

after :func:`write_policy_file`, with the egress proxy already listening on the socket, as the worker's
user (root or not: an unprivileged user namespace is enough). :func:`~.probe.probe` says once whether this
host can do it at all. The launcher (:mod:`.launcher`) sets the namespace up, checks it has no way out,
starts the shim and the stub DNS and then ``argv``, and exits as ``argv`` does; its own failures exit
with a :class:`SandboxExit` code and one line on stderr, and ``argv`` never runs.

Why ``unshare`` (util-linux) and not Python's ``os.unshare``: that exists from Python 3.12 only, and a
process cannot enter a new user namespace once it has threads; the ``unshare`` program does it before this
interpreter starts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, Union

from .launcher_exits import SandboxExit
from .policy import Policy, PolicyError

LAUNCHER_MODULE = "devin_outposts.core.netpolicy.sandbox"
__all__ = ["LAUNCHER_MODULE", "SandboxExit", "main", "read_policy_file", "sandbox_argv", "write_policy_file"]


def sandbox_argv(
    argv: Sequence[str],
    socket_path: Union[str, Path],
    policy_file: Union[str, Path],
    *,
    python: Optional[str] = None,
    unshare: Optional[str] = None,
) -> list[str]:
    """The command line that runs ``argv`` confined (``python``: this interpreter by default)."""
    return [
        unshare or shutil.which("unshare") or "unshare",
        "--user",
        "--map-root-user",
        "--net",
        "--mount",
        "--",
        python or sys.executable,
        "-I",
        "-m",
        LAUNCHER_MODULE,
        "--socket",
        str(socket_path),
        "--policy-file",
        str(policy_file),
        "--",
        *argv,
    ]


def write_policy_file(path: Union[str, Path], network_policy: Any, gateway_url: Optional[str]) -> Path:
    """Write what the launcher reads: ``{"network_policy": ..., "gateway_url": ...}``, mode 0600, replaced
    whole. ``network_policy`` is the wire dict, an ``api.models.NetworkPolicy`` or None."""
    if hasattr(network_policy, "model_dump"):
        network_policy = network_policy.model_dump(mode="json")
    Policy.from_spec(network_policy, gateway_url)  # refuse here what the launcher could not read
    target = Path(path)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        os.chmod(temporary, 0o600)  # whatever the umask (O_CREAT's mode is masked by it)
        json.dump({"network_policy": network_policy, "gateway_url": gateway_url}, handle)
    os.replace(temporary, target)
    return target


def read_policy_file(path: Union[str, Path]) -> Policy:
    """The policy a file from :func:`write_policy_file` holds; ValueError when it cannot be read as one."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read the policy file {path}: {exc}") from exc
    if not isinstance(document, Mapping):
        raise ValueError(f"the policy file {path} does not hold an object")
    gateway_url = document.get("gateway_url")
    if gateway_url is not None and not isinstance(gateway_url, str):
        raise ValueError(f"the policy file {path}: gateway_url is not a string")
    try:
        return Policy.from_spec(document.get("network_policy"), gateway_url)
    except PolicyError as exc:
        raise ValueError(f"the policy file {path}: {exc}") from exc


def main(args: Optional[Sequence[str]] = None) -> int:
    """The launcher's command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {LAUNCHER_MODULE}",
        description="Run a command confined to a session's network policy.",
    )
    parser.add_argument("--socket", required=True, help="the egress proxy's Unix socket")
    parser.add_argument("--policy-file", required=True, help="the 0600 JSON file write_policy_file wrote")
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- then the session's command line")
    try:
        options = parser.parse_args(args)
    except SystemExit as exc:
        if exc.code == 0:  # --help
            return 0
        return SandboxExit.BAD_USAGE
    argv = options.argv[1:] if options.argv[:1] == ["--"] else options.argv
    if not argv:
        return _refuse(SandboxExit.BAD_USAGE, "no command to run after --")
    try:
        policy = read_policy_file(options.policy_file)
    except ValueError as exc:
        return _refuse(SandboxExit.BAD_USAGE, str(exc))
    return _launch(options.socket, policy, argv, os.path.dirname(os.path.abspath(options.policy_file)))


if sys.platform == "linux":

    def _launch(egress_socket: str, policy: Policy, argv: Sequence[str], session_dir: str) -> int:
        from . import launcher  # Linux only

        return launcher.run(egress_socket, policy, argv, session_dir)

else:

    def _launch(egress_socket: str, policy: Policy, argv: Sequence[str], session_dir: str) -> int:
        return _refuse(SandboxExit.SETUP_FAILED, "network namespaces need Linux")


def _refuse(code: SandboxExit, why: str) -> int:
    print(f"devin-outposts sandbox: {why}", file=sys.stderr, flush=True)
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
