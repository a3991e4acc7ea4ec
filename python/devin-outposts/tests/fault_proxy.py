"""A hostile fleet API for the orchestrator's fault tests: a real HTTP proxy in front of the simulator.

:class:`FaultProxy` forwards every request to the simulator (the SSE watch too, chunk by chunk) and, for
the next ``count`` answers to a request whose path ends with ``suffix`` (``/claim``), replaces the answer
body by what a fault function makes of it: :func:`huge_deadline` (``"claim_deadline": 1e400``) or
:func:`deep_nesting`. The request itself still reaches the simulator, as it would behind a broken relay:
the claim is made, only its answer cannot be read.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional

import httpx

Fault = Callable[[bytes], bytes]
#: Request headers that describe one hop, not the request.
_HOP = {"host", "connection", "keep-alive", "transfer-encoding", "content-length", "accept-encoding"}


def huge_deadline(body: bytes) -> bytes:
    """The claim answer with a deadline no integer holds (Python reads ``1e400`` as ``inf``)."""
    text, count = re.subn(rb'"claim_deadline":\s*[0-9.eE+-]+', b'"claim_deadline": 1e400', body)
    assert count == 1, f"no claim_deadline in {body[:300]!r}"
    return text


def deep_nesting(body: bytes, depth: int = 100_000) -> bytes:
    """The claim answer with a field nested deeper than any JSON decoder's recursion limit."""
    data = json.loads(body)
    data["spec"]["network_policy"] = None
    text = json.dumps(data).encode()
    return text.replace(b'"network_policy": null', b'"network_policy": ' + b"[" * depth + b"]" * depth)


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self._faults: list[tuple[str, Fault]] = []
        self._lock = threading.Lock()
        #: (path, fault name) of every answer replaced.
        self.injected: list[tuple[str, str]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def inject(self, suffix: str, fault: Fault, count: int = 1) -> None:
        """Replace the next ``count`` answers to requests whose path ends with ``suffix``."""
        with self._lock:
            self._faults.extend([(suffix, fault)] * count)

    def _take(self, path: str) -> Optional[Fault]:
        with self._lock:
            for index, (suffix, fault) in enumerate(self._faults):
                if path.endswith(suffix):
                    del self._faults[index]
                    self.injected.append((path, fault.__name__))
                    return fault
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                path = self.path.split("?", 1)[0]
                with httpx.Client(timeout=httpx.Timeout(30.0, read=None)) as client:
                    request = client.build_request(
                        self.command, proxy.upstream + self.path, headers=headers, content=body
                    )
                    response = client.send(request, stream=True)
                    try:
                        fault = proxy._take(path) if response.status_code == 200 else None
                        if fault is not None:
                            self._answer(response, fault(response.read()))
                        else:
                            self._stream(response)
                    finally:
                        response.close()

            def _answer(self, response: httpx.Response, body: bytes) -> None:
                self.send_response(response.status_code)
                self.send_header("Content-Type", response.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True

            def _stream(self, response: httpx.Response) -> None:
                self.send_response(response.status_code)
                for key, value in response.headers.items():
                    if key.lower() not in _HOP | {"content-encoding", "date", "server"}:
                        self.send_header(key, value)
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    for chunk in response.iter_raw():
                        if chunk:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except (ConnectionError, httpx.HTTPError):
                    pass
                self.close_connection = True

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

            def log_message(self, format: str, *args: Any) -> None:
                return None

        return Handler

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def running(upstream: str) -> Iterator[FaultProxy]:
    with FaultProxy(upstream) as proxy:
        yield proxy
