"""A Pod, as the cluster reports it, read as a :class:`WorkerStatus` (no client library).

One pure function, :func:`pod_status`, shared by the driver's direct read (:meth:`KubernetesDriver.status`)
and the Pod watch (:mod:`.informer`), so both say the same of the same Pod. Besides the phase and the
worker container's restarts and exit codes, it names why a Pod is not starting (docs/orchestrator.md,
"Fast failure"):

* a container waiting on a reason the kubelet keeps retrying (:data:`RETRIED_REASONS`: an image pull that
  failed, a container it could not create) is ``STARTING`` with that ``reason``: the registry may come back,
  a Secret may appear, so the orchestrator's ``--start-failure-grace`` decides (``ImagePullBackOff`` is
  reported as ``ErrImagePull``, the failure it backs off from: the kubelet alternates the two);
* one no retry can fix (:data:`FINAL_REASONS`: an image name that does not parse, ``imagePullPolicy:
  Never`` with no image on the node) is ``FAILED`` at once;
* a Pod the scheduler cannot place (condition ``PodScheduled=False``, reason ``Unschedulable``) is
  ``STARTING`` with reason ``Unschedulable`` (an autoscaler may still add a node: the grace decides).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from devin_outposts.orchestrator.drivers.base import WorkerState, WorkerStatus

#: Container ``waiting`` reasons the kubelet retries with a back-off: a start failure the grace judges.
RETRIED_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "RegistryUnavailable",
        "CreateContainerError",
        "CreateContainerConfigError",
        "RunContainerError",
        "PreStartHookError",
    }
)
#: The kubelet alternates between these two while it retries a pull: one reason for both, so that the
#: grace runs from the first failed pull instead of restarting at each alternation.
SAME_REASON = {"ImagePullBackOff": "ErrImagePull"}
#: Container ``waiting`` reasons no retry changes: the worker cannot start in this Pod.
FINAL_REASONS = frozenset({"InvalidImageName", "ErrImageNeverPull"})
UNSCHEDULABLE = "Unschedulable"
#: The longest scheduler or kubelet message kept in a status's detail (they list every node's taint).
MESSAGE_LIMIT = 200


def _short(message: Any) -> str:
    text = " ".join(str(message or "").split())
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


def _container(status: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    for container in status.get("containerStatuses") or []:
        if container.get("name") == name:
            found: Mapping[str, Any] = container
            return found
    return {}


def _unschedulable(status: Mapping[str, Any]) -> str:
    """The scheduler's message when it cannot place the Pod, else ``""``."""
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == UNSCHEDULABLE
        ):
            return _short(condition.get("message")) or UNSCHEDULABLE
    return ""


def pod_status(pod: Mapping[str, Any], container_name: str) -> WorkerStatus:
    """The status of the worker in ``pod`` (a Pod as a mapping), whose container is ``container_name``."""
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    ours = _container(status, container_name)
    restarts = int(ours.get("restartCount") or 0)
    state = ours.get("state") or {}
    waiting = state.get("waiting") or {}
    waiting_reason = waiting.get("reason") or ""
    if phase == "Succeeded":
        return WorkerStatus(WorkerState.EXITED, exit_code=0, restarts=restarts, detail=phase)
    if phase == "Failed":
        terminated = state.get("terminated") or (ours.get("lastState") or {}).get("terminated") or {}
        code = terminated.get("exitCode")
        reason = terminated.get("reason") or status.get("reason") or ""
        # A Pod failed without a container exit (evicted, deadline exceeded) still failed.
        return WorkerStatus(
            WorkerState.EXITED,
            exit_code=int(code) if code is not None else 1,
            restarts=restarts,
            detail=f"{phase} {reason}".strip(),
        )
    if phase == "Running" or phase == "Unknown":
        # After a restart in place, the code the last run exited with: the orchestrator ends the session
        # at once on some (9: this Pod cannot enforce the session's network policy) instead of waiting
        # for the restart limit.
        last = (ours.get("lastState") or {}).get("terminated") or {}
        code = last.get("exitCode") if restarts else None
        return WorkerStatus(
            WorkerState.RUNNING,
            exit_code=int(code) if code is not None else None,
            restarts=restarts,
            detail=f"{phase} {waiting_reason}".strip(),
        )
    detail = f"{phase} {waiting_reason}".strip()
    message = _short(waiting.get("message"))
    if waiting_reason in FINAL_REASONS or waiting_reason in RETRIED_REASONS:
        return WorkerStatus(
            WorkerState.FAILED if waiting_reason in FINAL_REASONS else WorkerState.STARTING,
            restarts=restarts,
            detail=f"{waiting_reason}: {message}" if message else detail,
            reason=SAME_REASON.get(waiting_reason, waiting_reason),
        )
    unschedulable = _unschedulable(status)
    if unschedulable:
        return WorkerStatus(
            WorkerState.STARTING, restarts=restarts, detail=unschedulable, reason=UNSCHEDULABLE
        )
    return WorkerStatus(WorkerState.STARTING, restarts=restarts, detail=detail)
