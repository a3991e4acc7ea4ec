"""The ``kubernetes`` driver's options: one table, checked before any claim.

Options come as a mapping (``--driver-config FILE`` in JSON or YAML, ``--driver-opt KEY=VALUE``), so a
value may be text where a number or a boolean is meant; each parser accepts both. An unknown key or a
bad value is a one-line :class:`DriverError` naming the key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional

from devin_outposts.orchestrator.drivers.base import DriverError
from devin_outposts.orchestrator.drivers.kubernetes.manifests import (
    DEFAULT_CONTAINER,
    DEFAULT_WORKDIR,
    IDENTITY_LABELS,
    OVERRIDE_KEYS,
    OWNER_KEYS,
    PodSettings,
)


def _text(key: str, value: Any) -> str:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool) or not str(value).strip():
        raise DriverError(f"kubernetes driver option {key} must be non-empty text")
    return str(value).strip()


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise DriverError(f"kubernetes driver option {key} must be true or false, got {value!r}")


def _seconds(key: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise DriverError(
            f"kubernetes driver option {key} must be a number of seconds, got {value!r}"
        ) from None
    if isinstance(value, bool) or number <= 0:
        raise DriverError(f"kubernetes driver option {key} must be a positive number of seconds")
    return number


def _mapping(key: str, value: Any) -> Mapping[str, Any]:
    if isinstance(value, str):
        # --driver-opt KEY=VALUE gives text: a JSON object is accepted there.
        try:
            value = json.loads(value)
        except ValueError:
            raise DriverError(
                f"kubernetes driver option {key} must be a mapping (a JSON object as text)"
            ) from None
    if not isinstance(value, Mapping):
        raise DriverError(f"kubernetes driver option {key} must be a mapping, got {type(value).__name__}")
    return value


def _template(key: str, value: Any) -> Mapping[str, Any]:
    template = _mapping(key, value)
    unknown = set(template) - {"metadata", "spec"}
    if unknown:
        raise DriverError(
            f"kubernetes driver option {key} is a PodTemplateSpec: unknown key {sorted(unknown)[0]}"
        )
    spec = template.get("spec") or {}
    if not isinstance(spec, Mapping) or not isinstance(spec.get("containers") or [], list):
        raise DriverError(f"kubernetes driver option {key}: spec.containers must be a list")
    if "restartPolicy" in spec and spec["restartPolicy"] != "OnFailure":
        # The orchestrator counts the Pod's own restarts (restarts_in_place); another policy breaks that.
        raise DriverError(f"kubernetes driver option {key}: spec.restartPolicy must be OnFailure or unset")
    return template


def _overrides(key: str, value: Any) -> Mapping[str, Any]:
    overrides = _mapping(key, value)
    for name in overrides:
        if name not in OVERRIDE_KEYS:
            raise DriverError(
                f"kubernetes driver option {key}: unknown key {name} (one of {', '.join(OVERRIDE_KEYS)})"
            )
    for name in ("labels", "annotations", "resources"):
        if name in overrides and not isinstance(overrides[name], Mapping):
            raise DriverError(f"kubernetes driver option {key}.{name} must be a mapping")
    for name in ("command", "args"):
        if name in overrides and not (
            isinstance(overrides[name], list) and all(isinstance(x, str) for x in overrides[name])
        ):
            raise DriverError(f"kubernetes driver option {key}.{name} must be a list of strings")
    for label in overrides.get("labels") or {}:
        if label in IDENTITY_LABELS:
            # list_owned and the garbage collection find sessions' objects by these.
            raise DriverError(f"kubernetes driver option {key}.labels may not set {label}")
    return overrides


def _owner(key: str, value: Any) -> Mapping[str, str]:
    owner = _mapping(key, value)
    for name in owner:
        if name not in OWNER_KEYS:
            raise DriverError(f"kubernetes driver option {key}: unknown key {name}")
    missing = [name for name in ("apiVersion", "kind", "name") if not owner.get(name)]
    if missing:
        raise DriverError(f"kubernetes driver option {key} needs {missing[0]}")
    if owner.get("kind") == "Pod":
        # Session Pods must outlive the orchestrator's Pod (a restart adopts them).
        raise DriverError(
            f"kubernetes driver option {key}: a Pod cannot own session objects; use its Deployment"
        )
    return {name: str(owner[name]) for name in owner}


@dataclass(frozen=True)
class KubernetesOptions:
    pod: PodSettings
    namespace: Optional[str] = None
    kubeconfig: Optional[str] = None
    context: Optional[str] = None
    leader_election: bool = True
    lease_name: Optional[str] = None
    lease_duration: float = 15.0
    lease_renew_interval: float = 5.0
    delete_timeout: float = 120.0
    request_timeout: float = 30.0


_TABLE: dict[str, Callable[[str, Any], Any]] = {
    "namespace": _text,
    "kubeconfig": _text,
    "context": _text,
    "image": _text,
    "container_name": _text,
    "pod_template": _template,
    "overrides": _overrides,
    "workdir": _text,
    "state_volume": _bool,
    "volume_size": _text,
    "storage_class": _text,
    "owner": _owner,
    "leader_election": _bool,
    "lease_name": _text,
    "lease_duration": _seconds,
    "lease_renew_interval": _seconds,
    "delete_timeout": _seconds,
    "request_timeout": _seconds,
}
OPTION_NAMES = tuple(_TABLE)


def parse_options(
    options: Mapping[str, Any], worker_command: tuple[str, ...] = ("devin-outposts",)
) -> KubernetesOptions:
    values: dict[str, Any] = {}
    for key, raw in options.items():
        parse = _TABLE.get(key)
        if parse is None:
            raise DriverError(f"unknown kubernetes driver option {key} (known: {', '.join(OPTION_NAMES)})")
        if raw is None:
            continue
        values[key] = parse(key, raw)
    workdir = values.get("workdir", DEFAULT_WORKDIR)
    if not workdir.startswith("/"):
        raise DriverError("kubernetes driver option workdir must be an absolute path")
    pod = PodSettings(
        image=values.get("image"),
        container_name=values.get("container_name", DEFAULT_CONTAINER),
        template=values.get("pod_template", {}),
        overrides=values.get("overrides", {}),
        workdir=workdir,
        state_volume=values.get("state_volume", False),
        volume_size=values.get("volume_size", "20Gi"),
        storage_class=values.get("storage_class"),
        owner=values.get("owner"),
        worker_command=worker_command,
    )
    if not pod.effective_image():
        raise DriverError(
            "kubernetes driver option image is required (or the pod_template's container image)"
        )
    parsed = KubernetesOptions(
        pod=pod,
        namespace=values.get("namespace"),
        kubeconfig=values.get("kubeconfig"),
        context=values.get("context"),
        leader_election=values.get("leader_election", True),
        lease_name=values.get("lease_name"),
        lease_duration=values.get("lease_duration", 15.0),
        lease_renew_interval=values.get("lease_renew_interval", 5.0),
        delete_timeout=values.get("delete_timeout", 120.0),
        request_timeout=values.get("request_timeout", 30.0),
    )
    if parsed.lease_renew_interval >= parsed.lease_duration:
        raise DriverError("kubernetes driver option lease_renew_interval must be shorter than lease_duration")
    return parsed
