"""The doorway: how a session's shim reaches its own egress proxy, and nothing else does
(docs/network-policy.md, "Sessions apart from each other").

The egress proxy has no name on the file system. For each launch the worker makes a pair of connected Unix
sockets (``SOCK_SEQPACKET``): the proxy keeps one end, the sandbox launcher inherits the other, and after it
the shim. For each connection it wants to make, the shim makes a pair of stream sockets, sends one of them
through the doorway (``SCM_RIGHTS``) and talks HTTP proxy on the other; the proxy serves the socket it
received exactly as it would serve an accepted client.

So there is no socket another session could connect to, rename or listen in place of, on this worker or on
another one: a doorway is reached only through its descriptor, which only the launcher and the shim hold
(both undumpable; the session runs in a process namespace where they do not exist, and the launcher's
descriptors are not inherited by the session). Each proxy serves exactly one launch, so whatever comes
through a doorway is that session's traffic, and is logged and counted as such.

Standard library only, Linux (``SOCK_SEQPACKET`` and ``SCM_RIGHTS`` exist elsewhere, but nothing else runs a
sandbox): import it only there.
"""

from __future__ import annotations

import array
import asyncio
import socket
import sys
from contextlib import suppress

assert sys.platform == "linux"  # imported only where sessions are confined (mypy skips the rest elsewhere)

#: One byte per message: the descriptor is the message.
_MESSAGE = b"c"
#: Descriptors one receive takes at most (the shim sends one per message; a hostile peer sending more gets
#: the extras closed).
_MAX_FDS = 8


def pair() -> tuple[socket.socket, socket.socket]:
    """A new doorway: ``(proxy_end, launcher_end)``. Neither is inheritable; the caller passes the launcher's
    on explicitly (``pass_fds``) and closes its own copy once the launcher runs."""
    proxy_end, launcher_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proxy_end.setblocking(False)
    return proxy_end, launcher_end


def receive(doorway: socket.socket) -> tuple[list[socket.socket], bool]:
    """The stream sockets of the next message in ``doorway`` (one, normally), and whether the other end has
    closed (every holder of the launcher's end has ended). A non-blocking ``doorway`` raises
    ``BlockingIOError`` when nothing is waiting. Anything but Unix stream sockets is closed and dropped."""
    data, ancillary, dummy_flags, dummy_address = doorway.recvmsg(
        len(_MESSAGE), socket.CMSG_SPACE(_MAX_FDS * array.array("i").itemsize)
    )
    descriptors = _descriptors(ancillary)
    if not data and not descriptors:
        return [], True
    received = [sock for sock in map(_stream_socket, descriptors) if sock is not None]
    return received, False


def _descriptors(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    found: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds = array.array("i")
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
            found.extend(fds)
    return found


def _stream_socket(fd: int) -> socket.socket | None:
    """``fd`` as a non-blocking socket when it is a Unix stream socket; else it is closed and None."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        with suppress(OSError):
            socket.close(fd)
        return None
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        sock.close()
        return None
    sock.setblocking(False)
    return sock


class Opener:
    """The shim's side: :meth:`open` gives a new connection to the proxy behind ``doorway``."""

    def __init__(self, doorway: socket.socket) -> None:
        doorway.setblocking(False)
        self.doorway = doorway

    async def open(self) -> socket.socket:
        """A connected stream socket whose other end the proxy now serves; ``OSError`` when the doorway is
        closed (the worker ended the session's proxy)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await self._send(theirs.fileno())
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        return ours

    async def _send(self, fd: int) -> None:
        message = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())]
        while True:
            try:
                self.doorway.sendmsg([_MESSAGE], message)
                return
            except BlockingIOError:
                await ready(self.doorway, write=True)


async def ready(sock: socket.socket, *, write: bool = False) -> None:
    """Wait until ``sock`` can be read (or, with ``write``, written) without blocking."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not waiter.done():
            waiter.set_result(None)

    if write:
        loop.add_writer(sock.fileno(), wake)
    else:
        loop.add_reader(sock.fileno(), wake)
    try:
        await waiter
    finally:
        if write:
            loop.remove_writer(sock.fileno())
        else:
            loop.remove_reader(sock.fileno())


def connect_blocking(doorway: socket.socket, timeout: float = 10.0) -> socket.socket:
    """:meth:`Opener.open` for a blocking caller (tests and benchmarks): a connected stream socket."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        doorway.settimeout(timeout)
        doorway.sendmsg(
            [_MESSAGE], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [theirs.fileno()]))]
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return ours
