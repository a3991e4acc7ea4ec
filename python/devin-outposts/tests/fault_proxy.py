"""An independent, hostile fleet API for the orchestrator's tests: a real HTTP proxy before the simulator.

:class:`FaultProxy` forwards every request to the simulator (the SSE watch and the gateway's long polls
too, line by line) with the ``Host`` the client used, so claim answers name the proxy as the gateway and
the machines' remotes talk through it as well. On top of that:

* :meth:`FaultProxy.inject`: the next ``count`` answers to a request whose path ends with ``suffix``
  (``/claim``) are replaced by what a fault function makes of them: :func:`huge_deadline`
  (``"claim_deadline": 1e400``) or :func:`deep_nesting`. The request itself still reaches the simulator,
  as behind a broken relay: the claim is made, only its answer cannot be read;
* :meth:`FaultProxy.alias`: a session the simulator knows as ``real`` is shown to clients as ``shown``,
  in every answer and request path, so clients meet ids the simulator itself would refuse (``-x``,
  ``--help``).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional
from urllib.parse import quote, unquote

import httpx

Fault = Callable[[bytes], bytes]
#: Request headers that describe one hop, not the request.
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "accept-encoding"}


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
        #: real id -> the id clients see.
        self._aliases: dict[str, str] = {}
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

    def alias(self, real: str, shown: str) -> None:
        """Show the simulator's session ``real`` to clients as ``shown``."""
        with self._lock:
            self._aliases[real] = shown

    def _path(self, path: str) -> str:
        """A client's request path with shown ids turned back into the simulator's."""
        with self._lock:
            back = {shown: real for real, shown in self._aliases.items()}
        head, sep, query = path.partition("?")
        parts = [quote(back[unquote(p)], safe="") if unquote(p) in back else p for p in head.split("/")]
        return "/".join(parts) + sep + query

    def _body(self, data: bytes) -> bytes:
        """An answer (or one line of a stream) with the simulator's ids replaced by the shown ones."""
        with self._lock:
            aliases = dict(self._aliases)
        for real, shown in aliases.items():
            data = data.replace(json.dumps(real).encode(), json.dumps(shown).encode())
        return data

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
                target = proxy._path(self.path)
                with httpx.Client(timeout=httpx.Timeout(30.0, read=None)) as client:
                    request = client.build_request(
                        self.command, proxy.upstream + target, headers=headers, content=body
                    )
                    response = client.send(request, stream=True)
                    try:
                        path = self.path.split("?", 1)[0]
                        fault = proxy._take(path) if response.status_code == 200 else None
                        if fault is not None:
                            self._answer(response, fault(proxy._body(response.read())))
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
                    pending = b""
                    for chunk in response.iter_bytes():
                        pending += chunk
                        lines, sep, pending = pending.rpartition(b"\n")
                        if sep:
                            self._chunk(proxy._body(lines + sep))
                    self._chunk(proxy._body(pending))
                    self.wfile.write(b"0\r\n\r\n")
                except (ConnectionError, httpx.HTTPError):
                    pass
                self.close_connection = True

            def _chunk(self, data: bytes) -> None:
                if data:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()

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
