"""The launcher: the first process of a confined session (:mod:`.sandbox` has its command line;
docs/network-policy.md, "How a session is confined").

In order, and the session never starts when a step fails (exit code :class:`~.sandbox.SandboxExit`, one
line on stderr):

1. enter fresh user, mount, IPC and network namespaces (:mod:`.entry`), as root of the new user namespace;
2. set the network namespace up (:func:`.namespace.set_up`);
3. build what the session sees of the host (:mod:`.view`): ``/run``, the worker's own files and the
   other sessions' directories hidden, everything read-only but the session's own directories, its own
   ``/tmp``; its ``/etc/hosts`` (:mod:`.hostsfile`) and, for a session with ids of its own, its
   ``/etc/passwd`` and ``/etc/group`` entries;
4. bind the shim's and the stub DNS's sockets, and run the preflight (:func:`.namespace.preflight`);
5. fork the **shim process** (shim and stub DNS on one event loop), which drops its capabilities and
   dies with the launcher (``PR_SET_PDEATHSIG``);
6. fork the session's **init** in a process namespace of its own (:mod:`.init`), which starts the
   session in a **user namespace of its own**: the network namespace belongs to the launcher's, and
   capabilities in a child user namespace give no power over it (``nft flush ruleset`` fails with EPERM);
7. wait for init, then stop the shim and exit as the session did (the same code, or the same signal).

Signals: the worker stops a session by signalling its process group, which holds the launcher, the shim,
init and the session. The session gets those signals directly; the shim ignores them; init keeps them
blocked; the launcher passes on, through init, only a SIGTERM, SIGINT or SIGHUP that was sent to it alone
(``kill <pid>``, systemd's ``KillMode=mixed``), so the session gets each signal once. It tells the two
apart by init's pending signals: a signal to the group is queued to every member (newest first, so init
before the launcher) before the launcher's handler runs.

The launcher, the shim and init are not dumpable, and the session is in other user and process
namespaces: it can neither trace them nor read their memory, nor even name them.
"""

from __future__ import annotations

import asyncio
import ctypes
import grp
import logging
import os
import pwd
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from devin_outposts import privacy

from . import doorway, entry, hostsfile, init, namespace, shim, stubdns, view
from .launcher_exits import SandboxExit
from .policy import Decision, Policy
from .spec import SandboxSpec

assert sys.platform == "linux"  # namespaces, prctl, signal masks (mypy skips the rest elsewhere)

log = logging.getLogger("devin_outposts.sandbox")

PROXY_URL = f"http://127.0.0.1:{namespace.EXPLICIT_PORT}"
NO_PROXY = "localhost,127.0.0.1,::1"
FORWARDED = init.FORWARDED
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_NO_NEW_PRIVS = 38
_CAPABILITY_VERSION_3 = 0x20080522


def session_environment(spec: SandboxSpec, environment: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The launcher's environment with the proxy variables set (upper and lower case: tools read either),
    the session's own ``HOME``, and its user's name when it has ids of its own."""
    env = dict(os.environ if environment is None else environment)
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = PROXY_URL
    env["NO_PROXY"] = env["no_proxy"] = NO_PROXY
    env["HOME"] = spec.home
    if spec.session_uid is not None:
        env["USER"] = env["LOGNAME"] = _user_name(spec)
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


def run(spec: SandboxSpec, doorway_fd: int, argv: Sequence[str]) -> int:
    """Set up, check, start the shim and the session; the session's exit status (or a SandboxExit)."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="devin-outposts sandbox: %(message)s")
    policy = spec.policy()
    for ignored in policy.ignored:
        log.warning("policy rule ignored: %s", ignored)
    os.set_inheritable(doorway_fd, False)  # never the session's
    session_ids = None
    if spec.session_uid is not None and spec.session_gid is not None:
        session_ids = entry.Ids(spec.session_uid, spec.session_gid)
    try:
        own = entry.enter(session_ids, network=True)
    except entry.NamespaceError as exc:
        return _refuse(SandboxExit.NAMESPACES, f"cannot create the session's namespaces: {exc}")
    try:
        layout = namespace.set_up(policy.gateway)
    except namespace.MissingToolError as exc:
        return _refuse(SandboxExit.MISSING_TOOL, str(exc))
    except namespace.SetupError as exc:
        return _refuse(SandboxExit.SETUP_FAILED, f"cannot set up the session's network namespace: {exc}")
    inside = entry.SESSION_INSIDE_ID if session_ids else 0
    try:
        view.apply(_view(spec), inside, {inside})
    except (view.ViewError, OSError) as exc:
        return _refuse(SandboxExit.SETUP_FAILED, f"cannot build the session's view of the host: {exc}")
    try:
        listeners = bind_listeners(layout)
    except OSError as exc:
        return _refuse(SandboxExit.SHIM_FAILED, f"the shim cannot listen: {exc}")
    try:
        namespace.preflight(layout, listeners.transparent)
    except (namespace.NotIsolatedError, namespace.SetupError) as exc:
        return _refuse(SandboxExit.NOT_ISOLATED, f"preflight: the session would not be confined: {exc}")
    privacy.make_undumpable()
    shim_pid = start_shim(doorway_fd, policy, layout, listeners, inside)
    listeners.close()
    os.close(doorway_fd)
    try:
        return _run_session(spec, argv, own, session_ids, shim_pid)
    finally:
        stop_shim(shim_pid)


def _view(spec: SandboxSpec) -> view.View:
    files = {"/etc/hosts": hostsfile.session_hosts()}
    if spec.session_uid is not None:
        files.update(_account_files(spec))
    return view.View(
        hide=spec.hide,
        writable=(spec.workdir, spec.state_dir),
        readonly=spec.readonly,
        state_dir=spec.state_dir,
        files={target: text for target, text in files.items() if text is not None},
    )


def _run_session(
    spec: SandboxSpec, argv: Sequence[str], own: entry.Ids, session_ids: Optional[entry.Ids], shim_pid: int
) -> int:
    control_read, control_write = os.pipe()
    status_read, status_write = os.pipe()
    forwarder = SignalForwarder(control_write)
    env = session_environment(spec)
    enter_session = _session_entry(own, session_ids)
    try:
        entry.unshare(entry.CLONE_NEWPID, "pid")
    except entry.NamespaceError as exc:
        return _refuse(SandboxExit.NAMESPACES, f"cannot create the session's process namespace: {exc}")
    init_pid = os.fork()
    if init_pid == 0:
        os.close(control_write)
        os.close(status_read)
        init.run(
            argv,
            env=env,
            cwd=spec.workdir,
            enter_session=enter_session,
            control=control_read,
            status=status_write,
        )
    os.close(control_read)
    os.close(status_write)
    forwarder.started(init_pid)
    dummy_pid, dummy_status = os.waitpid(init_pid, 0)
    for signum in FORWARDED:
        signal.signal(signum, signal.SIG_IGN)
    with os.fdopen(status_read, "rb") as reader:
        reported = reader.read().decode("utf-8", "replace")
    os.close(control_write)
    if reported.startswith("E"):
        return _refuse(SandboxExit.SESSION_NOT_STARTED, reported[1:])
    try:
        return exit_like(int(reported))
    except ValueError:
        return _refuse(SandboxExit.SESSION_NOT_STARTED, "the session's init ended without its status")


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
    doorway_fd: int, policy: Policy, layout: namespace.Layout, listeners: Listeners, inside: int
) -> int:
    """Fork the shim process; its pid. It holds no capability (its sockets are bound already) and, for a
    session with ids of its own, runs as the session's uid: a flaw in the code that reads the session's
    bytes gains nothing over the namespace or the host's files."""
    launcher = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        for signum in FORWARDED:
            signal.signal(signum, signal.SIG_IGN)  # the session shuts down with the proxy still there
        _libc().prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != launcher:
            os._exit(0)  # the launcher died before the line above
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        _drop_privileges(inside)
        sock = socket.socket(fileno=doorway_fd)
        asyncio.run(_serve_shim(doorway.Opener(sock), policy, layout, listeners))
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


class SignalForwarder:
    """Passes on, through init, SIGTERM, SIGINT and SIGHUP that reached the launcher alone (see the module's
    docstring). Installed before init starts: one that comes meanwhile is passed on once it runs (the
    session was not in the group yet)."""

    def __init__(self, control: int) -> None:
        self.control = control
        self.init_pid: Optional[int] = None
        self.held: list[int] = []
        for signum in FORWARDED:
            signal.signal(signum, self.on_signal)

    def on_signal(self, signum: int, dummy_frame: object) -> None:
        if self.init_pid is None:
            self.held.append(signum)
        elif _pending(self.init_pid, signum):
            self._tell(init.CONSUME, signum)  # the group got it, the session too
        else:
            self._tell(init.FORWARD, signum)

    def started(self, pid: int) -> None:
        self.init_pid = pid
        for signum in self.held:
            self._tell(init.FORWARD, signum)
        self.held.clear()

    def _tell(self, what: bytes, signum: int) -> None:
        with suppress(OSError):
            os.write(self.control, what + bytes([signum]))


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
    opener: doorway.Opener, policy: Policy, layout: namespace.Layout, listeners: Listeners
) -> None:
    book = stubdns.FakeAddressBook(namespace.FAKE_POOL_V4, namespace.FAKE_POOL_V6 if layout.ipv6 else None)
    resolver = stubdns.StubResolver(policy, book, on_refused=_log_refused_name)
    the_shim = shim.Shim(opener, book, layout.loopback_gateway, policy=policy)
    tasks = [
        asyncio.ensure_future(shim.serve(the_shim, listeners.explicit, listeners.transparent)),
        asyncio.ensure_future(stubdns.serve(resolver, listeners.dns_udp, listeners.dns_tcp)),
    ]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        if task.done() and task.exception():
            raise task.exception()  # type: ignore[misc]
        task.cancel()


def _session_entry(own: entry.Ids, session_ids: Optional[entry.Ids]):  # type: ignore[no-untyped-def]
    """What the session's child runs before exec: its ids (a session with ids of its own leaves root of the
    launcher's namespace for id 1, which is its uid outside), then a user namespace of its own, in which it
    sees its ids as the host's."""

    def enter() -> None:
        if session_ids is not None:
            os.setgroups([])
            os.setresgid(entry.SESSION_INSIDE_ID, entry.SESSION_INSIDE_ID, entry.SESSION_INSIDE_ID)
            os.setresuid(entry.SESSION_INSIDE_ID, entry.SESSION_INSIDE_ID, entry.SESSION_INSIDE_ID)
        # Undumpable (the launcher's flag, or changed ids) gives this process's /proc files to the host's
        # root: it could not write its own maps below. It is about to exec the session, dumpable anyway.
        _libc().prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
        if session_ids is not None:
            outside, shown = entry.SESSION_INSIDE_ID, session_ids
        else:
            outside, shown = 0, own
        entry.unshare(entry.CLONE_NEWUSER, "user, for the session")
        entry.map_self(outside, outside, shown)

    return enter


def _drop_privileges(inside: int) -> None:
    """No capability left, none to regain (``no_new_privs``); the session's uid where it has its own."""
    if inside:
        os.setgroups([])
        os.setresgid(inside, inside, inside)
        os.setresuid(inside, inside, inside)  # from root: every capability goes with it
    libc = _libc()
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: twice (64 capabilities), all zero
    if libc.capset(header, data) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"capset: {os.strerror(error)}")


def _account_files(spec: SandboxSpec) -> dict[str, Optional[str]]:
    """``/etc/passwd`` and ``/etc/group`` with the session's uid and gid named, where the host has no name
    for them (None: the host's file is kept)."""
    assert spec.session_uid is not None
    assert spec.session_gid is not None
    name = _user_name(spec)
    files: dict[str, Optional[str]] = {"/etc/passwd": None, "/etc/group": None}
    try:
        pwd.getpwuid(spec.session_uid)
    except KeyError:
        text = _read("/etc/passwd")
        line = f"{name}:x:{spec.session_uid}:{spec.session_gid}:Devin session:{spec.home}:/bin/sh\n"
        files["/etc/passwd"] = text + ("" if text.endswith("\n") or not text else "\n") + line
    try:
        grp.getgrgid(spec.session_gid)
    except KeyError:
        text = _read("/etc/group")
        files["/etc/group"] = (
            text + ("" if text.endswith("\n") or not text else "\n") + f"{name}:x:{spec.session_gid}:\n"
        )
    return files


def _user_name(spec: SandboxSpec) -> str:
    try:
        return (
            pwd.getpwuid(spec.session_uid or 0).pw_name if spec.session_uid is not None else spec.session_user
        )
    except KeyError:
        return spec.session_user


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


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
