"""The ``kubernetes`` driver: a Pod and a Secret per session, as Cognition's operator makes them (and a
NetworkPolicy for a session whose network policy is enabled).

:mod:`.manifests` renders the objects and needs no client library, so :func:`render_session_manifests`
works where ``lightkube`` (the ``kubernetes`` extra) is not installed; :class:`KubernetesDriver` and
:class:`LeaseLock` load it on first use. The modules:

* :mod:`.options`: the driver's option table and its checks (no client library);
* :mod:`.manifests`: the Secret, PVC, Pod and Lease as plain mappings (no client library);
* :mod:`.network_policy`: the session's NetworkPolicy, what of its network policy the API can say (no
  client library);
* :mod:`.render`: :func:`render_session_manifests`, for the role, docs examples and tests;
* :mod:`.cluster`: the lightkube client in one namespace, its failures as one-line driver errors;
* :mod:`.lease`: leader election through a Lease;
* :mod:`.pod_status`: a Pod read as a worker's status, start failures named (no client library);
* :mod:`.informer`: one list-and-watch of the Pods' statuses, the driver's status source;
* :mod:`.driver`: :class:`KubernetesDriver`, what each driver call does to the cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from devin_outposts.orchestrator.drivers.kubernetes.manifests import PodSettings
from devin_outposts.orchestrator.drivers.kubernetes.render import render_session_manifests

if TYPE_CHECKING:
    from devin_outposts.orchestrator.drivers.kubernetes.driver import KubernetesDriver
    from devin_outposts.orchestrator.drivers.kubernetes.lease import LeaseLock

__all__ = ["KubernetesDriver", "LeaseLock", "PodSettings", "render_session_manifests"]


def __getattr__(name: str) -> Any:
    if name == "KubernetesDriver":
        from devin_outposts.orchestrator.drivers.kubernetes.driver import KubernetesDriver

        return KubernetesDriver
    if name == "LeaseLock":
        from devin_outposts.orchestrator.drivers.kubernetes.lease import LeaseLock

        return LeaseLock
    raise AttributeError(name)
