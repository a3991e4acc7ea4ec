"""Running a session in its sandbox: what the launcher is told, its command line, and the worker's seam.

The worker (or an orchestrator driver) starts a session whose policy is enforced as::

    command = sandbox_command(argv, spec_fd=write_spec(spec), doorway_fd=launcher_end.fileno())
    # = python -I -m devin_outposts.core.netpolicy.sandbox --spec-fd N --doorway-fd M -- <argv...>

as its own user, with both descriptors passed on (``pass_fds``) and the egress proxy already serving the
doorway's other end (:mod:`.doorway`). A :class:`SandboxSpec` says everything the launcher needs: the
policy and the gateway, what the session sees of the host (:class:`~.view.View`), where it lives, and,
for a root worker, the uid and gid it runs as. It travels in an anonymous file (``memfd``): nothing about
the session is written where another process could read or change it.

:func:`~.probe.probe` says once whether this host can do it at all. The launcher (:mod:`.launcher`) enters
fresh namespaces, builds the view, sets the network namespace up, checks it has no way out, starts the shim
and the stub DNS and then ``argv`` in a process namespace of its own, and exits as ``argv`` does; its own
failures exit with a :class:`SandboxExit` code and one line on stderr, and ``argv`` never runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Optional

from .launcher_exits import SandboxExit
from .policy import PolicyError
from .spec import SandboxSpec

LAUNCHER_MODULE = "devin_outposts.core.netpolicy.sandbox"
__all__ = [
    "LAUNCHER_MODULE",
    "SandboxExit",
    "SandboxSpec",
    "main",
    "read_spec",
    "sandbox_command",
    "write_spec",
]


def sandbox_command(
    argv: Sequence[str], *, spec_fd: int, doorway_fd: int, python: Optional[str] = None
) -> list[str]:
    """The command line that runs ``argv`` in its sandbox (``python``: this interpreter by default)."""
    return [
        python or sys.executable,
        "-I",
        "-m",
        LAUNCHER_MODULE,
        "--spec-fd",
        str(spec_fd),
        "--doorway-fd",
        str(doorway_fd),
        "--",
        *argv,
    ]


def write_spec(spec: SandboxSpec) -> int:
    """An anonymous, read-only-to-be descriptor holding ``spec`` (positioned at its start, inheritable:
    give it to the launcher with ``pass_fds``, then close it). Raises ``PolicyError`` on a policy the
    launcher could not read."""
    spec.policy()
    if sys.platform == "linux":
        descriptor: int = os.memfd_create("devin-outposts-sandbox")  # close-on-exec: pass_fds gives it on
        try:
            os.write(descriptor, spec.to_json().encode())
            os.lseek(descriptor, 0, os.SEEK_SET)
        except BaseException:
            os.close(descriptor)
            raise
        return descriptor
    else:  # an else, so that neither of mypy's platform passes calls the rest unreachable
        raise OSError("session sandboxes need Linux")


def read_spec(descriptor: int) -> SandboxSpec:
    """The spec behind ``descriptor`` (closed afterwards); ValueError when it cannot be read as one."""
    try:
        with os.fdopen(descriptor, "rb") as handle:
            text = handle.read(16 << 20).decode("utf-8")
        return SandboxSpec.from_json(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, TypeError, PolicyError) as exc:
        raise ValueError(f"cannot read the sandbox spec: {exc}") from exc


def main(args: Optional[Sequence[str]] = None) -> int:
    """The launcher's command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {LAUNCHER_MODULE}",
        description="Run a command in a session's sandbox.",
    )
    parser.add_argument("--spec-fd", type=int, required=True, help="the descriptor write_spec made")
    parser.add_argument("--doorway-fd", type=int, required=True, help="the launcher's end of the doorway")
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
        spec = read_spec(options.spec_fd)
    except ValueError as exc:
        return _refuse(SandboxExit.BAD_USAGE, str(exc))
    return _launch(spec, options.doorway_fd, argv)


if sys.platform == "linux":

    def _launch(spec: SandboxSpec, doorway_fd: int, argv: Sequence[str]) -> int:
        from . import launcher  # Linux only

        return launcher.run(spec, doorway_fd, argv)

else:

    def _launch(spec: SandboxSpec, doorway_fd: int, argv: Sequence[str]) -> int:
        return _refuse(SandboxExit.SETUP_FAILED, "session sandboxes need Linux")


def _refuse(code: SandboxExit, why: str) -> int:
    print(f"devin-outposts sandbox: {why}", file=sys.stderr, flush=True)
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
