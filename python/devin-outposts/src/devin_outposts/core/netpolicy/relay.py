"""Moving a tunnel's bytes from one socket to another on the event loop: with backpressure, and with the
end of one direction passed on as a half-close.

A direction starts by copying (``loop.sock_recv``, then ``loop.sock_sendall``, which waits while the other
side is not reading: that is the backpressure; a buffer exists only while bytes are in flight, so an idle
tunnel holds none). Once it has carried
:data:`SPLICE_AFTER` bytes, on Linux with ``os.splice`` (Python 3.10 and later), it moves the rest with
splice(2) through a pipe of its own: the bytes then go from one socket to the other inside the kernel and
never through this process, which is what keeps a bulk transfer through the egress proxy as fast as a
direct connection (benchmarks/egress_proxy.py). Short exchanges never pay for the pipe (two descriptors,
created and closed), and an idle tunnel holds none.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from typing import Callable

#: Bytes a direction copies before it switches to splice(2).
SPLICE_AFTER = 1 << 20
#: The most one copy reads; how much one splice(2) asks for (the pipe is made this big if the kernel lets it).
COPY_BYTES = 64 * 1024
SPLICE_BYTES = 1 << 20
#: Whether this Python on this system can splice (Linux, Python 3.10 and later).
CAN_SPLICE = sys.platform == "linux" and hasattr(os, "splice")


async def pipe(source: socket.socket, sink: socket.socket, *, splice: bool = CAN_SPLICE) -> int:
    """Move bytes from ``source`` to ``sink`` until ``source`` ends, then shut ``sink``'s sending side
    (half-close); the number of bytes moved. Both sockets are non-blocking. An :class:`OSError` means that
    one of them broke (reset, closed)."""
    loop = asyncio.get_running_loop()
    moved = 0
    while True:
        if splice and moved >= SPLICE_AFTER:
            moved += await _splice_all(source, sink)
            break
        data = await loop.sock_recv(source, COPY_BYTES)
        if not data:
            break
        await loop.sock_sendall(sink, data)
        moved += len(data)
    sink.shutdown(socket.SHUT_WR)
    return moved


async def _wait(add: Callable[..., None], remove: Callable[[int], object], sock: socket.socket) -> None:
    """Until ``sock`` is readable (``add`` = ``loop.add_reader``) or writable (``loop.add_writer``)."""
    ready = asyncio.get_running_loop().create_future()
    add(sock.fileno(), ready.set_result, None)
    try:
        await ready
    finally:
        remove(sock.fileno())


if sys.platform == "linux":
    import fcntl

    _FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
    #: fcntl.F_SETPIPE_SZ (Python 3.10 names it; its value on every Linux architecture).
    _SET_PIPE_SIZE = getattr(fcntl, "F_SETPIPE_SZ", 1031)

    async def _splice_all(source: socket.socket, sink: socket.socket) -> int:
        loop = asyncio.get_running_loop()
        read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        moved = 0
        try:
            with contextlib.suppress(OSError):  # a user over its pipe quota keeps the default 64 KiB
                fcntl.fcntl(write_end, _SET_PIPE_SIZE, SPLICE_BYTES)
            while True:
                try:
                    count = os.splice(source.fileno(), write_end, SPLICE_BYTES, flags=_FLAGS)
                except BlockingIOError:
                    await _wait(loop.add_reader, loop.remove_reader, source)
                    continue
                if count == 0:
                    return moved
                moved += count
                while count:  # empty the pipe into the sink before reading more: the sink sets the pace
                    try:
                        count -= os.splice(read_end, sink.fileno(), count, flags=_FLAGS)
                    except BlockingIOError:
                        await _wait(loop.add_writer, loop.remove_writer, sink)
        finally:
            os.close(read_end)
            os.close(write_end)

else:

    async def _splice_all(source: socket.socket, sink: socket.socket) -> int:
        raise OSError("splice(2) is Linux only")
