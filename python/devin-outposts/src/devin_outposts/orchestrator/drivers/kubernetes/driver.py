"""The ``kubernetes`` driver: a Pod and a Secret per session (and a PVC for the ``snapshot`` policy, and a
NetworkPolicy for a session whose network policy is enabled).

What each method does to the cluster:

* :meth:`provision` makes the state PVC (``state_volume``) and nothing else: the Pod needs the connect
  token, which only :meth:`start` gets;
* :meth:`start` replaces the Pod: deletes one already there and waits until it is gone (the name is
  deterministic, and a terminating Pod still holds it), recreates the Secret with the fresh token and the
  NetworkPolicy (:mod:`.network_policy`; removed when the policy is not enabled), creates the Pod, then
  makes the Pod their owner. Both are recreated rather than updated so that they have a new uid: the
  cluster's garbage collector may still be about to delete the old ones for the old Pod, and it deletes by
  uid. The NetworkPolicy exists before the Pod does, so the Pod never runs unfenced. A machine's first
  start after :meth:`provision` found no Pod of its name deletes nothing up front (on a fresh machine
  each delete would be a wasted 404): it creates, and only an object already there (``409``) is deleted,
  waited for and created again. A Secret already there means an earlier start left objects behind: the
  start then replaces everything as a restart does. Without a policy, a NetworkPolicy of the session's
  name is read first and deleted only when there. Restarts and adopted machines always delete first;
* :meth:`status` reads the Pod: ``restartPolicy: OnFailure`` makes the kubelet restart a failed worker
  in place (``restarts`` is the container's ``restartCount``, ``exit_code`` what its last run exited
  with); ``Succeeded`` is exit 0 and ``Failed`` the container's exit code;
* :meth:`snapshot` labels the PVC as kept; :meth:`teardown` deletes the Pod, the Secret, the
  NetworkPolicy and any PVC not kept; :meth:`restore` unlabels the kept PVC, which the new Pod then
  mounts (it has the same name). A kept PVC that is not restored before :meth:`start` is replaced by an
  empty one: that session starts fresh.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import socket
import time
import uuid
from collections.abc import Container, Mapping
from typing import Any, ClassVar, Optional, TypeVar

import httpx
from lightkube import ApiError, AsyncClient
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import PersistentVolumeClaim, Pod, Secret
from lightkube.resources.networking_v1 import NetworkPolicy

from devin_outposts.orchestrator.drivers.base import (
    LABEL_ACCEPTOR,
    LABEL_MANAGED_BY,
    LABEL_OUTPOST,
    LABEL_SESSION,
    MANAGED_BY,
    Driver,
    DriverContext,
    DriverError,
    Machine,
    SessionSpec,
    Snapshot,
    WorkerLaunch,
    WorkerState,
    WorkerStatus,
    label_value,
    machine_name,
    name_taken,
)
from devin_outposts.orchestrator.drivers.kubernetes.cluster import Cluster
from devin_outposts.orchestrator.drivers.kubernetes.informer import PodInformer, PodTracker
from devin_outposts.orchestrator.drivers.kubernetes.lease import LeaseLock
from devin_outposts.orchestrator.drivers.kubernetes.manifests import (
    ANNOTATION_ACCEPTOR,
    ANNOTATION_OUTPOST,
    ANNOTATION_SESSION,
    ANNOTATION_SUSPENDED_AT,
    LABEL_SNAPSHOT,
    PodSettings,
    owner_reference,
    pod_name,
    pvc_name,
    render_pod,
    render_pvc,
    render_secret,
    secret_name,
)
from devin_outposts.orchestrator.drivers.kubernetes.network_policy import (
    network_policy_name,
    render_network_policy,
)
from devin_outposts.orchestrator.drivers.kubernetes.options import OPTIONS, KubernetesOptions, parse_options
from devin_outposts.orchestrator.drivers.kubernetes.pod_status import pod_status

log = logging.getLogger(__name__)
T = TypeVar("T")


def _parse_time(text: Any) -> float:
    if isinstance(text, datetime.datetime):
        return text.timestamp()
    if isinstance(text, str):
        try:
            return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    return time.time()


class KubernetesDriver(Driver):
    name: ClassVar[str] = "kubernetes"
    option_table = OPTIONS
    restarts_in_place: ClassVar[bool] = True

    def __init__(self, context: DriverContext, options: KubernetesOptions) -> None:
        self.context = context
        self.options = options
        self.cluster = Cluster(
            kubeconfig=options.kubeconfig,
            context=options.context,
            namespace=options.namespace,
            request_timeout=options.request_timeout,
            delete_timeout=options.delete_timeout,
        )
        self._owner = options.pod.owner
        #: The Pods being replaced, for the Pod watch (:mod:`.informer`).
        self.pods = PodTracker()
        self._informer: Optional[PodInformer] = None

    @classmethod
    def from_options(cls, context: DriverContext, options: Mapping[str, Any]) -> KubernetesDriver:
        return cls(context, parse_options(options, tuple(context.worker_command)))

    @property
    def client(self) -> AsyncClient:
        return self.cluster.client

    @property
    def namespace(self) -> str:
        return self.cluster.namespace

    async def aclose(self) -> None:
        await self.cluster.aclose()

    # -- start-up -----------------------------------------------------------------------------------

    async def check(self) -> None:
        """The cluster answers and we may list Pods; an owner without a uid is looked up (Deployments)."""
        try:
            async for dummy in self.client.list(
                Pod, namespace=self.namespace, labels={LABEL_MANAGED_BY: MANAGED_BY}, chunk_size=1
            ):
                break
        except (ApiError, httpx.HTTPError) as exc:
            raise self.cluster.fail("list", "pods", exc) from exc
        owner = self._owner
        if owner and not owner.get("uid"):
            if owner["kind"] != "Deployment" or not owner["apiVersion"].startswith("apps/"):
                raise OPTIONS.error("owner", "needs a uid unless it is an apps/v1 Deployment")
            try:
                deployment = await self.client.get(Deployment, owner["name"], namespace=self.namespace)
            except (ApiError, httpx.HTTPError) as exc:
                raise self.cluster.fail("read the owner", f"deployment {owner['name']}", exc) from exc
            assert deployment.metadata is not None
            self._owner = {**owner, "uid": str(deployment.metadata.uid)}

    def _settings(self) -> PodSettings:
        if self._owner is not None and not self._owner.get("uid"):
            raise DriverError("kubernetes driver: the owner's uid is unknown (check() was not run)")
        return dataclasses.replace(self.options.pod, owner=self._owner)

    # -- leader election ----------------------------------------------------------------------------

    def leadership(self, acceptor_id: str) -> Optional[LeaseLock]:
        """A Lease lock for ``acceptor_id`` (``async with``; watch :attr:`LeaseLock.lost`), or None when
        the ``leader_election`` option is off. The identity is this Pod's name (downward API
        ``POD_NAME``) or the host name, plus a random suffix, so two processes never share it."""
        if not self.options.leader_election:
            return None
        name = self.options.lease_name or machine_name("devin-outposts-leader", acceptor_id)
        base = os.environ.get("POD_NAME") or socket.gethostname()
        identity = f"{base}-{uuid.uuid4().hex[:8]}"
        return LeaseLock(
            self.client,
            self.namespace,
            name,
            identity,
            duration=self.options.lease_duration,
            renew_interval=self.options.lease_renew_interval,
        )

    # -- machines -----------------------------------------------------------------------------------

    def _machine(self, spec: SessionSpec, created_at: Optional[float] = None, **details: Any) -> Machine:
        name = pod_name(spec.session_id)
        return Machine(
            name=name,
            session_id=spec.session_id,
            outpost_id=spec.outpost_id,
            acceptor_id=spec.acceptor_id,
            created_at=created_at if created_at is not None else time.time(),
            ref=name,
            details={"namespace": self.namespace, **details},
        )

    @staticmethod
    def _spec(machine: Machine) -> SessionSpec:
        return SessionSpec(
            session_id=machine.session_id, outpost_id=machine.outpost_id, acceptor_id=machine.acceptor_id
        )

    async def provision(self, spec: SessionSpec) -> Machine:
        name = pod_name(spec.session_id)
        existing = await self.cluster.get(Pod, name)
        if existing is not None:  # start() replaces the Pod of this name: it must be this session's
            owner = self._identity(existing)
            if owner is None:
                raise DriverError(f"pod {name} exists and is not one of ours")
            if owner.session_id != spec.session_id:
                raise name_taken(f"pod {name}", owner.session_id)
        if self.options.pod.state_volume:
            await self._ensure_pvc(spec, fresh=False)
        # No Pod of this name: the first start may create before it deletes (see the module docs).
        return self._machine(spec, fresh=existing is None)

    async def _ensure_pvc(self, spec: SessionSpec, *, fresh: bool) -> None:
        """Create the state PVC if missing; with ``fresh``, a kept (snapshot) PVC makes way for a new one.

        A PVC still terminating (a teardown just before) is waited for: a Pod mounting it would never
        start, and creating one of that name meanwhile is a 409.
        """
        name = pvc_name(spec.session_id)
        current = await self.cluster.get(PersistentVolumeClaim, name)
        if current is not None:
            meta = current.get("metadata") or {}
            kept = (meta.get("labels") or {}).get(LABEL_SNAPSHOT) == "true"
            if fresh and kept:
                log.info(
                    "session %s: snapshot %s was not restored; starting from an empty volume",
                    spec.session_id,
                    name,
                )
            if meta.get("deletionTimestamp") or (fresh and kept):
                await self.cluster.delete(PersistentVolumeClaim, name, wait=True)
        # Already there is no error: provision is idempotent.
        body = render_pvc(self.namespace, spec, self._settings())
        await self.cluster.create_if_missing(PersistentVolumeClaim, body)

    async def start(self, machine: Machine, launch: WorkerLaunch) -> None:
        spec = self._spec(machine)
        pod_body = render_pod(self.namespace, spec, launch, self._settings())
        fence = render_network_policy(
            self.namespace,
            spec,
            launch,
            dns_peer=self.options.network_policy_dns,
            extra_cidrs=self.options.network_policy_cidrs,
        )
        secret = render_secret(self.namespace, spec, launch.connect_token)
        # Only the first start of a machine provision found without a Pod: a second start (a restart, or
        # a retry after a failed one) replaces what the first made.
        fresh = bool(machine.details.pop("fresh", False)) and not machine.details.get("started")
        self.pods.replacing(machine.ref, machine.details.get("uid"))
        uid: Optional[str] = None
        try:
            uid = await self._replace(machine, spec, pod_body, secret, fence, fresh=fresh)
        finally:
            self.pods.replaced(machine.ref, uid)
        machine.details["started"] = True
        machine.details["uid"] = uid

    async def _replace(
        self,
        machine: Machine,
        spec: SessionSpec,
        pod_body: dict[str, Any],
        secret_body: dict[str, Any],
        fence: Optional[dict[str, Any]],
        *,
        fresh: bool,
    ) -> str:
        """The Pod and what it needs made anew (see the module docs); the new Pod's uid. ``fresh``: the
        machine's first start, with no Pod seen: create first, and delete only what is already there."""
        secret = secret_name(spec.session_id)
        if fresh:
            await self._ensure_state_volume(machine, spec)
            # A Secret of this name is what an earlier start left (the claim expired mid-start, or the
            # Pod was deleted by hand): whatever else it left is replaced as a restart replaces it.
            fresh = await self.cluster.create_if_missing(Secret, secret_body) is not None
            if not fresh:
                await self.cluster.delete(Pod, machine.ref, wait=True)
                await self._recreate(Secret, secret, secret_body)
        else:
            await self.cluster.delete(Pod, machine.ref, wait=True)
            await self._ensure_state_volume(machine, spec)
            await self._recreate(Secret, secret, secret_body)
        dependents: list[tuple[Any, str]] = [(Secret, secret)]
        if await self._fence(spec, fence, fresh=fresh):
            dependents.append((NetworkPolicy, network_policy_name(spec.session_id)))
        if not fresh:
            pod = await self.cluster.create(Pod, pod_body)  # the old one was deleted first
        else:
            made = await self.cluster.create_if_missing(Pod, pod_body)
            # None: a Pod was made since provision saw none (another orchestrator racing this one).
            pod = made if made is not None else await self._recreate(Pod, machine.ref, pod_body, wait=True)
        assert pod.metadata is not None
        owner = {"apiVersion": "v1", "kind": "Pod", "name": machine.ref, "uid": str(pod.metadata.uid)}
        for kind, name in dependents:
            try:
                await self.cluster.merge_patch(
                    kind,
                    name,
                    {"metadata": {"ownerReferences": [owner_reference(owner)]}},
                    action="set the owner of",
                )
            except DriverError as exc:
                # The Pod runs; the object is still deleted by teardown or swept by sweep_orphans.
                log.warning("%s", exc)
        return str(pod.metadata.uid)

    async def _recreate(self, kind: type[T], name: str, body: dict[str, Any], *, wait: bool = False) -> T:
        """Delete the object of this name if there (``wait``: until it is gone), then create ``body``."""
        await self.cluster.delete(kind, name, wait=wait)
        return await self.cluster.create(kind, body)

    async def _ensure_state_volume(self, machine: Machine, spec: SessionSpec) -> None:
        """The state PVC for the new Pod, when the ``state_volume`` option is on: a kept one is the new
        Pod's only when it was restored (the old Pod must be gone by now, it may mount it)."""
        if self.options.pod.state_volume:
            await self._ensure_pvc(spec, fresh=not machine.details.get("restored"))

    async def _fence(self, spec: SessionSpec, fence: Optional[dict[str, Any]], *, fresh: bool) -> bool:
        """The session's NetworkPolicy made anew from ``fence``, or removed when ``fence`` is None; True
        when there is one. ``fresh``: create first (a ``409`` is a policy left behind), and without a
        policy read before deleting, so that a machine's first start sends no delete."""
        name = network_policy_name(spec.session_id)
        if fresh:
            if fence is not None:
                if await self.cluster.create_if_missing(NetworkPolicy, fence) is not None:
                    return True
            elif await self.cluster.get(NetworkPolicy, name) is None:
                return False
        # One is there, or may be: deleted and waited for, so that the one we make has a new uid.
        await self.cluster.delete(NetworkPolicy, name, wait=True)
        if fence is None:
            return False
        await self._create_network_policy(spec, fence)
        return True

    async def _create_network_policy(self, spec: SessionSpec, body: dict[str, Any]) -> None:
        """Create the session's NetworkPolicy. One of its name already there (made between the delete and
        this create, by an orchestrator racing this one) is read: this session's is given our rules,
        another session's is never touched."""
        if await self.cluster.create_if_missing(NetworkPolicy, body) is not None:
            return
        name = body["metadata"]["name"]
        current = await self.cluster.get(NetworkPolicy, name)
        if current is None:  # deleted again meanwhile
            await self.cluster.create(NetworkPolicy, body)
            return
        holder = self._identity(current)
        if holder is None:
            raise DriverError(f"networkpolicy {name} exists and is not one of ours")
        if holder.session_id != spec.session_id:
            raise name_taken(f"networkpolicy {name}", holder.session_id)
        # A merge patch replaces lists whole: the egress rules become exactly ours.
        await self.cluster.merge_patch(NetworkPolicy, name, {"spec": body["spec"]}, action="update")

    async def status(self, machine: Machine) -> WorkerStatus:
        pod = await self.cluster.get(Pod, machine.ref)
        if pod is None:
            if not machine.details.get("started") and not machine.details.get("adopted"):
                return WorkerStatus(WorkerState.STARTING, detail="not started")
            return WorkerStatus(WorkerState.MISSING, detail=f"pod {machine.ref} not found")
        return pod_status(pod, self.options.pod.container_name)

    def status_source(self, acceptor_id: str) -> PodInformer:
        """One list-and-watch of every Pod made for ``acceptor_id``, all outposts (:mod:`.informer`)."""
        selector = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_ACCEPTOR: label_value(acceptor_id)}
        self._informer = PodInformer(
            self.cluster,
            selector=selector,
            container_name=self.options.pod.container_name,
            tracker=self.pods,
        )
        return self._informer

    async def teardown(self, machine: Machine) -> None:
        self.pods.forget(machine.ref)
        await self.cluster.delete(Pod, machine.ref)
        await self.cluster.delete(Secret, secret_name(machine.session_id))
        await self.cluster.delete(NetworkPolicy, network_policy_name(machine.session_id))
        pvc = await self.cluster.get(PersistentVolumeClaim, pvc_name(machine.session_id))
        if pvc is not None and (pvc.get("metadata", {}).get("labels") or {}).get(LABEL_SNAPSHOT) != "true":
            await self.cluster.delete(PersistentVolumeClaim, pvc_name(machine.session_id))

    def _selector(self, acceptor_id: str, outpost_id: str, **extra: str) -> dict[str, Any]:
        return {
            LABEL_MANAGED_BY: MANAGED_BY,
            LABEL_ACCEPTOR: label_value(acceptor_id),
            LABEL_OUTPOST: label_value(outpost_id),
            **extra,
        }

    @staticmethod
    def _identity(obj: dict[str, Any]) -> Optional[SessionSpec]:
        meta = obj.get("metadata") or {}
        notes = meta.get("annotations") or {}
        labels = meta.get("labels") or {}
        session = notes.get(ANNOTATION_SESSION)
        outpost = notes.get(ANNOTATION_OUTPOST)
        acceptor = notes.get(ANNOTATION_ACCEPTOR)
        if not (session and outpost and acceptor):
            return None
        spec = SessionSpec(session_id=session, outpost_id=outpost, acceptor_id=acceptor)
        # The labels were selected on; annotations someone edited must not name another session.
        if labels.get(LABEL_SESSION) != label_value(session):
            return None
        return spec

    async def list_owned(self, acceptor_id: str, outpost_id: str) -> list[Machine]:
        if self._informer is not None:
            # Machines found here are adopted next, each session looking at its Pod's status at once:
            # with the watch's first listing on the board, they find it there instead of each reading
            # its Pod (a GET per Pod at every restart). Bounded: a watch that cannot list costs reads.
            await self._informer.first_listing(timeout=self.options.request_timeout)
        machines = []
        for pod in await self.cluster.list(Pod, self._selector(acceptor_id, outpost_id)):
            spec = self._identity(pod)
            meta = pod.get("metadata") or {}
            if spec is None or spec.acceptor_id != acceptor_id or spec.outpost_id != outpost_id:
                continue
            if meta.get("name") != pod_name(spec.session_id):
                continue
            machines.append(
                self._machine(
                    spec, _parse_time(meta.get("creationTimestamp")), adopted=True, uid=meta.get("uid")
                )
            )
        return machines

    # -- snapshots (the state PVC kept past its Pod) ---------------------------------------------------

    async def snapshot(self, machine: Machine) -> Snapshot:
        name = pvc_name(machine.session_id)
        if not self.options.pod.state_volume:
            raise DriverError(
                f"Could not snapshot session {machine.session_id}: the snapshot policy needs the kubernetes "
                "driver's state_volume option"
            )
        now = time.time()
        patch = {
            "metadata": {
                "labels": {LABEL_SNAPSHOT: "true"},
                "annotations": {
                    ANNOTATION_SUSPENDED_AT: datetime.datetime.fromtimestamp(
                        now, datetime.timezone.utc
                    ).strftime("%Y-%m-%dT%H:%M:%SZ")
                },
            }
        }
        kept = f"persistentvolumeclaim {name} as a snapshot"
        await self.cluster.merge_patch(PersistentVolumeClaim, name, patch, action="keep", what=kept)
        return Snapshot(machine.session_id, machine.outpost_id, machine.acceptor_id, now, name)

    async def restore(self, machine: Machine, snapshot: Snapshot) -> None:
        name = pvc_name(machine.session_id)
        if snapshot.ref != name or snapshot.session_id != machine.session_id:
            # The Pod mounts the PVC by its deterministic name: another session's volume cannot be mounted.
            raise DriverError(
                f"Could not restore snapshot {snapshot.ref} into session {machine.session_id}: it belongs to "
                f"session {snapshot.session_id}"
            )
        pvc = await self.cluster.get(PersistentVolumeClaim, name)
        if pvc is None or (pvc.get("metadata", {}).get("labels") or {}).get(LABEL_SNAPSHOT) != "true":
            raise DriverError(
                f"Could not restore snapshot {name}: no kept persistentvolumeclaim of that name"
            )
        # null removes the label: the PVC is the machine's again (no longer a snapshot).
        await self.cluster.merge_patch(
            PersistentVolumeClaim, name, {"metadata": {"labels": {LABEL_SNAPSHOT: None}}}, action="restore"
        )
        machine.details["restored"] = True

    async def list_snapshots(self, acceptor_id: str, outpost_id: str) -> list[Snapshot]:
        snapshots = []
        for pvc in await self.cluster.list(
            PersistentVolumeClaim, self._selector(acceptor_id, outpost_id, **{LABEL_SNAPSHOT: "true"})
        ):
            spec = self._identity(pvc)
            if spec is None or spec.acceptor_id != acceptor_id or spec.outpost_id != outpost_id:
                continue
            meta = pvc["metadata"]
            kept = (meta.get("annotations") or {}).get(ANNOTATION_SUSPENDED_AT) or meta.get(
                "creationTimestamp"
            )
            snapshots.append(
                Snapshot(spec.session_id, spec.outpost_id, spec.acceptor_id, _parse_time(kept), meta["name"])
            )
        return snapshots

    async def delete_snapshot(self, snapshot: Snapshot) -> None:
        pvc = await self.cluster.get(PersistentVolumeClaim, snapshot.ref)
        # Only while it is still a snapshot: a restored PVC is a live session's volume.
        if pvc is not None and (pvc.get("metadata", {}).get("labels") or {}).get(LABEL_SNAPSHOT) == "true":
            await self.cluster.delete(PersistentVolumeClaim, snapshot.ref)

    async def sweep_orphans(self, acceptor_id: str, outpost_id: str, live_sessions: Container[str]) -> int:
        """Token Secrets, NetworkPolicies, and state PVCs that are not snapshots, of sessions not live."""
        removed = 0
        selector = self._selector(acceptor_id, outpost_id)
        for kind in (Secret, NetworkPolicy, PersistentVolumeClaim):
            for obj in await self.cluster.list(kind, selector):
                spec = self._identity(obj)
                meta = obj["metadata"]
                if spec is None or spec.session_id in live_sessions:
                    continue
                if kind is PersistentVolumeClaim and (meta.get("labels") or {}).get(LABEL_SNAPSHOT) == "true":
                    continue  # snapshots have their own lifetime (list_snapshots / delete_snapshot)
                if await self.cluster.delete(kind, meta["name"]):
                    removed += 1
        return removed
