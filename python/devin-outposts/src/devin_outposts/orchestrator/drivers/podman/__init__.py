"""The ``podman`` driver: each session's worker runs in a container of its own, from an image with our
worker inside (python/devin-outposts/Containerfile; docs/orchestrator-podman.md).

What a machine is, in podman objects (every one labelled with :meth:`SessionSpec.labels` plus ours):

* a **state volume** ``outpost-state-<id>-<hash>-<8 hex>`` mounted at ``/var/lib/devin-worker``: the worker's
  data dir (``worker/``: its binary cache and the session's state dir) and ``repos/``, the worker's
  working directory, which are what a snapshot keeps. The random suffix lets a fresh machine of a session
  live beside a snapshot of the same session;
* a **container** ``outpost-worker-<id>-<hash>`` (:func:`machine_name`) that runs
  ``devin-outposts worker start --session=<id>`` in direct-serve mode, with podman's ``--init`` as PID 1
  (it forwards signals and reaps what the session's commands leave behind). Its labels name its state
  volume, so a restarted orchestrator finds the whole machine with one label query.

:meth:`PodmanDriver.provision` makes both, the container created but not started; podman cannot change a
container's environment, so :meth:`PodmanDriver.start` replaces it by one with the launch's environment.
The connect token is in no container configuration (``podman inspect`` shows every environment
variable): it becomes a podman secret (from stdin), mounted 0400 for the worker's uid and removed as soon
as ``podman create`` has copied it; a ``/bin/sh`` entrypoint hands it to the worker. The rest of the
environment reaches podman through ``--env-file`` (0600, in the orchestrator's private state dir, removed
as soon as ``podman create`` returns). podman itself runs with our environment minus every ``DEVIN_*``
variable: the account token never reaches podman, and so never a container.

**Locked down.** Every container runs with ``no-new-privileges`` and ``--cap-drop ALL`` (``cap_add`` gives
back what it names), and with default limits (2 CPUs, 4 GiB, 4096 processes; see :mod:`.options`).

**Snapshots.** Podman can neither rename a volume nor change its labels, so a snapshot is the state volume
itself plus a *marker*: an empty volume ``<state volume>-snapshot`` labelled ``kind=snapshot`` that names
it. Teardown keeps every state volume a marker names; :meth:`PodmanDriver.restore` re-creates the new
machine's container on the kept volume, then drops the marker and the machine's fresh volume; deleting a
snapshot removes both. Nothing is copied, whatever the size of ``repos/``.

**Status.** :meth:`PodmanDriver.status_source` follows every container of an acceptor id with one
``podman events`` child and a ``podman ps`` every ``reconcile_interval`` seconds (:mod:`.events`);
:meth:`PodmanDriver.status` (one ``podman inspect``) stays for polling and adoption. A worker that cannot
start (exit 125-127, a ``podman start`` the runtime refused) is ``FAILED`` with a reason; an image that
cannot be pulled fails the provision with one (:func:`.objects.failure_of`).
"""

from __future__ import annotations

from devin_outposts.orchestrator.drivers.podman.driver import PodmanDriver
from devin_outposts.orchestrator.drivers.podman.objects import DATA_DIR, LABEL_KIND, MOUNT, WORKDIR
from devin_outposts.orchestrator.drivers.podman.options import DEFAULT_IMAGE, DEFAULT_LIMITS, OPTIONS, Limits

__all__ = [
    "DATA_DIR",
    "DEFAULT_IMAGE",
    "DEFAULT_LIMITS",
    "LABEL_KIND",
    "MOUNT",
    "OPTIONS",
    "WORKDIR",
    "Limits",
    "PodmanDriver",
]
