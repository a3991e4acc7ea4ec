"""A fake Kubernetes API server: exactly the endpoints the ``kubernetes`` driver uses, and no kubelet.

Namespaced pods, secrets and persistentvolumeclaims (core/v1), leases (coordination.k8s.io/v1),
networkpolicies (networking.k8s.io/v1) and deployments (apps/v1, for the owner lookup): create, get,
list with ``labelSelector``, replace (PUT), JSON merge patch, delete. Objects get ``metadata.uid``,
``resourceVersion`` (one counter for the whole server, as etcd's revision) and ``creationTimestamp``.
Errors are Kubernetes ``Status`` objects: 404 NotFound, 409 AlreadyExists on a create of an existing
name, 409 Conflict on a replace carrying a stale ``resourceVersion``.

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
import threading
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


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str = ""
    body: Any = None


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
                del self.store[key]

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

    def _bump(self, obj: dict[str, Any]) -> None:
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)

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
        if kind == "Pod":
            obj.setdefault("status", {"phase": "Pending"})
        self._bump(obj)
        self.store[(kind, namespace, name)] = obj
        return 201, copy.deepcopy(obj)

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
            code, body = fake.handle(request)
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

    return Handler


@contextmanager
def run_fake_kube() -> Iterator[FakeKube]:
    fake = FakeKube()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="fake-kube", daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# -- validating what the driver sends against the Kubernetes schemas, offline -------------------------------

#: The oldest and newest schema sets kubernetes-validate ships (strict: unknown fields are errors too).
SCHEMA_VERSIONS = ("1.25.0", "1.37.0")


def no_network(*args: Any, **kwargs: Any) -> None:
    """Patched over ``socket.socket.connect`` while validating: the schemas must come from the package."""
    raise AssertionError("schema validation tried to use the network")
