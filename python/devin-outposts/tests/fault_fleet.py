"""A fleet API on loopback that answers what a test scripts: malformed bodies, hostile watch streams.

:class:`FaultFleet` serves one outpost (``rhel``, linux) and its sessions from a thread, over real HTTP,
so that a real ``devin-outposts worker start`` process can be pointed at it. It behaves like the contract
(claims, renewals, releases, ``get``) unless a test queued a fault for a place:

* ``faults["recovery"]``: the next replies to the restart-recovery list (``phase=claimed&acceptor_id=...``);
* ``faults["list"]``: the next replies to the feed's full list;
* ``faults["claim"]``: the next replies to a claim (a renewal counts);
* ``faults["release"]``: the next replies to a release (the claim is then left as it was);
* ``faults["get"]``: the next replies to a read of one session;
* ``watch``: how a watch request is answered (:meth:`FaultFleet.flood` streams a hostile body).

A fault is ``(status, body bytes)``, or ``(status, body bytes, headers)`` to add headers to the answer (a
``Content-Encoding``), or a :class:`Drip`: a ``200`` that promises a long body and sends it a byte at a time,
slowly (issue 37, S5); :attr:`FaultFleet.drips` records each. Every request is recorded in ``requests``
(method, path, query and the bearer token seen), so tests assert on what reached the server.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional, Union
from urllib.parse import parse_qs, unquote, urlsplit

OUTPOST_ID = "outpost_env-fault"


@dataclass(frozen=True)
class Drip:
    """An answer that never ends in time: ``200`` with ``Content-Length: length``, then one byte every
    ``every`` seconds, until the client goes away or the server stops."""

    every: float = 10.0
    length: int = 100_000
    #: Where it was answered (set by the server).
    place: str = ""


Fault = Union[tuple[int, bytes], tuple[int, bytes, dict[str, str]], Drip]


class FaultFleet:
    """See the module docstring. Use as a context manager; :attr:`url` is the API base URL."""

    def __init__(self, token: str, claim_ttl: float = 30.0) -> None:
        self.token = token
        self.claim_ttl = claim_ttl
        self.lock = threading.Lock()
        #: session id -> {"holder": acceptor or None, "status": session_status, "created": n}
        self.sessions: dict[str, dict[str, Any]] = {}
        places = ("recovery", "list", "claim", "release", "get")
        self.faults: dict[str, list[Fault]] = {place: [] for place in places}
        #: Faults served so far, by place.
        self.served: dict[str, int] = dict.fromkeys(places, 0)
        #: Per :class:`Drip` answered: its place, the bytes sent so far and whether the client went away.
        self.drips: list[dict[str, Any]] = []
        self._stopping = threading.Event()
        self.requests: list[dict[str, Any]] = []
        #: Called with the handler for each watch request (None: keepalives until the client goes).
        self.watch: Optional[Callable[[BaseHTTPRequestHandler], None]] = None
        #: Per watch stream that :meth:`flood` answered: bytes written and whether the client went away.
        self.floods: list[dict[str, Any]] = []
        self.tokens = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    # --- the test's side ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def enqueue(self, session_id: str) -> None:
        with self.lock:
            created = len(self.sessions) + 1
            self.sessions[session_id] = {"holder": None, "status": "pending", "created": created}

    def set_status(self, session_id: str, status: str) -> None:
        with self.lock:
            self.sessions[session_id]["status"] = status

    def calls(self, method: str, path_end: str) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.requests if r["method"] == method and r["path"].endswith(path_end)]

    def flood(self, line: bytes, limit: int) -> Callable[[BaseHTTPRequestHandler], None]:
        """A watch answer that repeats ``line`` until ``limit`` bytes are written or the client leaves."""

        def answer(handler: BaseHTTPRequestHandler) -> None:
            record: dict[str, Any] = {"sent": 0, "client_left": False, "done": False}
            self.floods.append(record)
            handler.send_response(200)
            handler.send_header("Content-Type", "text/event-stream")
            handler.send_header("Connection", "close")
            handler.end_headers()
            block = line * max(1, (64 << 10) // max(1, len(line)))
            try:
                while record["sent"] < limit:
                    handler.wfile.write(block)
                    record["sent"] += len(block)
                handler.wfile.flush()
            except OSError:
                record["client_left"] = True
            record["done"] = True

        return answer

    def dripping(self, place: str) -> list[dict[str, Any]]:
        """The drips answered at ``place`` that have sent a byte at least (the client is reading them)."""
        with self.lock:
            return [dict(d) for d in self.drips if d["place"] == place and d["sent"] > 0]

    def _drip(self, handler: BaseHTTPRequestHandler, drip: Drip) -> None:
        record: dict[str, Any] = {"place": drip.place, "sent": 0, "client_left": False}
        with self.lock:
            self.drips.append(record)
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(drip.length))
        handler.end_headers()
        try:
            while record["sent"] < drip.length and not self._stopping.is_set():
                handler.wfile.write(b" ")
                handler.wfile.flush()
                with self.lock:
                    record["sent"] += 1
                self._stopping.wait(drip.every)
        except OSError:
            with self.lock:
                record["client_left"] = True

    # --- the wire ---------------------------------------------------------------------------------------

    def entry(self, sid: str, **status: Any) -> dict[str, Any]:
        state = self.sessions[sid]
        holder = state["holder"]
        return {
            "metadata": {"session_id": sid, "outpost_id": OUTPOST_ID, "created_at": state["created"]},
            "spec": {"kind": "new", "platform": "linux"},
            "status": {
                "phase": "claimed" if holder else "pending",
                "acceptor_id": holder,
                "claim_deadline": int(time.time() + self.claim_ttl) if holder else None,
                "session_status": state["status"],
                **status,
            },
        }

    def _fault(self, place: str) -> Optional[Fault]:
        with self.lock:
            if not self.faults[place]:
                return None
            self.served[place] += 1
            fault = self.faults[place].pop(0)
        return replace(fault, place=place) if isinstance(fault, Drip) else fault

    def _answer(self, method: str, path: str, query: dict[str, str], body: bytes) -> Fault:
        if path == "/opbeta/outposts/outposts" and method == "GET":
            outpost = {"metadata": {"outpost_id": OUTPOST_ID}, "spec": {"name": "rhel", "platform": "linux"}}
            return 200, json.dumps({"items": [outpost], "has_next_page": False}).encode()
        if path == "/opbeta/outposts/devins" and method == "GET":
            place = "recovery" if query.get("phase") == "claimed" else "list"
            fault = self._fault(place)
            if fault is not None:
                return fault
            with self.lock:
                items = [self.entry(sid) for sid in self.sessions]
            if place == "recovery":
                items = [i for i in items if i["status"]["acceptor_id"] == query.get("acceptor_id")]
            return 200, json.dumps({"items": items, "cursor": "c0", "has_next_page": False}).encode()
        prefix = "/opbeta/outposts/devins/"
        if not path.startswith(prefix):
            return 404, b'{"detail": "Not Found"}'
        sid, _sep, action = path[len(prefix) :].partition("/")
        with self.lock:
            known = sid in self.sessions
        if not known:
            return 404, b'{"detail": "Session not found in queue"}'
        if action == "claim" and method == "POST":
            fault = self._fault("claim")
            acceptor = json.loads(body)["acceptor_id"]
            with self.lock:
                holder = self.sessions[sid]["holder"]
                if holder not in (None, acceptor):
                    return 409, b'{"detail": "Session is already claimed"}'
                if isinstance(fault, Drip) or (fault is not None and fault[0] != 200):
                    return fault  # a refused claim (or one never answered): nothing changes
                self.sessions[sid]["holder"] = acceptor
                self.tokens += 1
                answer = self.entry(
                    sid, connect_token=f"ct_fault_{self.tokens}", gateway_url="ws://127.0.0.1:9/g"
                )
            return fault if fault is not None else (200, json.dumps(answer).encode())
        if action == "release" and method == "POST":
            fault = self._fault("release")
            if fault is not None:
                return fault
            with self.lock:
                self.sessions[sid]["holder"] = None
                return 200, json.dumps(self.entry(sid)).encode()
        if action == "" and method == "GET":
            fault = self._fault("get")
            if fault is not None:
                return fault
            with self.lock:
                return 200, json.dumps(self.entry(sid)).encode()
        return 404, b'{"detail": "Not Found"}'

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fleet = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self, method: str) -> None:
                parts = urlsplit(self.path)
                path = unquote(parts.path)
                query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                auth = self.headers.get("Authorization", "")
                with fleet.lock:
                    fleet.requests.append(
                        {"method": method, "path": path, "query": query, "auth": auth, "time": time.time()}
                    )
                if auth != f"Bearer {fleet.token}":
                    self._send(401, b'{"detail": "Invalid token"}')
                    return
                if method == "GET" and path == "/opbeta/outposts/devins" and query.get("watch") == "true":
                    (fleet.watch or keepalives)(self)
                    self.close_connection = True
                    return
                answer = fleet._answer(method, path, query, body)
                if isinstance(answer, Drip):
                    fleet._drip(self, answer)
                    self.close_connection = True
                    return
                status, payload, *headers = answer
                self._send(status, payload, *headers)

            def _send(self, status: int, payload: bytes, headers: Optional[dict[str, str]] = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def __enter__(self) -> FaultFleet:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def keepalives(handler: BaseHTTPRequestHandler) -> None:
    """A quiet watch: a keepalive every 0.2 s for at most 5 s (then the stream ends, as streams do)."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Connection", "close")
    handler.end_headers()
    end = time.monotonic() + 5.0
    try:
        while time.monotonic() < end:
            handler.wfile.write(b": keepalive\n\n")
            handler.wfile.flush()
            time.sleep(0.2)
    except OSError:
        pass


#: The three malformed values of issue 24, point 7, as JSON text: a number past a float's range, an
#: integer of 400 digits, and nesting 100,000 deep.
PAYLOADS = {
    "1e400": "1e400",
    "400 digits": "9" * 400,
    "nesting 1e5 deep": "[" * 100_000 + "]" * 100_000,
}
