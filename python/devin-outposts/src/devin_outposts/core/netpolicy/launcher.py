"""The launcher: the first process of a confined session, inside its fresh user + network namespace
(:mod:`.sandbox` has its command line; docs/network-policy.md, "How a session is confined").

In order, and the session never starts when a step fails (exit code :class:`~.sandbox.SandboxExit`, one
line on stderr):

1. set the namespace up (:func:`.namespace.set_up`), refusing one that is not fresh, and cover the host's
   sockets that act outside it (:func:`.namespace.hide_host_services`) in the launcher's mount namespace;
   then give the session an ``/etc/hosts`` of the host's loopback lines (:mod:`.hostsfile`; a failure there
   is a warning, not a refusal: it confines nothing);
2. bind the shim's and the stub DNS's sockets;
3. the preflight (:func:`.namespace.preflight`): only ``lo``, the table, a UDP probe dropped, a TCP probe
   redirected;
4. fork the **shim process** (shim and stub DNS on one event loop), which dies with the launcher
   (``PR_SET_PDEATHSIG``);
5. start the session in a **user namespace of its own** that maps the worker's uid and gid (the session
   sees its own ids). The network namespace belongs to the launcher's user namespace, and capabilities in a
   child user namespace give no power over it: the session cannot change the routes or the table
   (``nft flush ruleset`` fails with EPERM), whatever capabilities it holds in its own namespace (all of
   them when the worker is root). Dropping capabilities with no_new_privs would do the same for a
   non-root worker only, and would break a root session's ``sudo``-free habits less predictably;
6. wait for the session, then stop the shim and exit as the session did (the same code, or the same
   signal).

Signals: the worker stops a session by signalling its process group, which holds the launcher, the shim
and the session. The session gets those signals directly; the shim blocks them (it keeps serving while the
session shuts down); the launcher passes on only a SIGTERM, SIGINT or SIGHUP that was sent to it alone
(``kill <pid>``, systemd's ``KillMode=mixed``), so the session gets each signal once. It tells the two
apart by the shim's pending signals: a signal to the group is queued to every member (newest first, so the
shim before the launcher) before the launcher's handler runs.

The launcher and the shim are not dumpable: the session, which runs as the same user, can neither trace
them nor read their memory.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from devin_outposts import privacy

from . import hostsfile, namespace, shim, stubdns
from .launcher_exits import SandboxExit
from .policy import Decision, Policy

assert sys.platform == "linux"  # namespaces, prctl, signal masks (mypy skips the rest elsewhere)

log = logging.getLogger("devin_outposts.sandbox")

PROXY_URL = f"http://127.0.0.1:{namespace.EXPLICIT_PORT}"
NO_PROXY = "localhost,127.0.0.1,::1"
#: The signals passed on to the session when they reach the launcher alone.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_CLONE_NEWUSER = 0x10000000
_PR_SET_PDEATHSIG = 1


def session_environment(environment: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The launcher's environment with the proxy variables set, upper and lower case (tools read either)."""
    env = dict(os.environ if environment is None else environment)
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = PROXY_URL
    env["NO_PROXY"] = env["no_proxy"] = NO_PROXY
    return env


@dataclass
class Listeners:
    """The sockets the shim process serves, bound by the launcher (a failure is the launcher's to report)."""

    explicit: list[socket.socket] = field(default_factory=list)
    transparent: list[socket.socket] = field(default_factory=list)
    dns_udp: list[socket.socket] = field(default_factory=list)
    dns_tcp: list[socket.socket] = field(default_factory=list)

    def all(self) -> Iterator[socket.socket]:
        yield from (*self.explicit, *self.transparent, *self.dns_udp, *self.dns_tcp)

    def close(self) -> None:
        for sock in self.all():
            sock.close()


def run(egress_socket: str, policy: Policy, argv: Sequence[str], session_dir: Optional[str] = None) -> int:
    """Set up, check, start the shim and the session; the session's exit status (or a SandboxExit).
    ``session_dir``: where the session's hosts file is written (default: the egress socket's directory)."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="devin-outposts sandbox: %(message)s")
    for ignored in policy.ignored:
        log.warning("policy rule ignored: %s", ignored)
    try:
        layout = namespace.set_up(policy.gateway)
        namespace.hide_host_services(keep=[egress_socket])
    except namespace.MissingToolError as exc:
        return _refuse(SandboxExit.MISSING_TOOL, str(exc))
    except namespace.SetupError as exc:
        return _refuse(SandboxExit.SETUP_FAILED, f"cannot set up the session's network namespace: {exc}")
    try:
        hostsfile.bind_session_hosts(session_dir or os.path.dirname(egress_socket))
    except hostsfile.HostsFileError as exc:
        log.warning("names in /etc/hosts resolve to their addresses, not through the stub DNS: %s", exc)
    try:
        listeners = bind_listeners(layout)
    except OSError as exc:
        return _refuse(SandboxExit.SHIM_FAILED, f"the shim cannot listen: {exc}")
    try:
        namespace.preflight(layout, listeners.transparent)
    except (namespace.NotIsolatedError, namespace.SetupError) as exc:
        return _refuse(SandboxExit.NOT_ISOLATED, f"preflight: the session would not be confined: {exc}")
    privacy.make_undumpable()
    shim_pid, consume = start_shim(egress_socket, policy, layout, listeners)
    listeners.close()
    forwarder = SignalForwarder(shim_pid, consume)
    try:
        session = start_session(argv)
    except (OSError, subprocess.SubprocessError) as exc:
        stop_shim(shim_pid)
        return _refuse(SandboxExit.SESSION_NOT_STARTED, f"cannot start {argv[0]}: {exc}")
    forwarder.started(session.pid)
    status = session.wait()
    for signum in FORWARDED:
        signal.signal(signum, signal.SIG_IGN)
    stop_shim(shim_pid)
    return exit_like(status)


def bind_listeners(layout: namespace.Layout) -> Listeners:
    listeners = Listeners()
    loopbacks: list[str] = ["127.0.0.1", "::1"] if layout.ipv6 else ["127.0.0.1"]
    try:
        for host in loopbacks:
            listeners.explicit.append(_listen(host, namespace.EXPLICIT_PORT))
            listeners.transparent.append(_listen(host, namespace.TRANSPARENT_PORT))
        for address in layout.nameservers:
            listeners.dns_udp.append(_bind(address, namespace.DNS_PORT, socket.SOCK_DGRAM))
            listeners.dns_tcp.append(_listen(str(address), namespace.DNS_PORT))
    except OSError:
        listeners.close()
        raise
    return listeners


def start_shim(
    egress_socket: str, policy: Policy, layout: namespace.Layout, listeners: Listeners
) -> tuple[int, int]:
    """Fork the shim process; its pid, and the pipe on which the launcher asks it to consume a signal."""
    read_end, write_end = os.pipe()
    launcher = os.getpid()
    pid = os.fork()
    if pid:
        os.close(read_end)
        return pid, write_end
    code = 1
    try:
        os.close(write_end)
        signal.pthread_sigmask(signal.SIG_BLOCK, set(FORWARDED))
        _libc().prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != launcher:
            os._exit(0)  # the launcher died before the line above
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        asyncio.run(_serve_shim(egress_socket, policy, layout, listeners, read_end))
        code = 0
    except BaseException:  # a forked child must never return into the launcher's code
        log.exception("the shim stopped")
    finally:
        os._exit(code)


def stop_shim(pid: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with suppress(ChildProcessError):
        os.waitpid(pid, 0)


def start_session(argv: Sequence[str]) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a user namespace of its own (same process group, same stdio)."""
    uid, gid = _outer_id("uid_map"), _outer_id("gid_map")
    enter = _user_namespace_entry(uid, gid)
    return subprocess.Popen(list(argv), env=session_environment(), preexec_fn=enter)  # noqa: S603


class SignalForwarder:
    """Passes on SIGTERM, SIGINT and SIGHUP that reached the launcher alone (see the module's docstring).

    Installed before the session starts: a signal that comes while it is being started, to the group or
    not, is held and passed on once it runs (it was not in the group yet).
    """

    def __init__(self, shim_pid: int, consume: int) -> None:
        self.shim_pid, self.consume = shim_pid, consume
        self.session_pid: Optional[int] = None
        self.held: list[int] = []
        for signum in FORWARDED:
            signal.signal(signum, self.on_signal)

    def on_signal(self, signum: int, dummy_frame: object) -> None:
        if _pending(self.shim_pid, signum):
            with suppress(OSError):
                os.write(self.consume, bytes([signum]))  # the group got it (the session too, if it runs)
            if self.session_pid is not None:
                return
        if self.session_pid is None:
            self.held.append(signum)
            return
        with suppress(ProcessLookupError):
            os.kill(self.session_pid, signum)

    def started(self, pid: int) -> None:
        self.session_pid = pid
        for signum in self.held:
            with suppress(ProcessLookupError):
                os.kill(pid, signum)


def exit_like(status: int) -> int:
    """Exit with ``status`` (a Popen return code): a signal's death is died again, so the worker sees it."""
    if status >= 0:
        return status
    signum = -status
    with suppress(OSError, ValueError):
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        os.kill(os.getpid(), signum)
    return 128 + signum


async def _serve_shim(
    egress_socket: str, policy: Policy, layout: namespace.Layout, listeners: Listeners, consume: int
) -> None:
    book = stubdns.FakeAddressBook(namespace.FAKE_POOL_V4, namespace.FAKE_POOL_V6 if layout.ipv6 else None)
    resolver = stubdns.StubResolver(policy, book, on_refused=_log_refused_name)
    loop = asyncio.get_running_loop()
    launcher_gone = loop.create_future()

    def on_consume() -> None:
        data = os.read(consume, 64)
        if not data and not launcher_gone.done():
            launcher_gone.set_result(None)
        for signum in data:
            with suppress(OSError, ValueError):
                signal.sigtimedwait([signum], 0)

    loop.add_reader(consume, on_consume)
    the_shim = shim.Shim(egress_socket, book, layout.loopback_gateway, policy=policy)
    tasks = [
        asyncio.ensure_future(shim.serve(the_shim, listeners.explicit, listeners.transparent)),
        asyncio.ensure_future(stubdns.serve(resolver, listeners.dns_udp, listeners.dns_tcp)),
    ]
    await asyncio.wait([launcher_gone, *tasks], return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        if task.done() and task.exception():
            raise task.exception()  # type: ignore[misc]
        task.cancel()


def _log_refused_name(name: str, decision: Decision) -> None:
    log.warning("dns: refused %s (%s)", name, decision.describe())


def _pending(pid: int, signum: int) -> bool:
    """Whether ``signum`` is pending for process ``pid`` as a whole (``ShdPnd`` of /proc/<pid>/status)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("ShdPnd:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _outer_id(map_name: str) -> int:
    """The id this process's root is outside its user namespace (the worker's uid or gid)."""
    for line in Path(f"/proc/self/{map_name}").read_text().split("\n"):
        words = line.split()
        if len(words) == 3 and words[0] == "0":
            return int(words[1])
    raise OSError(f"/proc/self/{map_name} does not map root: not in a user namespace made by unshare -r")


def _user_namespace_entry(uid: int, gid: int):  # type: ignore[no-untyped-def]
    """What the session's child runs before exec: a new user namespace mapping ``uid``/``gid`` to the
    launcher's root, so the session sees its own ids and holds no capability over this network namespace."""
    libc = _libc()
    maps = (
        (Path("/proc/self/setgroups"), "deny"),
        (Path("/proc/self/uid_map"), f"{uid} 0 1"),
        (Path("/proc/self/gid_map"), f"{gid} 0 1"),
    )

    def enter() -> None:
        if libc.unshare(_CLONE_NEWUSER) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"unshare(CLONE_NEWUSER) for the session: {os.strerror(error)}")
        for path, text in maps:
            descriptor = os.open(path, os.O_WRONLY)
            try:
                os.write(descriptor, text.encode())
            finally:
                os.close(descriptor)

    return enter


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _listen(host: str, port: int) -> socket.socket:
    sock = _bind(host, port, socket.SOCK_STREAM)
    sock.listen(512)
    return sock


def _bind(host: object, port: int, kind: socket.SocketKind) -> socket.socket:
    text = str(host)
    family = socket.AF_INET6 if ":" in text else socket.AF_INET
    sock = socket.socket(family, kind)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((text, port))
    except OSError:
        sock.close()
        raise
    return sock


def _refuse(code: SandboxExit, why: str) -> int:
    log.error("%s", why)
    return int(code)
