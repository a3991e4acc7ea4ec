# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""The modules' client reads a reply within a cap, and caps a gzip reply before it inflates it (issue 37, S6).

``open_url`` decompresses a reply whose ``Content-Encoding`` is gzip, whether or not the client asked for one,
and the client read the whole body at once: a gzip bomb of 256 KiB became 256 MiB in the controller's memory.
The client now reads 64 KiB at a time and stops at 8 MiB. A real HTTP server on loopback answers (no fake
``open_url``); what the client allocated is measured with tracemalloc.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import threading
import tracemalloc
import zlib
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from ansible_collections.devin.outposts.plugins.module_utils._fleet_api import MAX_BODY_BYTES, FleetAPIError, FleetClient

#: What the bomb inflates to: 256 MiB from about 256 KiB on the wire.
BOMB_BYTES = 256 << 20
#: The most the client may allocate while it refuses a reply: the 8 MiB cap, its pieces, and room.
PEAK_BOUND = 32 << 20


def gzip_of(prefix, fill, size):
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = fill * ((1 << 20) // len(fill))
    parts = [packer.compress(prefix)] + [packer.compress(block) for dummy in range(size // len(block))]
    return b"".join(parts + [packer.flush()])


REPLIES = {
    "a gzip bomb": (gzip_of(b'{"items": [', b" ", BOMB_BYTES), {"Content-Encoding": "gzip"}),
    "9 MiB of JSON": (b'{"items": [' + b" " * (9 << 20) + b'], "has_next_page": false}', {}),
}


class AnsweringServer(HTTPServer):
    """Answers every GET with :attr:`reply`: (body, headers)."""

    reply = (b"", {})


@pytest.fixture
def answering():
    """An :class:`AnsweringServer` on loopback, in a thread."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body, headers = self.server.reply
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:  # the client stopped reading at its cap
                pass

        def log_message(self, *args):
            pass

    server = AnsweringServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.parametrize("case", sorted(REPLIES))
def test_a_reply_past_the_cap_is_refused_within_bounded_memory(answering, case):
    answering.reply = REPLIES[case]
    url = "http://127.0.0.1:{0}".format(answering.server_address[1])
    tracemalloc.start()
    try:
        with pytest.raises(FleetAPIError) as info:
            FleetClient(api_url=url, token="cog_bodies_test_token", retries=0).list_outposts()
        dummy, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BOUND, "the client allocated up to {0:.0f} MiB".format(peak / 2.0 ** 20)
    expected = "Could not list outposts: 200 the API answered with a body larger than {0} bytes".format(MAX_BODY_BYTES)
    assert str(info.value) == expected


def test_a_gzip_reply_within_the_cap_is_read(answering):
    page = b'{"items": [{"metadata": {"outpost_id": "outpost_env-1"}, "spec": {"name": "gz"}}], "has_next_page": false}'
    answering.reply = (gzip_of(page, b" ", 1 << 20), {"Content-Encoding": "gzip"})
    url = "http://127.0.0.1:{0}".format(answering.server_address[1])
    outposts = FleetClient(api_url=url, token="cog_bodies_test_token", retries=0).list_outposts()
    assert [o["spec"]["name"] for o in outposts] == ["gz"]
