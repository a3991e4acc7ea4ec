"""What the podman driver keeps besides containers: state volumes, snapshot markers, token secrets.

:class:`PodmanVolumes` makes, lists and removes the state volumes and the snapshot markers (a snapshot is
its state volume plus an empty marker volume naming it); :class:`TokenSecrets` the podman secrets that
carry a connect token into a container. Both only narrow podman's listings with label filters and check
every object against its labels in Python (:func:`~.objects.owned_by`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from devin_outposts.orchestrator.drivers.base import (
    LABEL_ACCEPTOR,
    LABEL_MANAGED_BY,
    LABEL_OUTPOST,
    LABEL_SESSION,
    MANAGED_BY,
    DriverError,
    Machine,
    Snapshot,
    label_value,
)
from devin_outposts.orchestrator.drivers.podman.cli import PodmanCli
from devin_outposts.orchestrator.drivers.podman.objects import (
    KIND_SNAPSHOT,
    KIND_STATE,
    KIND_TOKEN,
    LABEL_IDS,
    LABEL_KIND,
    LABEL_STATE_VOLUME,
    MARKER_SUFFIX,
    TOKEN_SECRET,
    created_at_of,
    ids_of,
    labels_of,
    owned_by,
    owner_filters,
)

log = logging.getLogger(__name__)


def snapshot_of(marker: Mapping[str, Any]) -> Snapshot:
    """The snapshot a marker volume stands for (``ref``: the kept state volume)."""
    labels = labels_of(marker)
    ids = ids_of(labels)
    return Snapshot(
        session_id=ids["session_id"],
        outpost_id=ids["outpost_id"],
        acceptor_id=ids["acceptor_id"],
        created_at=created_at_of(labels),
        ref=labels.get(LABEL_STATE_VOLUME, ""),
    )


class PodmanVolumes:
    """The state volumes and snapshot markers, through :class:`PodmanCli`."""

    def __init__(self, cli: PodmanCli) -> None:
        self.cli = cli

    async def create(self, name: str, labels: Mapping[str, str]) -> None:
        args = ["volume", "create"]
        for key, value in labels.items():
            args += ["--label", f"{key}={value}"]
        await self.cli.check(*args, name, what=f"create volume {name}")

    async def remove(self, name: str) -> bool:
        """Remove volume ``name`` (gone already: False). Never ``--force``: that would also remove the
        containers using it; a volume still in use is an error."""
        result = await self.cli.run("volume", "rm", name, what=f"remove volume {name}")
        if result.code == 0:
            return True
        if result.not_found():
            return False
        raise DriverError(f"Could not remove volume {name}: {result.error_line()}")

    async def of_kind(self, acceptor_id: str, outpost_id: str, kind: str) -> list[dict[str, Any]]:
        listed = await self.cli.listing(
            ["volume", "ls", *owner_filters(acceptor_id, outpost_id, kind)], f"list {kind} volumes"
        )
        return [item for item in listed if owned_by(labels_of(item), acceptor_id, outpost_id, kind)]

    async def of_session(self, machine: Machine) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The state volumes and snapshot markers of ``machine``'s session (ours, for its acceptor and
        outpost), from one listing filtered on the session's label only (one filter: podman 4.3 ORs
        several), so that no other session's volume is looked at."""
        label = f"label={LABEL_SESSION}={label_value(machine.session_id)}"
        what = f"list the volumes of {machine.name}"
        listed = await self.cli.listing(["volume", "ls", "--filter", label], what)
        found: dict[str, list[dict[str, Any]]] = {KIND_STATE: [], KIND_SNAPSHOT: []}
        for item in listed:
            labels = labels_of(item)
            if ids_of(labels)["session_id"] != machine.session_id:
                continue
            for kind, items in found.items():
                if owned_by(labels, machine.acceptor_id, machine.outpost_id, kind):
                    items.append(item)
        return found[KIND_STATE], found[KIND_SNAPSHOT]

    async def states(self, acceptor_id: str, outpost_id: str) -> list[dict[str, Any]]:
        return await self.of_kind(acceptor_id, outpost_id, KIND_STATE)

    async def markers(self, acceptor_id: str, outpost_id: str) -> list[dict[str, Any]]:
        return await self.of_kind(acceptor_id, outpost_id, KIND_SNAPSHOT)

    async def kept(self, snapshot: Snapshot) -> dict[str, str]:
        """The labels of ``snapshot``'s state volume, after checking it is ours and still a snapshot."""
        volume = await self.cli.inspect("volume", snapshot.ref) if snapshot.ref else None
        labels = labels_of(volume) if volume is not None else {}
        if labels.get(LABEL_MANAGED_BY) != MANAGED_BY or labels.get(LABEL_KIND) != KIND_STATE:
            raise DriverError(f"snapshot {snapshot.ref or '(none)'} is not one of ours")
        if await self.cli.inspect("volume", snapshot.ref + MARKER_SUFFIX) is None:
            raise DriverError(f"snapshot {snapshot.ref} is gone (restored or deleted)")
        return labels

    async def list_snapshots(self, acceptor_id: str, outpost_id: str) -> list[Snapshot]:
        found = [snapshot_of(marker) for marker in await self.markers(acceptor_id, outpost_id)]
        return sorted((s for s in found if s.ref), key=lambda s: (s.created_at, s.ref))

    async def delete_snapshot(self, snapshot: Snapshot) -> None:
        if not snapshot.ref:
            return
        marker = await self.cli.inspect("volume", snapshot.ref + MARKER_SUFFIX)
        if marker is None:
            # Restored (the volume is a machine's now) or deleted already: nothing of the snapshot is left.
            return
        if labels_of(marker).get(LABEL_MANAGED_BY) != MANAGED_BY:
            raise DriverError(f"snapshot {snapshot.ref} is not one of ours")
        volume = await self.cli.inspect("volume", snapshot.ref)
        if volume is not None:
            labels = labels_of(volume)
            if labels.get(LABEL_MANAGED_BY) != MANAGED_BY or labels.get(LABEL_KIND) != KIND_STATE:
                raise DriverError(f"snapshot {snapshot.ref} is not one of ours")
            await self.remove(snapshot.ref)
        await self.remove(snapshot.ref + MARKER_SUFFIX)


class TokenSecrets:
    """The connect token's podman secrets: made for one ``podman create``, removed right after."""

    def __init__(self, cli: PodmanCli) -> None:
        self.cli = cli
        #: Secrets of ``podman create`` calls in progress (the sweep removes any other one).
        self.in_use: set[str] = set()

    async def create(self, name: str, token: str, labels: Mapping[str, str]) -> None:
        """A podman secret holding ``token``, read from stdin (never argv, never a file of ours)."""
        args = ["secret", "create", "--driver", "file"]
        for key in (LABEL_MANAGED_BY, LABEL_ACCEPTOR, LABEL_OUTPOST, LABEL_SESSION, LABEL_IDS):
            if key in labels:
                args += ["--label", f"{key}={labels[key]}"]
        args += ["--label", f"{LABEL_KIND}={KIND_TOKEN}", name, "-"]
        await self.cli.check(*args, what=f"create secret {name}", stdin=token.encode())

    async def remove(self, name: str) -> bool:
        """Remove secret ``name`` (gone already: False). Never raises: the sweep removes what is left."""
        try:
            result = await self.cli.run("secret", "rm", name, what=f"remove secret {name}")
        except DriverError as exc:
            log.warning("%s; the sweep removes it later", exc)
            return False
        if result.code != 0 and not result.not_found():
            log.warning(
                "Could not remove secret %s: %s; the sweep removes it later", name, result.error_line()
            )
        return result.code == 0

    async def sweep(self, acceptor_id: str, outpost_id: str) -> int:
        """Token secrets no ``podman create`` uses: an orchestrator died between making one and removing
        it. podman 4.3 lists secrets without their labels, so each candidate is inspected."""
        listed = await self.cli.check("secret", "ls", "--format", "{{.Name}}", what="list secrets")
        removed = 0
        for name in listed.stdout.split():
            if not TOKEN_SECRET.fullmatch(name) or name in self.in_use:
                continue
            found = await self.cli.inspect("secret", name)
            spec = found.get("Spec") if found is not None else None
            labels = labels_of(spec) if isinstance(spec, dict) else {}
            if owned_by(labels, acceptor_id, outpost_id, KIND_TOKEN) and await self.remove(name):
                removed += 1
        return removed
