"""Moving a tunnel's bytes (core/netpolicy/relay.py): whole, in order, with the end passed on as a
half-close, by copying and by splice(2), over real socket pairs."""

from __future__ import annotations

import asyncio
import os
import random
import socket

import pytest

from devin_outposts.core.netpolicy import relay

#: The words scripts/lib.sh's ``in_ci`` accepts (tests/prerequisites.py): a test that cannot run fails in CI.
IN_CI = os.environ.get("CI", "") in ("true", "TRUE", "True", "1", "yes")


@pytest.mark.parametrize("splice", [False, True], ids=["copy", "splice"])
def test_pipe_moves_everything_then_half_closes(splice: bool) -> None:
    if splice and not relay.CAN_SPLICE:
        reason = "splice(2) needs Linux and Python 3.10 or later (os.splice)"
        if IN_CI:
            pytest.fail(f"{reason} (CI=true: a test that cannot run fails in CI)", pytrace=False)
        pytest.skip(reason)
    payload = random.Random(3).randbytes(relay.SPLICE_AFTER * 3 + 12345)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        source_far, source = socket.socketpair()
        sink, sink_far = socket.socketpair()
        for sock in (source_far, source, sink, sink_far):
            sock.setblocking(False)

        async def feed() -> None:
            await loop.sock_sendall(source_far, payload)
            source_far.shutdown(socket.SHUT_WR)

        async def drain() -> bytes:
            received = bytearray()
            while True:
                chunk = await loop.sock_recv(sink_far, 1 << 16)
                if not chunk:
                    return bytes(received)
                received += chunk

        feeder = asyncio.ensure_future(feed())
        moved, received = await asyncio.gather(relay.pipe(source, sink, splice=splice), drain())
        await feeder
        assert moved == len(payload)
        assert received == payload  # ...and drain() only returned because the sink's far end saw the end
        for sock in (source_far, source, sink, sink_far):
            sock.close()

    asyncio.run(scenario())


def test_pipe_to_a_closed_sink_raises() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        source_far, source = socket.socketpair()
        sink, sink_far = socket.socketpair()
        for sock in (source_far, source, sink):
            sock.setblocking(False)
        sink_far.close()
        await loop.sock_sendall(source_far, b"x" * 1000)
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            await relay.pipe(source, sink)
        for sock in (source_far, source, sink):
            sock.close()

    asyncio.run(scenario())
