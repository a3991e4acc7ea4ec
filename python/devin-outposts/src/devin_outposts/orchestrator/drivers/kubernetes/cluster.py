"""The cluster as the ``kubernetes`` driver talks to it: one lightkube client in one namespace.

The client is made on first use, from the kubeconfig option or the environment (in-cluster service
account, ``$KUBECONFIG``, ``~/.kube/config``), which also names the namespace when the options do not.
Every call turns the client's failures into one-line :class:`DriverError` s that name the action, the
object and the namespace (``Could not delete pod outpost-worker-... in namespace outposts: 403 ...``),
and reads objects back as plain mappings, the form :mod:`.manifests` renders them in.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, Optional, TypeVar

import httpx
from lightkube import ApiError, AsyncClient, ConfigError, KubeConfig
from lightkube.types import PatchType

from devin_outposts.orchestrator.drivers.base import MANAGED_BY, DriverError

T = TypeVar("T")
#: Seconds between reads while waiting for a deleted object to be gone.
POLL = 0.5


def load(kind: type[T], body: Mapping[str, Any]) -> T:
    """A lightkube object from a manifest mapping (``from_dict`` is untyped)."""
    obj: T = kind.from_dict(dict(body))  # type: ignore[attr-defined]
    return obj


def _what(kind: Any, name: str) -> str:
    return f"{kind.__name__.lower()} {name}"


def _name(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("name"))


class Cluster:
    """One namespace of one cluster, through a client made on first use."""

    def __init__(
        self,
        *,
        kubeconfig: Optional[str],
        context: Optional[str],
        namespace: Optional[str],
        request_timeout: float,
        delete_timeout: float,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.context = context
        self.request_timeout = request_timeout
        self.delete_timeout = delete_timeout
        self._namespace = namespace
        self._client: Optional[AsyncClient] = None

    def _config(self) -> KubeConfig:
        try:
            if self.kubeconfig:
                return KubeConfig.from_file(self.kubeconfig)
            return KubeConfig.from_env()  # in-cluster first, then $KUBECONFIG, then ~/.kube/config
        except (ConfigError, OSError) as exc:
            raise DriverError(f"kubernetes driver: no usable cluster configuration: {exc}") from exc

    @property
    def client(self) -> AsyncClient:
        return self._connect()

    def _connect(self) -> AsyncClient:
        """The client, made on first use from the configuration (which also names the namespace)."""
        if self._client is None:
            try:
                config = self._config().get(context_name=self.context)
            except ConfigError as exc:
                raise DriverError(f"kubernetes driver: {exc}") from exc
            if config is None:
                raise DriverError("kubernetes driver: the kubeconfig has no current context")
            if self._namespace is None:
                self._namespace = config.namespace or "default"
            self._client = AsyncClient(
                config,
                namespace=self._namespace,
                timeout=httpx.Timeout(self.request_timeout, connect=10.0),
                field_manager=MANAGED_BY,
            )
        return self._client

    @property
    def http(self) -> httpx.AsyncClient:
        """The client's own HTTP connection (base URL, credentials, TLS), for the Pod watch
        (:mod:`.informer`): lightkube's watch cannot ask for bookmarks, waits on a silent stream forever
        and re-connects by itself, so the informer speaks the list-and-watch protocol itself."""
        adapter: Any = self._connect()._client  # lightkube's generic client
        http: httpx.AsyncClient = adapter._client
        return http

    def path(self, plural: str) -> str:
        """The URL path of a core/v1 collection in the namespace (``pods``)."""
        return f"/api/v1/namespaces/{self.namespace}/{plural}"

    @property
    def namespace(self) -> str:
        if self._namespace is None:
            self._connect()  # the namespace comes with the configuration
        assert self._namespace is not None
        return self._namespace

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def fail(self, action: str, obj: str, exc: Exception) -> DriverError:
        """The one-line error for ``action`` on ``obj`` that raised ``exc``."""
        if isinstance(exc, ApiError):
            reason = f"{exc.status.code} {exc.status.reason or ''} {exc.status.message or ''}".strip()
        else:
            reason = f"{type(exc).__name__}: {exc}"
        return DriverError(
            f"Could not {action} {obj} in namespace {self._namespace}: {' '.join(reason.split())}"
        )

    async def get(self, kind: Any, name: str) -> Optional[dict[str, Any]]:
        """The object as a mapping, or None when there is none of that name."""
        try:
            obj = await self.client.get(kind, name, namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise self.fail("read", _what(kind, name), exc) from exc
        except httpx.HTTPError as exc:
            raise self.fail("read", _what(kind, name), exc) from exc
        data: dict[str, Any] = obj.to_dict()
        return data

    async def list(self, kind: Any, labels: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Every object of ``kind`` with ``labels``, as mappings."""
        try:
            return [
                obj.to_dict()
                async for obj in self.client.list(kind, namespace=self.namespace, labels=dict(labels))
            ]
        except (ApiError, httpx.HTTPError) as exc:
            raise self.fail("list", f"{kind.__name__.lower()}s", exc) from exc

    async def create(self, kind: type[T], body: Mapping[str, Any]) -> T:
        """Create the object ``body`` describes; returns it as the cluster made it."""
        obj: Any = load(kind, body)  # lightkube's create is overloaded per resource class, not generic
        try:
            created: T = await self.client.create(obj)
        except (ApiError, httpx.HTTPError) as exc:
            raise self.fail("create", _what(kind, _name(body)), exc) from exc
        return created

    async def create_if_missing(self, kind: type[T], body: Mapping[str, Any]) -> Optional[T]:
        """Create the object ``body`` describes unless one of its name is there (``409 Conflict``): the
        object as the cluster made it, or None when this call made nothing."""
        obj: Any = load(kind, body)
        try:
            created: T = await self.client.create(obj)
        except ApiError as exc:
            if exc.status.code != 409:
                raise self.fail("create", _what(kind, _name(body)), exc) from exc
            return None
        except httpx.HTTPError as exc:
            raise self.fail("create", _what(kind, _name(body)), exc) from exc
        return created

    async def merge_patch(
        self, kind: Any, name: str, patch: Mapping[str, Any], *, action: str, what: Optional[str] = None
    ) -> None:
        """A JSON merge patch (``null`` removes a key). ``action`` and ``what`` word the error (``Could not
        keep persistentvolumeclaim X as a snapshot``); ``what`` is the object's kind and name by default."""
        try:
            await self.client.patch(
                kind, name, dict(patch), namespace=self.namespace, patch_type=PatchType.MERGE
            )
        except (ApiError, httpx.HTTPError) as exc:
            raise self.fail(action, what or _what(kind, name), exc) from exc

    async def delete(self, kind: Any, name: str, *, wait: bool = False) -> bool:
        """Delete; True when it existed. With ``wait``, return only once it is gone (a Pod terminates)."""
        what = _what(kind, name)
        try:
            await self.client.delete(kind, name, namespace=self.namespace)
            existed = True
        except ApiError as exc:
            if exc.status.code != 404:
                raise self.fail("delete", what, exc) from exc
            existed = False
        except httpx.HTTPError as exc:
            raise self.fail("delete", what, exc) from exc
        if wait and existed:
            deadline = time.monotonic() + self.delete_timeout
            while await self.get(kind, name) is not None:
                if time.monotonic() > deadline:
                    raise DriverError(f"Could not delete {what}: still there after {self.delete_timeout:g} s")
                await asyncio.sleep(POLL)
        return existed
