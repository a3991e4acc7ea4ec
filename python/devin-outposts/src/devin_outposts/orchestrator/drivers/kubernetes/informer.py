"""The statuses of every Pod the ``kubernetes`` driver made for an acceptor id, from one list-and-watch.

:class:`PodInformer` is the driver's :class:`~devin_outposts.orchestrator.drivers.base.StatusSource`
(docs/orchestrator-kubernetes.md, "Pod status"): one label-selected LIST of our Pods (every outpost), then
one WATCH from the list's ``resourceVersion``, so that a session's Pod costs no request at all while
nothing changes, instead of a GET every ``--status-interval-secs``:

* the watch asks for bookmarks (which keep its ``resourceVersion`` recent while our Pods are quiet) and for
  a server-side ``timeoutSeconds``; the HTTP read times out a little later, so a half-open connection
  cannot hang it. A clean end resumes from the last version seen, with no new list;
* ``410 Gone`` (the HTTP status, or an ``ERROR`` event with code 410: the version was compacted away)
  lists again at once; the listing replaces the board, so a Pod deleted meanwhile becomes ``MISSING``;
* any other failure (a dropped stream, a refused request) puts the board out of sync at once (sessions
  read their Pods directly meanwhile), then lists again after a back-off of 1 s doubling to 30 s, jittered.

The driver replaces a session's Pod on each start (delete, wait until gone, create, same name):
:class:`PodTracker` is what it tells the informer meanwhile, so that the old Pod's deletion is read as the
worker starting again, and a late event of the old Pod is not taken for the new one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Mapping
from typing import Any, Callable, Optional

import httpx

from devin_outposts.orchestrator.drivers.base import DriverError, StatusSink, WorkerState, WorkerStatus
from devin_outposts.orchestrator.drivers.kubernetes.cluster import Cluster
from devin_outposts.orchestrator.drivers.kubernetes.pod_status import pod_status

log = logging.getLogger(__name__)

#: Seconds the API server keeps one watch open (it then ends it cleanly and we resume).
WATCH_SECONDS = 300
#: Seconds of silence past ``timeoutSeconds`` after which a stream is taken for dead (half-open).
SILENCE_MARGIN = 30.0
#: The back-off after a failure: first pause, cap (seconds); each pause is jittered by +-20 %.
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 30.0
REPLACING = WorkerStatus(WorkerState.STARTING, detail="replacing the pod")


class WatchExpired(Exception):
    """The API server no longer has the events since our version (410 Gone): list again."""


class PodTracker:
    """The Pods the driver is replacing now, and the uid of the one each session's Pod name stands for."""

    def __init__(self) -> None:
        self._replacing: dict[str, Optional[str]] = {}  # name -> uid of the Pod being replaced
        self._uids: dict[str, str] = {}

    def replacing(self, name: str, old_uid: Optional[str]) -> None:
        self._replacing[name] = old_uid or self._uids.get(name)

    def replaced(self, name: str, uid: Optional[str]) -> None:
        """The new Pod exists (``uid``: None when its creation failed)."""
        self._replacing.pop(name, None)
        if uid:
            self._uids[name] = uid
        else:
            self._uids.pop(name, None)

    def forget(self, name: str) -> None:
        self._replacing.pop(name, None)
        self._uids.pop(name, None)

    def read(self, pod: Mapping[str, Any], status: WorkerStatus, *, deleted: bool) -> Optional[WorkerStatus]:
        """What an event or a listed Pod says of its session's worker; None: nothing (an older Pod)."""
        meta = pod.get("metadata") or {}
        name, uid = str(meta.get("name")), meta.get("uid")
        if name in self._replacing:
            old = self._replacing[name]
            if deleted or meta.get("deletionTimestamp") or (old is not None and uid == old):
                return REPLACING  # the old Pod going: the worker is starting again
            return status
        expected = self._uids.get(name)
        if expected is not None and uid != expected:
            return None  # a late event of a Pod this name no longer stands for
        return status


class PodInformer:
    """One list-and-watch of the Pods with ``selector`` (see the module docs)."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        selector: Mapping[str, str],
        container_name: str,
        tracker: PodTracker,
        watch_seconds: int = WATCH_SECONDS,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.cluster = cluster
        self.selector = ",".join(f"{key}={value}" for key, value in sorted(selector.items()))
        self.container_name = container_name
        self.tracker = tracker
        self.watch_seconds = watch_seconds
        self._rng = rng
        #: Lists, watch requests, and why each watch ended (``end``, ``gone``, ``error``): for tests and logs.
        self.lists = 0
        self.watches = 0
        self.ends: dict[str, int] = {"end": 0, "gone": 0, "error": 0}
        self._pause = BACKOFF_FIRST
        self._listed = asyncio.Event()
        #: A watch since the last list delivered an event (so a 410 after it is no spin).
        self._delivered = False

    async def first_listing(self, timeout: float) -> bool:
        """Wait until the board holds a first listing, at most ``timeout`` seconds; whether it does."""
        try:
            await asyncio.wait_for(self._listed.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def run(self, board: StatusSink) -> None:
        self._pause = BACKOFF_FIRST
        expired = 0  # 410s since the last watch that delivered anything
        while True:
            try:
                version = await self._list(board)
                self._delivered = False
                await self._follow(board, version)
            except WatchExpired:
                if self._delivered:
                    expired = 0
                self.ends["gone"] += 1
                expired += 1
                log.info("the pod watch's version expired (410 Gone); listing the pods again")
                if expired > 1:  # expired again straight after a list: do not spin, list after a pause
                    await self._back_off()
                # Else the board stays as it was until the listing, a moment later, replaces it.
                continue
            except (DriverError, httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                self.ends["error"] += 1
                board.lost_sync()
                log.warning("the pod watch stopped (%s); listing again", _describe(exc))
                await self._back_off()

    async def _back_off(self) -> None:
        """Wait the current pause, jittered by +-20 %, and double it for next time (up to the cap)."""
        await asyncio.sleep(self._pause * (0.8 + 0.4 * self._rng()))
        self._pause = min(self._pause * 2, BACKOFF_MAX)

    def _status(self, pod: Mapping[str, Any], *, deleted: bool = False) -> Optional[WorkerStatus]:
        return self.tracker.read(pod, pod_status(pod, self.container_name), deleted=deleted)

    async def _list(self, board: StatusSink) -> str:
        """Every Pod of ours into the board; the list's ``resourceVersion``."""
        as_of = time.monotonic()
        self.lists += 1
        response = await self.cluster.http.get(
            self.cluster.path("pods"),
            params={"labelSelector": self.selector},
            timeout=self.cluster.request_timeout,
        )
        if response.status_code != 200:
            raise DriverError(
                f"Could not list pods in namespace {self.cluster.namespace}: {_refusal(response)}"
            )
        body = response.json()
        statuses = {}
        for pod in body.get("items") or []:
            status = self._status(pod)
            if status is not None:
                statuses[str(pod["metadata"]["name"])] = status
        board.replace_all(statuses, as_of=as_of)
        self._listed.set()
        return str(body["metadata"]["resourceVersion"])

    async def _follow(self, board: StatusSink, version: str) -> None:
        """Watch from ``version`` until the stream breaks (raises); a clean end resumes from the last
        version seen."""
        while True:
            version = await self._watch_once(board, version)
            self.ends["end"] += 1
            self._delivered = True
            self._pause = BACKOFF_FIRST  # a watch that lasted its time: the cluster is fine again

    async def _watch_once(self, board: StatusSink, version: str) -> str:
        """One watch request: its events into the board until it ends cleanly; the last version seen."""
        self.watches += 1
        params = {
            "watch": "true",
            "labelSelector": self.selector,
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.watch_seconds),
        }
        # The read timeout bounds the silence between two chunks: longer than the server's own end.
        timeout = httpx.Timeout(self.cluster.request_timeout, read=self.watch_seconds + SILENCE_MARGIN)
        http = self.cluster.http
        request = http.build_request("GET", self.cluster.path("pods"), params=params, timeout=timeout)
        response = await http.send(request, stream=True)
        try:
            if response.status_code == 410:
                raise WatchExpired()
            if response.status_code != 200:
                await response.aread()
                raise DriverError(
                    f"Could not watch pods in namespace {self.cluster.namespace}: {_refusal(response)}"
                )
            async for line in response.aiter_lines():
                if line.strip():
                    version = self._event(board, json.loads(line), version)
        finally:
            await response.aclose()
        return version

    def _event(self, board: StatusSink, event: Mapping[str, Any], version: str) -> str:
        """Apply one watch event; the version it brings us to."""
        kind, obj = event["type"], event["object"]
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise WatchExpired()
            raise DriverError(
                f"the pod watch failed: {obj.get('code')} {obj.get('reason')} {obj.get('message')}"
            )
        meta = obj.get("metadata") or {}
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            deleted = kind == "DELETED"
            status = self._status(obj, deleted=deleted)
            name = str(meta.get("name"))
            if status is REPLACING or (status is not None and not deleted):
                board.put(name, status)
            elif status is not None:
                board.gone(name, detail=f"pod {name} deleted")
        self._delivered = True
        return str(meta.get("resourceVersion") or version)


def _refusal(response: httpx.Response) -> str:
    try:
        body = response.json()
        code = body.get("code", response.status_code)
        return f"{code} {body.get('reason', '')} {body.get('message', '')}".strip()
    except ValueError:
        return f"HTTP {response.status_code}"


def _describe(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
