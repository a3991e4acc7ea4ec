"""Leader election through a ``coordination.k8s.io/v1`` Lease, as client-go and the operator do it.

Two orchestrators with one acceptor id must not both claim, renew and tear down: the one holding the
Lease acts, the other waits. Every write is a replace carrying the ``resourceVersion`` that was read, so
of two contenders writing at once one gets ``409 Conflict``, re-reads and sees the other holding it.

Expiry is judged by *this* process's monotonic clock, from the moment it last saw the Lease record
change (client-go's rule), not by comparing the holder's ``renewTime`` with our wall clock: the nodes'
clocks may disagree, ours only has to run at the right rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from typing import Any, Optional

import httpx
from lightkube import ApiError, AsyncClient
from lightkube.resources.coordination_v1 import Lease

from devin_outposts.orchestrator.drivers.kubernetes.cluster import load
from devin_outposts.orchestrator.drivers.kubernetes.manifests import micro_time, render_lease

log = logging.getLogger(__name__)


class LeaseLock:
    """Leadership through one Lease.

    ``async with lock:`` waits until this process leads, renews in the background, and gives the Lease
    up on exit. :attr:`lost` is set when a renewal did not succeed within the lease duration (or someone
    else holds it): the caller must stop acting at once, since another orchestrator may take over.
    """

    def __init__(
        self,
        client: AsyncClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        duration: float = 15.0,
        renew_interval: float = 5.0,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration = duration
        self.renew_interval = renew_interval
        self.lost = asyncio.Event()
        self.leading = False
        self._task: Optional[asyncio.Task[None]] = None
        # What we last saw, and when (monotonic): the basis of expiry.
        self._observed: Optional[tuple[Any, ...]] = None
        self._observed_at = 0.0
        self._renewed_at = 0.0

    def __repr__(self) -> str:
        return f"LeaseLock({self.namespace}/{self.name}, identity={self.identity}, leading={self.leading})"

    async def __aenter__(self) -> LeaseLock:
        await self.acquire()
        self.start_renewing()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    async def _read(self) -> Optional[dict[str, Any]]:
        try:
            lease = await self.client.get(Lease, self.name, namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise
        data: dict[str, Any] = lease.to_dict()  # type: ignore[no-untyped-call]
        return data

    def _expired(self, lease: dict[str, Any]) -> bool:
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        if not holder:
            return True
        record = (holder, spec.get("renewTime"), lease["metadata"].get("resourceVersion"))
        now = time.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self.duration)
        return now - self._observed_at > duration

    async def _try(self) -> bool:
        """One attempt to take or keep the Lease; True when we hold it afterwards."""
        now = datetime.datetime.now(datetime.timezone.utc)
        lease = await self._read()
        if lease is None:
            body = render_lease(self.namespace, self.name, self.identity, round(self.duration), now)
            try:
                await self.client.create(load(Lease, body))
            except ApiError as exc:
                if exc.status.code == 409:  # another contender created it first
                    return False
                raise
            return True
        spec = dict(lease.get("spec") or {})
        ours = spec.get("holderIdentity") == self.identity
        if not ours and not self._expired(lease):
            return False
        if not ours:
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            spec["acquireTime"] = micro_time(now)
        spec["holderIdentity"] = self.identity
        spec["leaseDurationSeconds"] = round(self.duration)
        spec["renewTime"] = micro_time(now)
        lease["spec"] = spec
        try:
            # The resourceVersion we read rides along: a write in between makes this a 409.
            await self.client.replace(load(Lease, lease))
        except ApiError as exc:
            if exc.status.code == 409:
                return False
            raise
        return True

    async def acquire(self) -> None:
        """Wait until this process holds the Lease."""
        while True:
            try:
                if await self._try():
                    break
            except (ApiError, httpx.HTTPError, OSError) as exc:  # the API server is briefly away: keep trying
                log.warning("could not read or take Lease %s/%s: %s", self.namespace, self.name, exc)
            await asyncio.sleep(self.renew_interval)
        self.leading = True
        self.lost.clear()
        self._renewed_at = time.monotonic()
        log.info("leading as %s through Lease %s/%s", self.identity, self.namespace, self.name)

    def start_renewing(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._renew_forever(), name=f"lease-{self.name}")

    async def _renew_forever(self) -> None:
        while self.leading:
            await asyncio.sleep(self.renew_interval)
            try:
                renewed = await self._try()
            except (ApiError, httpx.HTTPError, OSError) as exc:
                log.warning("could not renew Lease %s/%s: %s", self.namespace, self.name, exc)
                renewed = False
            if renewed:
                self._renewed_at = time.monotonic()
                continue
            lease = None
            with contextlib.suppress(ApiError, httpx.HTTPError, OSError):
                lease = await self._read()
            taken = lease is not None and (lease.get("spec") or {}).get("holderIdentity") not in (
                None,
                "",
                self.identity,
            )
            if taken or time.monotonic() - self._renewed_at >= self.duration:
                log.error("lost the Lease %s/%s", self.namespace, self.name)
                self.leading = False
                self.lost.set()

    async def release(self) -> None:
        """Stop renewing and give the Lease up, so a successor need not wait for it to expire."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if not self.leading:
            return
        self.leading = False
        try:
            lease = await self._read()
            if lease is not None and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                spec = dict(lease["spec"])
                spec["holderIdentity"] = None
                spec["leaseDurationSeconds"] = 1
                lease["spec"] = spec
                await self.client.replace(load(Lease, lease))
        except (ApiError, httpx.HTTPError, OSError) as exc:
            # Not worth failing a shutdown for: it expires by itself within the lease duration.
            log.warning("could not release Lease %s/%s: %s", self.namespace, self.name, exc)
