"""The objects the ``kubernetes`` driver makes for a session, as plain mappings (no client library).

Kept apart from the client so that a role, a docs example or a test can render exactly what the driver
would send (:func:`render_session_manifests`) without ``lightkube`` installed and without a cluster.

Per session (names from :func:`~..base.machine_name`, at most 63 characters, as Cognition's operator):

* ``outpost-worker-<id>-<hash>``: the Pod, ``restartPolicy: OnFailure``, running the worker in
  direct-serve mode. Its only credential, the connect token, comes from the Secret through
  ``secretKeyRef``, so the token is in no Pod spec (``kubectl get pod -o yaml`` shows none);
* ``outpost-token-<id>-<hash>``: the Secret (key ``token``), owned by the Pod once the Pod exists, so
  the cluster collects it with the Pod;
* ``outpost-state-<id>-<hash>``: the PVC (``state_volume``), mounted at ``/var/lib/devin-worker``; it
  is never owned by the Pod, because a suspended session's snapshot *is* this PVC outliving its Pod.

The Pod is layered like the operator's: the user's base template, then ours (names, labels, the
container's command, environment and volume), then the user's overrides (image, command, args, labels,
annotations, resources). The four identity labels cannot be overridden: :meth:`list_owned` and the
garbage collection find machines by them.
"""

from __future__ import annotations

import base64
import copy
import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from devin_outposts.orchestrator.drivers.base import (
    LABEL_ACCEPTOR,
    LABEL_MANAGED_BY,
    LABEL_OUTPOST,
    LABEL_SESSION,
    MACHINE_WORKDIR,
    DriverError,
    SessionSpec,
    WorkerLaunch,
    machine_name,
)

POD_PREFIX = "outpost-worker"
SECRET_PREFIX = "outpost-token"  # noqa: S105 - a name prefix, not a secret
PVC_PREFIX = "outpost-state"
SECRET_KEY = "token"  # noqa: S105 - the key in the Secret, not a secret
DEFAULT_CONTAINER = "devin-worker"
#: The worker's data directory inside the Pod; the PVC is mounted here (the operator's path).
DATA_DIR = "/var/lib/devin-worker"
CACHE_DIR = f"{DATA_DIR}/cache"
#: The sessions' working directory: on the PVC by default, so a snapshot keeps the repos too.
DEFAULT_WORKDIR = f"{DATA_DIR}/{MACHINE_WORKDIR}"
STATE_VOLUME = "devin-worker-state"
ENV_TOKEN = "DEVIN_REMOTE_SESSION_TOKEN"  # noqa: S105 - a variable name

#: Full (unsanitised) ids: label values may carry a hash suffix, these are what the driver reads back.
ANNOTATION_OUTPOST = "outposts.cognition.com/pool-id"
ANNOTATION_SESSION = "outposts.devin.ai/session-id"
ANNOTATION_ACCEPTOR = "outposts.devin.ai/acceptor-id"
ANNOTATION_SUSPENDED_AT = "outposts.cognition.com/suspended-at"
#: On a PVC kept by :meth:`snapshot` (and removed by :meth:`restore`).
LABEL_SNAPSHOT = "outposts.devin.ai/snapshot"
IDENTITY_LABELS = (LABEL_MANAGED_BY, LABEL_SESSION, LABEL_OUTPOST, LABEL_ACCEPTOR)
OVERRIDE_KEYS = ("image", "command", "args", "labels", "annotations", "resources")
OWNER_KEYS = ("apiVersion", "kind", "name", "uid")


@dataclass(frozen=True)
class PodSettings:
    """The options that shape the Pod (checked by the driver's option table)."""

    image: Optional[str] = None
    container_name: str = DEFAULT_CONTAINER
    #: A PodTemplateSpec mapping (``metadata`` and ``spec``): layer 1.
    template: Mapping[str, Any] = field(default_factory=dict)
    #: Layer 3: the keys of :data:`OVERRIDE_KEYS`.
    overrides: Mapping[str, Any] = field(default_factory=dict)
    workdir: str = DEFAULT_WORKDIR
    state_volume: bool = False
    volume_size: str = "20Gi"
    storage_class: Optional[str] = None
    #: An owner reference (``apiVersion``, ``kind``, ``name``, ``uid``) for the Pods and PVCs, e.g. the
    #: orchestrator's Deployment; never the orchestrator's own Pod, which a restart replaces.
    owner: Optional[Mapping[str, str]] = None
    worker_command: tuple[str, ...] = ("devin-outposts",)

    def effective_image(self) -> Optional[str]:
        override = self.overrides.get("image")
        if override:
            return str(override)
        if self.image:
            return self.image
        container = _find_container(
            self.template.get("spec", {}).get("containers") or [], self.container_name
        )
        image = container.get("image") if container else None
        return str(image) if image else None


def pod_name(session_id: str) -> str:
    return machine_name(POD_PREFIX, session_id)


def secret_name(session_id: str) -> str:
    return machine_name(SECRET_PREFIX, session_id)


def pvc_name(session_id: str) -> str:
    return machine_name(PVC_PREFIX, session_id)


def identity_annotations(spec: SessionSpec) -> dict[str, str]:
    return {
        ANNOTATION_OUTPOST: spec.outpost_id,
        ANNOTATION_SESSION: spec.session_id,
        ANNOTATION_ACCEPTOR: spec.acceptor_id,
    }


def owner_reference(owner: Mapping[str, str], *, controller: bool = False) -> dict[str, Any]:
    ref: dict[str, Any] = {key: owner[key] for key in OWNER_KEYS}
    # blockOwnerDeletion needs "delete" on the owner too, which our RBAC does not grant: leave it off.
    if controller:
        ref["controller"] = True
    return ref


def _metadata(name: str, namespace: str, spec: SessionSpec) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": spec.labels(),
        "annotations": identity_annotations(spec),
    }


def render_secret(namespace: str, spec: SessionSpec, token: str) -> dict[str, Any]:
    """The token Secret. Its owner (the Pod) is added once the Pod exists and has a uid."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(secret_name(spec.session_id), namespace, spec),
        "type": "Opaque",
        # data, not stringData: what the API server stores and returns, so a read compares equal.
        "data": {SECRET_KEY: base64.b64encode(token.encode()).decode()},
    }


def render_pvc(namespace: str, spec: SessionSpec, settings: PodSettings) -> dict[str, Any]:
    metadata = _metadata(pvc_name(spec.session_id), namespace, spec)
    if settings.owner:
        metadata["ownerReferences"] = [owner_reference(settings.owner)]
    pvc_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": settings.volume_size}},
    }
    if settings.storage_class:
        pvc_spec["storageClassName"] = settings.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": pvc_spec}


def _find_container(containers: list[Any], name: str) -> Optional[dict[str, Any]]:
    for container in containers:
        if isinstance(container, dict) and container.get("name") == name:
            return container
    return None


def render_pod(
    namespace: str, spec: SessionSpec, launch: WorkerLaunch, settings: PodSettings
) -> dict[str, Any]:
    """The session Pod: base template, then ours, then the overrides."""
    template = copy.deepcopy(dict(settings.template))
    metadata: dict[str, Any] = dict(template.get("metadata") or {})
    pod_spec: dict[str, Any] = dict(template.get("spec") or {})

    # Layer 2: ours.
    labels = {**(metadata.get("labels") or {}), **spec.labels()}
    annotations = {**(metadata.get("annotations") or {}), **identity_annotations(spec)}
    metadata = {
        **{k: v for k, v in metadata.items() if k not in ("name", "generateName", "namespace")},
        "name": pod_name(spec.session_id),
        "namespace": namespace,
        "labels": labels,
        "annotations": annotations,
    }
    if settings.owner:
        metadata["ownerReferences"] = [owner_reference(settings.owner)]
    pod_spec["restartPolicy"] = "OnFailure"
    # The session runs code Devin writes: it gets no Kubernetes API credential unless the template asks.
    pod_spec.setdefault("automountServiceAccountToken", False)

    containers: list[Any] = list(pod_spec.get("containers") or [])
    container = _find_container(containers, settings.container_name)
    if container is None:
        container = {"name": settings.container_name}
        containers.append(container)
    if settings.image:
        container["image"] = settings.image
    container["command"] = list(settings.worker_command)
    container["args"] = launch.arguments()
    # No workingDir: a runtime may refuse to start in a directory that is not there yet (podman does; on
    # a fresh PVC it is not), and the worker makes DEVIN_WORKER_WORKDIR itself and runs sessions there.

    ours = dict(launch.environment())
    ours.pop(ENV_TOKEN)  # the one secret: referenced, never written into the Pod
    ours.setdefault("DEVIN_WORKER_CACHE_DIR", CACHE_DIR)
    ours["DEVIN_WORKER_WORKDIR"] = settings.workdir
    env: list[dict[str, Any]] = [
        entry for entry in container.get("env") or [] if entry.get("name") not in {*ours, ENV_TOKEN}
    ]
    env.append(
        {
            "name": ENV_TOKEN,
            "valueFrom": {"secretKeyRef": {"name": secret_name(spec.session_id), "key": SECRET_KEY}},
        }
    )
    env.extend({"name": key, "value": value} for key, value in sorted(ours.items()))
    container["env"] = env

    if settings.state_volume:
        volumes = [v for v in pod_spec.get("volumes") or [] if v.get("name") != STATE_VOLUME]
        volumes.append(
            {"name": STATE_VOLUME, "persistentVolumeClaim": {"claimName": pvc_name(spec.session_id)}}
        )
        pod_spec["volumes"] = volumes
        mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") != STATE_VOLUME]
        mounts.append({"name": STATE_VOLUME, "mountPath": DATA_DIR})
        if not (settings.workdir == DATA_DIR or settings.workdir.startswith(DATA_DIR + "/")):
            # A workdir elsewhere still lives on the PVC (at the same place, repos/), or a snapshot
            # would keep the state dir without the repos.
            mounts.append({"name": STATE_VOLUME, "mountPath": settings.workdir, "subPath": MACHINE_WORKDIR})
        container["volumeMounts"] = mounts

    # Layer 3: the overrides have the final say (identity labels excepted, refused with the options).
    overrides = settings.overrides
    for key in ("image", "command", "args", "resources"):
        if overrides.get(key) is not None:
            container[key] = copy.deepcopy(overrides[key])
    metadata["labels"].update(overrides.get("labels") or {})
    metadata["annotations"].update(overrides.get("annotations") or {})

    if not container.get("image"):
        raise DriverError(
            "kubernetes driver: no worker image (set the image option or the template's container)"
        )
    pod_spec["containers"] = containers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def render_lease(
    namespace: str, name: str, identity: str, duration: int, now: datetime.datetime
) -> dict[str, Any]:
    stamp = micro_time(now)
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LABEL_MANAGED_BY: "devin-outposts-orchestrator"},
        },
        "spec": {
            "holderIdentity": identity,
            "leaseDurationSeconds": duration,
            "acquireTime": stamp,
            "renewTime": stamp,
            "leaseTransitions": 0,
        },
    }


def micro_time(moment: datetime.datetime) -> str:
    """A Kubernetes MicroTime (RFC 3339, microseconds, UTC)."""
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
