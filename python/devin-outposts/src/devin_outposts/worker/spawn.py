"""Launching and stopping ``devin-remote serve`` with the spawn-contract environment (docs/fleet-api.md §6.2).

The session environment is built from scratch, never copied: the three ``DEVIN_OUTPOST_*`` variables,
the per-session ``DEVIN_REMOTE_STATE_DIR``, the optional ``DEVIN_CHROME_PATH``, ``DEVIN_OUTPOST_DESKTOP``
and ``DEVIN_PTY_BRIDGE_PORT``, the desktop variables when set, and ``PATH HOME USER LOGNAME TMPDIR LANG
TZ`` when present (plus the Windows system variables on Windows). Nothing else, so the account token and
whatever else sits in the worker's environment never reaches the agent's shell. The connect token is
passed in the environment only, never in argv.

The remote runs in its own process group so that stopping it (SIGTERM, then SIGKILL after a grace
period; on Windows Ctrl-C through a helper attached to the remote's own hidden console, then
TerminateProcess: :meth:`~devin_outposts.core.platform.HostPlatform.request_stop`) also stops the shells
and tools it started. Its pid and start time are written to
``<state>/remote.pid`` (:mod:`devin_outposts.core.processes`) so that a worker restarted after ``kill -9``
can stop a remote its predecessor left behind before it starts a new one for the same session.

That record exists before the remote can run (POSIX). The worker does not start ``devin-remote`` itself
but a launcher (:meth:`~devin_outposts.core.platform.HostPlatform.gated_argv`: ``/bin/sh`` waiting for
one line on its standard input); it records the launcher's pid, process group and start time, which
``exec`` keeps, and only then writes the go-ahead, on which the launcher becomes ``devin-remote``. A worker
killed before the go-ahead closes its end of the pipe by dying, and the launcher exits without starting
the remote: every remote a worker could have started has a record its successor reads (issue 24; before,
a worker killed in the 4 to 10 ms between the start and the record left a remote nobody could find).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Optional

from devin_outposts.core import platform
from devin_outposts.core.processes import forget_remote_record, write_remote_record

log = logging.getLogger(__name__)

#: Seconds between two looks at a stopping remote's return code (see :meth:`RemoteProcess._exited`).
EXIT_POLL = 0.2
#: What the worker writes to a waiting launcher once the remote's record is on disk.
GO_AHEAD = b"go\n"
#: A test hook, harmless in production: seconds (at most 10) to wait between starting a remote's process
#: and recording it, which widens the window that test_worker_spawn_window.py kills a worker in.
TEST_RECORD_DELAY = "DEVIN_OUTPOSTS_TEST_RECORD_DELAY"


def _test_record_delay() -> float:
    try:
        return min(max(float(os.environ.get(TEST_RECORD_DELAY, "") or 0), 0.0), 10.0)
    except ValueError:
        return 0.0


def free_port() -> int:
    """A TCP port that was free on loopback a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def build_session_env(
    *,
    gateway_url: str,
    connect_token: str,
    session_id: str,
    state_dir: Path,
    pty_bridge_port: int,
    chrome_path: Optional[str] = None,
    desktop: Optional[str] = None,
    source: Optional[Mapping[str, str]] = None,
) -> dict[str, str]:
    """The complete environment of one ``devin-remote serve`` process: what the platform lets a session
    inherit from ``source`` (the worker's environment), then the spawn-contract variables."""
    env = platform.current().inherited_env(os.environ if source is None else source)
    env.update(
        {
            "DEVIN_OUTPOST_GATEWAY_URL": gateway_url,
            "DEVIN_OUTPOST_CONNECT_TOKEN": connect_token,
            "DEVIN_OUTPOST_SESSION_ID": session_id,
            "DEVIN_REMOTE_STATE_DIR": str(state_dir),
            "DEVIN_PTY_BRIDGE_PORT": str(pty_bridge_port),
        }
    )
    if chrome_path:
        env["DEVIN_CHROME_PATH"] = chrome_path
    if desktop:
        env["DEVIN_OUTPOST_DESKTOP"] = desktop
    return env


async def _spawn(argv: list[str], stdin: int, options: dict[str, Any]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *argv, stdin=stdin, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, **options
    )


def _check_executable(binary: Path) -> None:
    """Raise the ``OSError`` that starting ``binary`` would raise, before a launcher is started for it."""
    if not binary.is_file():
        raise FileNotFoundError(errno.ENOENT, "No such file", str(binary))
    if not os.access(binary, os.X_OK):
        raise PermissionError(errno.EACCES, "Permission denied", str(binary))


class RemoteProcess:
    """One running ``devin-remote serve``."""

    def __init__(self, proc: asyncio.subprocess.Process, state_dir: Path, session_id: str) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.state_dir = state_dir
        self.session_id = session_id
        self._pumps: list[asyncio.Task[None]] = []
        self._stopping = False

    @classmethod
    async def start(
        cls,
        binary: Path,
        *,
        cwd: Path,
        env: Mapping[str, str],
        state_dir: Path,
        session_id: str,
        wrap: Optional[Callable[[list[str]], tuple[list[str], Sequence[int]]]] = None,
    ) -> RemoteProcess:
        """Start ``devin-remote serve``; its record is on disk before it runs (see the module docstring).
        ``wrap`` turns the command into the one to run and the descriptors it inherits (the session
        sandbox's launcher around it)."""
        host = platform.current()
        argv: list[str] = [str(binary), "serve"]
        pass_fds: Sequence[int] = ()
        if wrap is not None:
            argv, pass_fds = wrap(argv)
        gated = host.gated_argv(argv)
        options: dict[str, Any] = {"cwd": str(cwd), "env": dict(env), **host.process_group_options()}
        if pass_fds:
            options["pass_fds"] = tuple(pass_fds)
        if gated is None:  # no launcher (Windows): started at once, recorded just after
            proc = await _spawn(argv, asyncio.subprocess.DEVNULL, options)
            remote = cls(proc, state_dir, session_id)
            try:
                await remote._record()
            except BaseException:
                remote._signal_group(kill=True)
                raise
        else:
            _check_executable(binary)  # the launcher could only report a missing binary as an exit code
            launcher_stdin, go_ahead = os.pipe()  # not inheritable: the launcher gets the read end as stdin
            try:
                try:
                    proc = await _spawn(gated, launcher_stdin, options)
                finally:
                    os.close(launcher_stdin)
                remote = cls(proc, state_dir, session_id)
                await remote._record()
                os.write(go_ahead, GO_AHEAD)
            finally:
                # Without the go-ahead (an error, a cancellation, or this worker killed before this line),
                # the launcher reads end of file and exits: the remote never runs.
                os.close(go_ahead)
        remote._pumps = [
            asyncio.ensure_future(remote._pump(proc.stdout, logging.INFO)),
            asyncio.ensure_future(remote._pump(proc.stderr, logging.WARNING)),
        ]
        return remote

    async def _record(self) -> None:
        """Write ``remote.pid``, removing a partial record if that fails or is cancelled."""
        try:
            delay = _test_record_delay()
            if delay:
                await asyncio.sleep(delay)
            write_remote_record(self.state_dir, self.pid)
        except BaseException:
            forget_remote_record(self.state_dir)
            raise

    async def _pump(self, stream: Optional[asyncio.StreamReader], level: int) -> None:
        if stream is None:
            return
        logger = logging.getLogger("devin_outposts.remote")
        while True:
            try:
                line = await stream.readline()
            except (ValueError, asyncio.LimitOverrunError):  # an over-long line: skip it
                continue
            if not line:
                return
            logger.log(
                level,
                "%s",
                line.decode("utf-8", "replace").rstrip()[:4000],
                extra={"session_id": self.session_id, "pid": self.pid},
            )

    @property
    def returncode(self) -> Optional[int]:
        return self.proc.returncode

    def describe(self) -> str:
        return f"pid {self.pid}"

    async def wait_exit(self) -> int:
        return await self.proc.wait()

    async def wait(self) -> int:
        code = await self._exited()
        self._signal_group(kill=True)  # leftovers of a finished session
        # A child that escaped the group may hold the pipes open: do not wait for it forever.
        pending = (await asyncio.wait(self._pumps, timeout=2.0))[1] if self._pumps else set()
        for task in pending:
            task.cancel()
        forget_remote_record(self.state_dir)
        return code

    async def _exited(self, timeout: float = math.inf) -> int:
        """The exit code as soon as the remote's own process has ended; ``asyncio.TimeoutError`` after
        ``timeout`` seconds.

        ``Process.wait()`` alone returns (Python 3.11) only once every process holding the remote's stdout
        and stderr has closed them. On Windows ``TerminateProcess`` ends the remote alone, so a tool it
        started that ignored the Ctrl-C kept the worker waiting, and the claim held, for as long as the tool
        lived (seen under Wine). The transport's return code is set when the process ends, pipes or not.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        waiter = asyncio.ensure_future(self.proc.wait())
        try:
            while self.proc.returncode is None:
                left = deadline - loop.time()
                if left <= 0:
                    raise asyncio.TimeoutError
                await asyncio.wait({waiter}, timeout=min(EXIT_POLL, left))
            return self.proc.returncode
        finally:
            waiter.cancel()

    def _signal_group(self, *, kill: bool) -> None:
        platform.current().signal_group(self.proc, self.pid, kill=kill)

    async def stop(self, grace: float) -> int:
        """Ask the remote's group to stop (SIGTERM; Ctrl-C to its console on Windows), kill it (SIGKILL;
        TerminateProcess) when it has not exited ``grace`` seconds later; returns the exit code. A request
        that fails, whatever the error, is logged and leaves the forced stop to come after the grace."""
        if self.proc.returncode is None:
            self._stopping = True
            await self._request_stop()
            try:
                await self._exited(grace)
            except asyncio.TimeoutError:
                log.warning(
                    "devin-remote did not exit %.0fs after it was asked to stop; killing it",
                    grace,
                    extra={"session_id": self.session_id, "pid": self.pid},
                )
                self._signal_group(kill=True)
        return await self.wait()

    async def _request_stop(self) -> None:
        try:
            await platform.current().request_stop(self.proc, self.pid)
        except Exception as exc:  # whatever it is, the forced stop and the release must follow
            log.warning(
                "could not ask devin-remote pid %d to stop (%s: %s); it will be killed after the stop grace "
                "period",
                self.pid,
                type(exc).__name__,
                exc,
                extra={"session_id": self.session_id, "pid": self.pid},
            )
