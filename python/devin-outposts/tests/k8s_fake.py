"""A fake Kubernetes API server: exactly the endpoints the ``kubernetes`` driver uses, and no kubelet.

Namespaced pods, secrets and persistentvolumeclaims (core/v1), leases (coordination.k8s.io/v1),
networkpolicies (networking.k8s.io/v1) and deployments (apps/v1, for the owner lookup): create, get,
list with ``labelSelector``, replace (PUT), JSON merge patch, delete. Objects get ``metadata.uid``,
``resourceVersion`` (one counter for the whole server, as etcd's revision) and ``creationTimestamp``.
Errors are Kubernetes ``Status`` objects: 404 NotFound, 409 AlreadyExists on a create of an existing
name, 409 Conflict on a replace carrying a stale ``resourceVersion``.

Collection GETs with ``watch=true`` stream newline-delimited ``{"type", "object"}`` events over chunked
HTTP, as the API server does: from ``resourceVersion`` (absent or ``0``: an ``ADDED`` per current object
first), filtered by ``labelSelector``, ended cleanly after ``timeoutSeconds`` (with a ``BOOKMARK`` first when
``allowWatchBookmarks``). Every change is kept in an event log; :meth:`FakeKube.compact` forgets it, so a
watch from an older version gets ``410 Gone`` (an ``ERROR`` event, or the HTTP status with
``gone_as_http``); :meth:`FakeKube.drop_watches` breaks every open stream mid-way. :meth:`FakeKube.count`
counts requests by the verb an API server's authorizer checks (``get``, ``list``, ``watch``, ...).

Since no kubelet runs, a test sets a Pod's status itself (:meth:`FakeKube.set_pod_status`). There is no
garbage collector either: owner references are stored, never acted on, so a test that finds a Secret
gone knows the driver deleted it. ``hold_deletions`` makes deleted objects of those kinds linger as
terminating (``deletionTimestamp`` set) until :meth:`finish_deletions`, like a Pod whose container is
still stopping or a PVC held by its protection finalizer.

It runs in a thread (stdlib ``ThreadingHTTPServer``), independent of the test's event loop.
"""

from __future__ import annotations

import copy
import datetime
import json
import re
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional
from urllib.parse import parse_qs, urlparse

KINDS = {
    ("api/v1", "pods"): "Pod",
    ("api/v1", "secrets"): "Secret",
    ("api/v1", "persistentvolumeclaims"): "PersistentVolumeClaim",
    ("apis/coordination.k8s.io/v1", "leases"): "Lease",
    ("apis/apps/v1", "deployments"): "Deployment",
    ("apis/networking.k8s.io/v1", "networkpolicies"): "NetworkPolicy",
}
_PATH = re.compile(r"^/(api/v1|apis/[^/]+/v1)/namespaces/([^/]+)/([a-z]+)(?:/([^/]+))?$")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Equality-based label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, comma-separated."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str = ""
    body: Any = None

    @property
    def resource(self) -> str:
        match = _PATH.match(self.path)
        return match.group(3) if match else ""

    @property
    def verb(self) -> str:
        """The verb an API server's authorizer checks: ``get``, ``list``, ``watch``, ``create``, ..."""
        if self.method != "GET":
            return _VERBS.get(self.method, self.method.lower())
        match = _PATH.match(self.path)
        if match is not None and match.group(4):
            return "get"
        return "watch" if self.query.get("watch", [""])[0] in ("true", "1") else "list"


@dataclass
class Event:
    """One change in the event log: the revision it made, and the object as it was then."""

    revision: int
    type: str  # ADDED, MODIFIED, DELETED
    kind: str
    namespace: str
    object: dict[str, Any]


@dataclass
class FakeKube:
    """The server's state; the handler locks it for every request."""

    store: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)  # (kind, ns, name)
    revision: int = 0
    requests: list[Request] = field(default_factory=list)
    hold_deletions: set[str] = field(default_factory=set)
    #: While set, every request is answered 503 (an API server that is away).
    outage: bool = False
    lock: threading.RLock = field(default_factory=threading.RLock)
    url: str = ""
    #: Every change since the last :meth:`compact`, oldest first.
    events: list[Event] = field(default_factory=list)
    #: A watch from a revision older than this one is answered 410 Gone.
    compacted: int = 0
    #: Answer a watch from a compacted revision with HTTP 410 instead of a 410 ``ERROR`` event.
    gone_as_http: bool = False
    #: Watches open now (a test waits for its client to be following), and those answered 410 Gone.
    open_watches: int = 0
    expired_watches: int = 0
    _drops: int = 0
    _ends: int = 0
    changed: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    # -- test helpers --------------------------------------------------------------------------------

    def objects(self, kind: str, namespace: Optional[str] = None) -> list[dict[str, Any]]:
        with self.lock:
            return [
                copy.deepcopy(obj)
                for (k, ns, dummy), obj in sorted(self.store.items())
                if k == kind and (namespace is None or ns == namespace)
            ]

    def get(self, kind: str, namespace: str, name: str) -> Optional[dict[str, Any]]:
        with self.lock:
            obj = self.store.get((kind, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Seed an object as if someone else had created it."""
        with self.lock:
            return self._create(obj["kind"], obj["metadata"].get("namespace", "default"), obj)[1]

    def set_pod_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """What a kubelet would report (phase, containerStatuses with restartCount, exit codes)."""
        with self.lock:
            pod = self.store[("Pod", namespace, name)]
            pod["status"] = copy.deepcopy(status)
            self._bump(pod)

    def finish_deletions(self) -> None:
        with self.lock:
            for key in [k for k, obj in self.store.items() if obj["metadata"].get("deletionTimestamp")]:
                self._bump(self.store.pop(key), "DELETED")

    def delete(self, kind: str, namespace: str, name: str) -> None:
        """Remove an object as someone else would (at once: no grace, no finalizer)."""
        with self.lock:
            self._bump(self.store.pop((kind, namespace, name)), "DELETED")

    def count(self, verb: str, resource: str = "pods", since: int = 0) -> int:
        """Requests of ``verb`` on ``resource`` since request number ``since`` (``len(fake.requests)``)."""
        with self.lock:
            return sum(1 for r in self.requests[since:] if r.verb == verb and r.resource == resource)

    def compact(self) -> None:
        """Forget the event log, as etcd's compaction does: a watch from before now gets 410 Gone."""
        with self.lock:
            self.compacted = self.revision
            self.events.clear()

    def drop_watches(self) -> None:
        """Break every open watch mid-stream (the connection closes without the end of the body)."""
        with self.lock:
            self._drops += 1
            self.changed.notify_all()

    def end_watches(self) -> None:
        """End every open watch cleanly at once, before it sends the events it has not sent yet (as the
        server's own timeout would; under :attr:`lock` with a change, the change is never sent)."""
        with self.lock:
            self._ends += 1
            self.changed.notify_all()

    def close(self) -> None:
        with self.lock:
            self._drops += 1
            self.changed.notify_all()

    def kubeconfig(self, path: Path, namespace: str = "outposts") -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-kube-token"}}],
            "contexts": [
                {"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}
            ],
            "current-context": "fake",
        }
        path.write_text(json.dumps(config))  # JSON is YAML
        return path

    # -- the API ---------------------------------------------------------------------------------------

    def _bump(self, obj: dict[str, Any], change: str = "MODIFIED") -> None:
        """A new revision for ``obj``'s ``change``, logged for watches."""
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        meta = obj["metadata"]
        self.events.append(Event(self.revision, change, obj["kind"], meta["namespace"], copy.deepcopy(obj)))
        self.changed.notify_all()

    def _create(self, kind: str, namespace: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        meta = body.get("metadata") or {}
        name = meta.get("name")
        if not name:
            return 422, _status(422, "Invalid", f"{kind} metadata.name: Required value")
        if meta.get("namespace", namespace) != namespace:
            return 400, _status(400, "BadRequest", "the namespace of the object does not match the request")
        if (kind, namespace, name) in self.store:
            return 409, _status(409, "AlreadyExists", f'{kind.lower()}s "{name}" already exists')
        obj = copy.deepcopy(body)
        obj["metadata"] = {
            **meta,
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "creationTimestamp": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        obj["metadata"].pop("resourceVersion", None)
        obj["kind"] = kind
        if kind == "Pod":
            obj.setdefault("status", {"phase": "Pending"})
        self._bump(obj, "ADDED")
        self.store[(kind, namespace, name)] = obj
        return 201, copy.deepcopy(obj)

    def open_watch(self, request: Request) -> Optional[tuple[int, dict[str, Any]]]:
        """Record a watch request; the error to answer instead of a stream, if any."""
        with self.lock:
            self.requests.append(request)
            if self.outage:
                return 503, _status(503, "ServiceUnavailable", "the fake API server is in an outage")
            match = _PATH.match(request.path)
            if match is None or KINDS.get((match.group(1), match.group(3))) is None or match.group(4):
                return 404, _status(404, "NotFound", f"cannot watch {request.path}")
            since = _since(request)
            if self.gone_as_http and since is not None and since < self.compacted:
                self.expired_watches += 1
                return 410, _gone(since, self.compacted)
            return None

    def follow(self, request: Request) -> Iterator[Optional[dict[str, Any]]]:
        """The events of a watch, as the stream's lines; None: the stream breaks here (drop_watches)."""
        match = _PATH.match(request.path)
        assert match is not None
        kind, namespace = KINDS[(match.group(1), match.group(3))], match.group(2)
        selector = request.query.get("labelSelector", [""])[0]
        timeout = float(request.query.get("timeoutSeconds", ["0"])[0] or 0)
        bookmarks = request.query.get("allowWatchBookmarks", [""])[0] == "true"
        deadline = time.monotonic() + timeout if timeout > 0 else None
        since = _since(request)

        def ours(obj: dict[str, Any], obj_kind: str, obj_namespace: str) -> bool:
            labels = obj["metadata"].get("labels") or {}
            return obj_kind == kind and obj_namespace == namespace and selector_matches(selector, labels)

        with self.lock:
            drops, ends = self._drops, self._ends
            self.open_watches += 1
            if since is None:  # the current objects first, as ADDED
                first = [
                    {"type": "ADDED", "object": copy.deepcopy(o)}
                    for (k, ns, dummy), o in sorted(self.store.items())
                    if ours(o, k, ns)
                ]
                cursor = self.revision
            elif since < self.compacted:
                first, cursor = [{"type": "ERROR", "object": _gone(since, self.compacted)}], -1
                self.expired_watches += 1
            else:
                first, cursor = [], since
        try:
            yield from first
            while cursor >= 0:
                with self.lock:
                    while True:
                        if self._drops != drops or self._ends != ends:
                            break
                        fresh = [e for e in self.events if e.revision > cursor]
                        left = deadline - time.monotonic() if deadline is not None else 1.0
                        if fresh or left <= 0:
                            break
                        self.changed.wait(timeout=min(left, 1.0))
                    if self._drops != drops:
                        yield None
                        return
                    if self._ends != ends:
                        return
                    if not fresh:  # timeoutSeconds passed: a clean end
                        if bookmarks:
                            mark = {
                                "kind": kind,
                                "apiVersion": "v1",
                                "metadata": {"resourceVersion": str(self.revision)},
                            }
                            yield {"type": "BOOKMARK", "object": mark}
                        return
                    cursor = fresh[-1].revision
                    lines = [
                        {"type": e.type, "object": copy.deepcopy(e.object)}
                        for e in fresh
                        if ours(e.object, e.kind, e.namespace)
                    ]
                yield from lines
        finally:
            with self.lock:
                self.open_watches -= 1

    def handle(self, request: Request) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.requests.append(request)
            if self.outage:
                return 503, _status(503, "ServiceUnavailable", "the fake API server is in an outage")
            match = _PATH.match(request.path)
            kind = KINDS.get((match.group(1), match.group(3))) if match else None
            if match is None or kind is None:
                return 404, _status(
                    404, "NotFound", f"the server could not find the requested resource {request.path}"
                )
            namespace, name = match.group(2), match.group(4)
            key = (kind, namespace, name or "")
            current = self.store.get(key)
            missing = _status(404, "NotFound", f'{kind.lower()}s "{name}" not found')
            if name is None:
                if request.method == "GET":
                    selector = request.query.get("labelSelector", [""])[0]
                    items = [
                        copy.deepcopy(o)
                        for (k, ns, dummy), o in sorted(self.store.items())
                        if k == kind
                        and ns == namespace
                        and selector_matches(selector, o["metadata"].get("labels") or {})
                    ]
                    return 200, {
                        "kind": f"{kind}List",
                        "apiVersion": "v1",
                        "metadata": {"resourceVersion": str(self.revision)},
                        "items": items,
                    }
                if request.method == "POST":
                    return self._create(kind, namespace, request.body or {})
                return 405, _status(405, "MethodNotAllowed", request.method)
            if current is None:
                return 404, missing
            if request.method == "GET":
                return 200, copy.deepcopy(current)
            if request.method == "DELETE":
                if kind in self.hold_deletions:
                    current["metadata"].setdefault("deletionTimestamp", "2026-01-01T00:00:00Z")
                    self._bump(current)
                    return 200, copy.deepcopy(current)
                del self.store[key]
                self._bump(current, "DELETED")
                return 200, copy.deepcopy(current)
            if request.method == "PUT":
                body = request.body or {}
                sent = (body.get("metadata") or {}).get("resourceVersion")
                if sent and sent != current["metadata"]["resourceVersion"]:
                    return 409, _status(
                        409,
                        "Conflict",
                        f'Operation cannot be fulfilled on {kind.lower()}s "{name}": '
                        "the object has been modified; please apply your changes to the latest version "
                        "and try again",
                    )
                obj = copy.deepcopy(body)
                obj["metadata"] = {
                    **body.get("metadata", {}),
                    **{k: current["metadata"][k] for k in ("uid", "creationTimestamp", "namespace", "name")},
                }
                obj["kind"] = kind
                self._bump(obj)
                self.store[key] = obj
                return 200, copy.deepcopy(obj)
            if request.method == "PATCH":
                if request.content_type != "application/merge-patch+json":
                    return 415, _status(
                        415,
                        "UnsupportedMediaType",
                        f"the fake takes merge patches only, not {request.content_type}",
                    )
                obj = _merge(current, request.body)
                for k in ("uid", "creationTimestamp", "namespace", "name"):
                    obj["metadata"][k] = current["metadata"][k]
                self._bump(obj)
                self.store[key] = obj
                return 200, copy.deepcopy(obj)
            return 405, _status(405, "MethodNotAllowed", request.method)


def _since(request: Request) -> Optional[int]:
    """The revision a watch starts after; None: from now, with the current objects first."""
    text = request.query.get("resourceVersion", [""])[0]
    return int(text) if text and text != "0" else None


def _gone(since: int, compacted: int) -> dict[str, Any]:
    return _status(410, "Expired", f"too old resource version: {since} ({compacted})")


def _handler(fake: FakeKube) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # keep test output clean
            return None

        def _serve(self) -> None:
            url = urlparse(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            request = Request(
                self.command,
                url.path,
                parse_qs(url.query),
                (self.headers.get("Content-Type") or "").split(";")[0].strip(),
                json.loads(raw) if raw else None,
            )
            if self.command == "GET" and request.verb == "watch":
                self._watch(request)
                return
            code, body = fake.handle(request)
            self._reply(code, body)

        def _reply(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _watch(self, request: Request) -> None:
            refused = fake.open_watch(request)
            if refused is not None:
                self._reply(*refused)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for line in fake.follow(request):
                    if line is None:  # broken mid-stream: no last chunk, the connection closes
                        self.close_connection = True
                        return
                    data = json.dumps(line).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.write(b"0\r\n\r\n")
            except OSError:  # the client went away
                self.close_connection = True

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

    return Handler


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (a stopped orchestrator's keep-alive or watch connection) is no error
        worth a traceback on stderr; anything else is."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextmanager
def run_fake_kube() -> Iterator[FakeKube]:
    fake = FakeKube()
    server = _Server(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="fake-kube", daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.close()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# -- validating what the driver sends against the Kubernetes schemas, offline -------------------------------

#: The oldest and newest schema sets kubernetes-validate ships (strict: unknown fields are errors too).
SCHEMA_VERSIONS = ("1.25.0", "1.37.0")


def no_network(*args: Any, **kwargs: Any) -> None:
    """Patched over ``socket.socket.connect`` while validating: the schemas must come from the package."""
    raise AssertionError("schema validation tried to use the network")
