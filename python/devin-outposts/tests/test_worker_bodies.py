"""Compressed replies are capped before they are decompressed (issue 37, S6).

A gzip bomb on the restart-recovery list was refused for its size, but the worker's peak memory reached
174 MiB: httpx inflated each 64 KiB network read whole (to about 64 MiB of zeros) before the cap could
look at it. Replies now go through one decoder (``api/inflate.py``) that hands back 64 KiB at a time and
stops when the cap is reached. The worker here is a real process against :class:`fault_fleet.FaultFleet`;
its peak resident memory is read from ``/proc/<pid>/status`` (``VmHWM``) while it still runs.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import signal
import zlib
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from fault_fleet import OUTPOST_ID, FaultFleet, keepalives
from test_worker_malformed import TOKEN, wait_serving, worker_args, worker_env

from devin_outposts.api.inflate import PIECE_BYTES, BodyDecoder, UndecodableBody

from worker_fakes import DistServer, FakeRemote, WorkerProcess

#: What each bomb inflates to: 256 MiB from about 256 KiB on the wire.
BOMB_BYTES = 256 << 20
#: The worker's peak resident memory must stay below this. An idle worker holds about 40 MiB
#: (docs/worker.md, "Performance"); the cap of a JSON reply is 8 MiB. Before the fix it reached 110-180 MiB.
PEAK_BOUND_KIB = 80 << 10


@functools.cache
def bomb(prefix: bytes, fill: bytes) -> bytes:
    """gzip of ``prefix`` and then ``fill`` repeated to :data:`BOMB_BYTES` (made once per test run)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = fill * ((1 << 20) // len(fill))
    parts = [packer.compress(prefix)]
    parts += [packer.compress(block) for dummy in range(BOMB_BYTES // len(block))]
    return b"".join([*parts, packer.flush()])


def peak_kib(pid: int) -> int:
    """The process's peak resident set (VmHWM), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def watch_bomb_once() -> Any:
    """A watch answer: the first stream is an SSE gzip bomb (one endless ``data:`` line), later ones are
    quiet keepalives."""
    served: list[int] = []
    body = bomb(b"data: ", b"x")

    def answer(handler: BaseHTTPRequestHandler) -> None:
        if served:
            keepalives(handler)
            return
        served.append(1)
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Content-Encoding", "gzip")
        handler.send_header("Connection", "close")
        handler.end_headers()
        with contextlib.suppress(OSError):  # the worker hangs up at its cap
            handler.wfile.write(body)

    return answer


@pytest.mark.parametrize("place", ["recovery list", "watch stream"])
def test_a_gzip_bomb_is_refused_within_bounded_memory(tmp_path: Path, remote: FakeRemote, place: str) -> None:
    expected = {
        "recovery list": f"Could not list sessions on outpost {OUTPOST_ID}: 200 the response is larger than",
        "watch stream": f"Could not watch sessions on outpost {OUTPOST_ID}: a watch line is larger than",
    }[place]
    with FaultFleet(TOKEN) as fleet, DistServer("abc1234", remote.script) as dist:
        if place == "recovery list":
            headers = {"Content-Encoding": "gzip"}
            fleet.faults["recovery"] = [(200, bomb(b'{"items": [', b" "), headers)]
        else:
            fleet.watch = watch_bomb_once()
        worker = WorkerProcess(
            worker_args(tmp_path, dist.url), worker_env(fleet.url), tmp_path / "worker.log"
        ).start()
        try:
            wait_serving(worker, lambda: expected in worker.log(), "the bomb's refusal")
            # The worker goes on: the recovery list is asked again, or the queue listed and watched again.
            wait_serving(worker, lambda: len(fleet.calls("GET", "/opbeta/outposts/devins")) >= 3, "a retry")
            peak = peak_kib(worker.pid)
            worker.signal(signal.SIGTERM)
            assert worker.wait(30) == 0
        finally:
            worker.stop()
    log = worker.log()
    assert "Traceback" not in log, log[-3000:]
    print(f"peak resident memory of the worker: {peak / 1024:.1f} MiB")  # the figure, with pytest -s
    assert peak < PEAK_BOUND_KIB, f"peak resident memory {peak / 1024:.0f} MiB while refusing the bomb"


# --- the decoder itself -----------------------------------------------------------------------------------


def pieces(decoder: BodyDecoder, raw: bytes, read_size: int = 1 << 16) -> list[bytes]:
    found = []
    for start in range(0, len(raw), read_size):
        found += decoder.feed(raw[start : start + read_size])
    return found + list(decoder.end())


@pytest.mark.parametrize("coding", ["gzip", "x-gzip", "deflate", "raw deflate", "identity", "gzip, gzip"])
def test_each_coding_decodes_to_the_body(coding: str) -> None:
    body = b"".join(b"%d: a queue entry, more or less\n" % n for n in range(20_000))
    packed = {
        "gzip": gzip.compress(body),
        "x-gzip": gzip.compress(body),
        "deflate": zlib.compress(body),
        "raw deflate": zlib.compress(body)[2:-4],  # what many servers that say "deflate" send
        "identity": body,
        "gzip, gzip": gzip.compress(gzip.compress(body)),
    }[coding]
    header = "deflate" if coding == "raw deflate" else coding
    for read_size in (1, 7, 1 << 16):
        decoder = BodyDecoder(header)
        out = pieces(decoder, packed, read_size) if read_size > 1 else pieces(decoder, packed[:4000], 1)
        if read_size == 1:
            assert body.startswith(b"".join(out))  # one byte at a time: only the start, for speed
            continue
        assert b"".join(out) == body
        assert decoder.read == len(packed)
        assert decoder.decoded == len(body)


def test_no_piece_is_larger_than_the_piece_size_and_taking_stops_inflating() -> None:
    raw = bomb(b"", b"\0")
    decoder = BodyDecoder("gzip")
    taken = 0
    for piece in decoder.feed(raw[: 1 << 16]):  # one network read of the bomb: about 64 MiB inflated
        assert len(piece) <= PIECE_BYTES
        taken += len(piece)
        if taken >= 1 << 20:
            break  # a cap of 1 MiB was reached: the rest of this read is never inflated
    assert decoder.decoded == taken < (1 << 20) + PIECE_BYTES


@pytest.mark.parametrize(
    ("header", "raw", "reason"),
    [
        ("br", b"\x0b\x02\x80hello\x03", "'br' is not one of gzip, deflate"),
        ("gzip, zstd", b"", "'zstd' is not one of"),
        ("gzip, gzip, gzip", b"", "3 content codings, more than 2"),
        ("gzip", b"\x1f\x8b\x08\x00 not gzip at all", "the body's gzip data is corrupt"),
    ],
)
def test_what_the_decoder_refuses(header: str, raw: bytes, reason: str) -> None:
    with pytest.raises(UndecodableBody, match=reason):
        pieces(BodyDecoder(header), raw)
