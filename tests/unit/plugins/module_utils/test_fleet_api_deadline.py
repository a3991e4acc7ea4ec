# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""The modules' client against a server that drips its answer (issue 37, S5): ``timeout`` bounds each
request as a whole, not only each socket operation, so a byte every few hundredths of a second does not hold
a module for hours. No fake open_url: the real client talks to a loopback server."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import socket
import threading
import time

import pytest

from ansible_collections.devin.outposts.plugins.module_utils._fleet_api import FleetAPIError, FleetClient

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"


class DrippingServer:
    """Answers every request with ``answer`` a byte at a time, one every ``every`` seconds, until the client
    goes away or the test ends; counts the requests."""

    def __init__(self, answer, every=0.05):
        self.answer = answer
        self.every = every
        self.requests = []
        self.sent = 0
        self.stop = threading.Event()
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(8)
        self.server.settimeout(0.2)
        self.threads = [threading.Thread(target=self.serve, daemon=True)]

    @property
    def url(self):
        return "http://127.0.0.1:{0}".format(self.server.getsockname()[1])

    def serve(self):
        while not self.stop.is_set():
            try:
                conn, dummy = self.server.accept()
            except socket.timeout:
                continue
            thread = threading.Thread(target=self.drip, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def drip(self, conn):
        with conn:
            conn.settimeout(5)
            try:
                self.requests.append(conn.recv(65536).split(b"\r\n", 1)[0].decode())
                for byte in self.answer:
                    if self.stop.wait(self.every):
                        return
                    conn.sendall(bytes([byte]))
                    self.sent += 1
            except OSError:  # the client went away
                pass

    def __enter__(self):
        self.threads[0].start()
        return self

    def __exit__(self, *exc_info):
        self.stop.set()
        for thread in self.threads:
            thread.join(5)
        self.server.close()


def client(url, **kwargs):
    kwargs.setdefault("sleep", lambda seconds: None)
    return FleetClient(api_url=url, token="cog_deadline_test_token", **kwargs)


@pytest.mark.parametrize("answer", [HEAD + b" " * 100000, HEAD[:30] + b" " * 100000], ids=["body", "head"])
def test_an_answer_that_drips_ends_at_the_total_deadline(answer):
    with DrippingServer(answer) as server:
        started = time.monotonic()
        with pytest.raises(FleetAPIError) as info:
            client(server.url, timeout=0.5, retries=1).list_outposts()
        took = time.monotonic() - started
        assert str(info.value) == "Could not list outposts: no complete answer from {0} within 0.5s".format(
            server.url)
        assert server.requests == ["GET /opbeta/outposts/outposts?first=100 HTTP/1.1"] * 2  # retried once
        assert server.sent >= 4  # each socket read got a byte in time: only the total deadline could end it
    assert took < 30  # two deadlines of 0.5 s, where the whole answer would take 83 minutes


def test_a_create_that_drips_is_not_sent_again():
    with DrippingServer(HEAD + b" " * 100000) as server:
        with pytest.raises(FleetAPIError, match="no complete answer from .* within 0.5s"):
            client(server.url, timeout=0.5).create_outpost("rhel", platform="linux")
        assert server.requests == ["POST /opbeta/outposts/outposts HTTP/1.1"]


def test_an_answer_within_the_deadline_is_read_whole():
    body = b'{"items": [], "has_next_page": false}'
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
    with DrippingServer(answer, every=0.001) as server:
        assert client(server.url, timeout=10).list_outposts() == []
