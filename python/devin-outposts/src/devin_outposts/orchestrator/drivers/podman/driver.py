"""The ``podman`` driver's class: machines (a state volume and a container) and snapshots, in podman.

See the package's docstring (:mod:`devin_outposts.orchestrator.drivers.podman`) and
docs/orchestrator-podman.md for what a machine is and how it is locked down.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

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
from devin_outposts.orchestrator.drivers.podman.cli import PodmanCli
from devin_outposts.orchestrator.drivers.podman.objects import (
    DATA_DIR,
    KIND_MACHINE,
    KIND_SNAPSHOT,
    KIND_STATE,
    KIND_TOKEN,
    LABEL_CREATED,
    LABEL_IDS,
    LABEL_KIND,
    LABEL_STATE_VOLUME,
    MARKER_SUFFIX,
    MOUNT,
    TOKEN_ENTRYPOINT,
    TOKEN_SECRET,
    TOKEN_SECRET_PREFIX,
    TOKEN_TARGET,
    TOKEN_VARIABLE,
    WORKDIR,
    created_at_of,
    env_file_text,
    ids_label,
    ids_of,
    labels_of,
    our_labels,
    owned_by,
    owner_filters,
)
from devin_outposts.orchestrator.drivers.podman.settings import BUILTIN_NETWORKS, Settings
from devin_outposts.worker.paths import make_private_dir

log = logging.getLogger(__name__)


class PodmanDriver(Driver):
    name = "podman"

    def __init__(self, root: Path, settings: Optional[Settings] = None) -> None:
        settings = settings or Settings()
        self.root = root
        self.env_dir = root / "env"
        self.settings = settings
        self.image = settings.image
        self.cli = PodmanCli(settings.podman, settings.command_timeout)
        #: Env files of ``podman create`` calls in progress (the sweep removes any other one).
        self._env_files_in_use: set[Path] = set()
        #: Token secrets of ``podman create`` calls in progress (the sweep removes any other one).
        self._secrets_in_use: set[str] = set()
        #: The uid the image's worker runs as (the owner of the token file in the container), once known.
        self._uid: Optional[int] = None

    @classmethod
    def from_options(cls, context: DriverContext, options: Mapping[str, Any]) -> PodmanDriver:
        return cls(context.state_dir / cls.name, Settings.from_options(options, context.worker_command))

    @property
    def _grace(self) -> str:
        """The stop grace as podman's whole seconds."""
        return str(max(1, round(self.settings.stop_grace)))

    # --- start-up ----------------------------------------------------------------------------------

    async def check(self) -> None:
        result = await self.cli.run("version", "--format", "json", what="report its version")
        if result.code != 0:
            raise DriverError(f"podman is not usable: {result.error_line()}")
        exists = await self.cli.run("image", "exists", self.image, what=f"look for image {self.image}")
        if exists.code == 1:
            raise DriverError(
                f"podman image {self.image} not found: build it (python/devin-outposts/Containerfile) "
                "or pull it, or set the driver option image"
            )
        if exists.code != 0:
            raise DriverError(f"Could not look for podman image {self.image}: {exists.error_line()}")
        network = self.settings.network
        if network and network not in BUILTIN_NETWORKS and ":" not in network:
            found = await self.cli.run("network", "exists", network, what=f"look for network {network}")
            if found.code != 0:
                raise DriverError(f"podman network {network} not found (driver option network)")
        try:
            make_private_dir(self.root)
            make_private_dir(self.env_dir)
        except OSError as exc:
            raise DriverError(f"cannot use {self.root}: {exc}") from exc
        await self._worker_uid()

    async def _worker_uid(self) -> int:
        """The uid the image's worker runs as (``user``, else the image's own user): the owner of the
        token file in its containers. Asked of the image once, in a container as locked down as theirs."""
        if self._uid is None:
            args = ["run", "--rm", "--network", "none", *self._lockdown(), "--entrypoint", "id"]
            if self.settings.user:
                args += ["--user", self.settings.user]
            what = f"find the user of image {self.image}"
            result = await self.cli.check(*args, self.image, "-u", what=what)
            try:
                self._uid = int(result.stdout.strip())
            except ValueError:
                raise DriverError(f"Could not {what}: id -u printed {result.stdout.strip()[:80]!r}") from None
        return self._uid

    def _lockdown(self) -> list[str]:
        """What every container of ours runs with: no new privileges (setuid binaries grant nothing) and
        no capability but those ``cap_add`` names."""
        args = ["--security-opt", "no-new-privileges", "--cap-drop", "ALL"]
        for capability in self.settings.cap_add:
            args += ["--cap-add", capability]
        return args

    # --- machines ----------------------------------------------------------------------------------

    def _create_arguments(
        self,
        name: str,
        labels: Mapping[str, str],
        volume: str,
        session_id: str,
        launch: Optional[tuple[Path, str, int]] = None,
    ) -> list[str]:
        """``podman create`` for a machine's container; ``launch``: its env file, the secret holding the
        connect token, and the uid that reads it."""
        settings = self.settings
        args = ["create", "--name", name, "--pull", "missing"]
        for key, value in labels.items():
            args += ["--label", f"{key}={value}"]
        args += ["--volume", f"{volume}:{MOUNT}", "--workdir", WORKDIR]
        # Stopping waits this long after SIGTERM before SIGKILL (the worker drains on the first TERM).
        args += ["--stop-timeout", self._grace, *self._lockdown()]
        if settings.init:
            args.append("--init")
        if settings.network:
            args += ["--network", settings.network]
        if settings.user:
            args += ["--user", settings.user]
        args += settings.limits.arguments()
        if launch is not None:
            env_file, secret, uid = launch
            args += ["--env-file", str(env_file)]
            # A file only the worker's user reads, never the container's environment (which `podman
            # inspect` shows); the entrypoint hands it to the worker.
            args += ["--secret", f"{secret},type=mount,target={TOKEN_TARGET},uid={uid},mode=0400"]
        entrypoint = ["/bin/sh", "-c", TOKEN_ENTRYPOINT, "devin-outposts-session", *settings.worker_command]
        args += ["--entrypoint", json.dumps(entrypoint), self.image]
        args += WorkerLaunch(session_id, "", "").arguments()
        return args

    async def provision(self, spec: SessionSpec) -> Machine:
        name = machine_name("outpost-worker", spec.session_id)
        existing = await self.cli.inspect("container", name)
        if existing is not None:
            labels = labels_of(existing)
            if labels.get(LABEL_MANAGED_BY) != MANAGED_BY or labels.get(LABEL_KIND) != KIND_MACHINE:
                raise DriverError(f"container {name} exists and is not one of ours")
            owner = ids_of(labels)
            if owner["session_id"] != spec.session_id:
                raise name_taken(f"container {name}", owner["session_id"])
            if (owner["acceptor_id"], owner["outpost_id"]) != (spec.acceptor_id, spec.outpost_id):
                # Another orchestrator's machine for this session (names are per host, not per acceptor):
                # never adopted here, as its worker may still serve the session with that one's token.
                raise DriverError(
                    f"container {name} belongs to acceptor {owner['acceptor_id']} on outpost "
                    f"{owner['outpost_id']}"
                )
            return self._machine(name, labels, str(existing.get("ImageName") or self.image))
        created = round(time.time(), 3)  # what the label keeps
        ids = ids_label(spec.session_id, spec.outpost_id, spec.acceptor_id)
        common = {**spec.labels(), LABEL_IDS: ids, LABEL_CREATED: f"{created:.3f}"}
        volume = f"{machine_name('outpost-state', spec.session_id, limit=54)}-{secrets.token_hex(4)}"
        await self._create_volume(volume, {**common, LABEL_KIND: KIND_STATE})
        labels = {**common, LABEL_KIND: KIND_MACHINE, LABEL_STATE_VOLUME: volume}
        try:
            await self.cli.check(
                *self._create_arguments(name, labels, volume, spec.session_id, None),
                what=f"create container {name}",
            )
        except DriverError:
            with contextlib.suppress(DriverError):
                await self._remove_volume(volume)
            raise
        return self._machine(name, labels)

    def _machine(self, name: str, labels: Mapping[str, str], image: Optional[str] = None) -> Machine:
        ids = ids_of(labels)
        return Machine(
            name=name,
            session_id=ids["session_id"],
            outpost_id=ids["outpost_id"],
            acceptor_id=ids["acceptor_id"],
            created_at=created_at_of(labels),
            ref=name,
            # The image the container was made from: after an upgrade it may differ from the option.
            details={"volume": labels.get(LABEL_STATE_VOLUME, ""), "image": image or self.image},
        )

    async def _create_volume(self, name: str, labels: Mapping[str, str]) -> None:
        args = ["volume", "create"]
        for key, value in labels.items():
            args += ["--label", f"{key}={value}"]
        await self.cli.check(*args, name, what=f"create volume {name}")

    async def _remove_volume(self, name: str) -> bool:
        """Remove volume ``name`` (gone already: False). Never ``--force``: that would also remove the
        containers using it; a volume still in use is an error."""
        result = await self.cli.run("volume", "rm", name, what=f"remove volume {name}")
        if result.code == 0:
            return True
        if result.not_found():
            return False
        raise DriverError(f"Could not remove volume {name}: {result.error_line()}")

    async def _machine_container(self, machine: Machine) -> dict[str, Any]:
        found = await self.cli.inspect("container", machine.name)
        if found is None:
            raise DriverError(f"machine {machine.name} does not exist (no container)")
        labels = labels_of(found)
        if labels.get(LABEL_MANAGED_BY) != MANAGED_BY or labels.get(LABEL_KIND) != KIND_MACHINE:
            raise DriverError(f"container {machine.name} is not one of ours")
        return found

    async def _stop_and_remove(self, name: str) -> None:
        """Stop the worker (SIGTERM twice: the first drains, the second stops its devin-remote at once;
        SIGKILL after the grace) and remove the container. Gone already: nothing to do."""
        await self.cli.run("kill", "--signal", "TERM", name, what=f"signal container {name}")
        result = await self.cli.run(
            "rm", "--force", "--time", self._grace, name, what=f"remove container {name}"
        )
        if result.code != 0 and not result.not_found():
            raise DriverError(f"Could not remove container {name}: {result.error_line()}")

    async def _recreate(
        self, machine: Machine, labels: Mapping[str, str], volume: str, launch: Optional[WorkerLaunch]
    ) -> None:
        """Replace the machine's container by a new one on ``volume`` (with ``launch``'s environment)."""
        await self._stop_and_remove(machine.name)
        if launch is None:
            await self.cli.check(
                *self._create_arguments(machine.name, labels, volume, machine.session_id),
                what=f"create container {machine.name}",
            )
            return
        env = launch.environment()
        # The token goes in a secret of its own; the rest (no secret in it) in the env file.
        token = env.pop(TOKEN_VARIABLE)
        # The data dir must be on the state volume (a snapshot keeps it), whatever the launch says.
        env["DEVIN_WORKER_CACHE_DIR"] = f"{DATA_DIR}/cache"
        env["DEVIN_WORKER_WORKDIR"] = WORKDIR
        uid = await self._worker_uid()
        env_file = self._write_env_file(machine.name, env)
        secret = f"{TOKEN_SECRET_PREFIX}{secrets.token_hex(8)}"  # podman allows 64 characters
        self._secrets_in_use.add(secret)
        try:
            await self._create_secret(secret, token, labels)
            # podman copies the secret into the container when it creates it: the secret can go at once.
            await self.cli.check(
                *self._create_arguments(
                    machine.name, labels, volume, machine.session_id, (env_file, secret, uid)
                ),
                what=f"create container {machine.name}",
            )
        finally:
            self._env_files_in_use.discard(env_file)
            with contextlib.suppress(FileNotFoundError):
                env_file.unlink()
            await self._remove_secret(secret)
            self._secrets_in_use.discard(secret)

    async def _create_secret(self, name: str, token: str, labels: Mapping[str, str]) -> None:
        """A podman secret holding ``token``, read from stdin (never argv, never a file of ours)."""
        args = ["secret", "create", "--driver", "file"]
        for key in (LABEL_MANAGED_BY, LABEL_ACCEPTOR, LABEL_OUTPOST, LABEL_SESSION, LABEL_IDS):
            if key in labels:
                args += ["--label", f"{key}={labels[key]}"]
        args += ["--label", f"{LABEL_KIND}={KIND_TOKEN}", name, "-"]
        await self.cli.check(*args, what=f"create secret {name}", stdin=token.encode())

    async def _remove_secret(self, name: str) -> bool:
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

    def _write_env_file(self, name: str, env: Mapping[str, str]) -> Path:
        text = env_file_text(env)
        try:
            make_private_dir(self.root)
            make_private_dir(self.env_dir)
            path = self.env_dir / f"{name}.{secrets.token_hex(4)}.env"
            # Created 0600 and exclusive: never a file someone else made, never readable by others.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            self._env_files_in_use.add(path)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
        except OSError as exc:
            raise DriverError(f"cannot write the worker's env file for {name}: {exc}") from exc
        return path

    async def start(self, machine: Machine, launch: WorkerLaunch) -> None:
        found = await self._machine_container(machine)
        labels = labels_of(found)
        ours = our_labels(labels)
        volume = labels.get(LABEL_STATE_VOLUME, "")
        if not volume:
            raise DriverError(f"container {machine.name} names no state volume")
        await self._recreate(machine, ours, volume, launch)
        await self.cli.check("start", machine.name, what=f"start container {machine.name}")

    async def status(self, machine: Machine) -> WorkerStatus:
        found = await self.cli.inspect("container", machine.name)
        if found is None:
            return WorkerStatus(WorkerState.MISSING, detail="container gone")
        raw_state = found.get("State")
        state: Mapping[str, Any] = raw_state if isinstance(raw_state, dict) else {}
        status = str(state.get("Status", "")).lower()
        if status in ("created", "configured", "initialized"):
            return WorkerStatus(WorkerState.STARTING, detail=f"container {status}")
        if status in ("running", "paused", "stopping"):
            return WorkerStatus(
                WorkerState.RUNNING, detail="" if status == "running" else f"container {status}"
            )
        if status in ("exited", "stopped"):
            try:
                code = int(state.get("ExitCode", 1))
            except (TypeError, ValueError):
                code = 1
            detail = "killed for lack of memory" if state.get("OOMKilled") else ""
            return WorkerStatus(WorkerState.EXITED, exit_code=code, detail=detail)
        if status == "removing":
            return WorkerStatus(WorkerState.MISSING, detail="container being removed")
        # A state this driver does not know: not running, not ended; the boot timeout bounds it.
        return WorkerStatus(WorkerState.STARTING, detail=f"container state {status or 'unknown'}")

    async def teardown(self, machine: Machine) -> None:
        found = await self.cli.inspect("container", machine.name)
        volumes: set[str] = set()
        if found is not None:
            labels = labels_of(found)
            if labels.get(LABEL_MANAGED_BY) != MANAGED_BY:
                raise DriverError(f"container {machine.name} is not one of ours")
            if labels.get(LABEL_STATE_VOLUME):
                volumes.add(labels[LABEL_STATE_VOLUME])
            await self._stop_and_remove(machine.name)
        # Also the session's state volumes no container names any more (a provision or restore that was
        # interrupted), but never one a snapshot keeps. Listed by this session's label alone: a listing
        # of every session's volumes fails when another session's teardown removes one meanwhile.
        states, markers = await self._session_volumes(machine)
        volumes.update(str(volume.get("Name", "")) for volume in states)
        kept = {labels_of(marker).get(LABEL_STATE_VOLUME, "") for marker in markers}
        for volume_name in sorted(volumes - kept - {""}):
            await self._remove_volume(volume_name)
        self._remove_env_files(machine.name)

    def _remove_env_files(self, name: str) -> None:
        if not self.env_dir.is_dir():
            return
        for path in self.env_dir.glob(f"{name}.*.env"):
            if path not in self._env_files_in_use:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    async def list_owned(self, acceptor_id: str, outpost_id: str) -> list[Machine]:
        found = []
        for item in await self.cli.listing(
            ["ps", "--all", *owner_filters(acceptor_id, outpost_id, KIND_MACHINE)], "list containers"
        ):
            labels = labels_of(item)
            names = item.get("Names") or []
            if not owned_by(labels, acceptor_id, outpost_id, KIND_MACHINE) or not names:
                continue
            machine = self._machine(str(names[0]), labels, str(item.get("Image") or self.image))
            if not machine.created_at:
                with contextlib.suppress(TypeError, ValueError):
                    machine.created_at = float(item.get("Created", 0))
            found.append(machine)
        return sorted(found, key=lambda m: m.name)

    # --- snapshots ---------------------------------------------------------------------------------

    async def _volumes(self, acceptor_id: str, outpost_id: str, kind: str) -> list[dict[str, Any]]:
        listed = await self.cli.listing(
            ["volume", "ls", *owner_filters(acceptor_id, outpost_id, kind)], f"list {kind} volumes"
        )
        return [item for item in listed if owned_by(labels_of(item), acceptor_id, outpost_id, kind)]

    async def _session_volumes(self, machine: Machine) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
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

    async def _state_volumes(self, acceptor_id: str, outpost_id: str) -> list[dict[str, Any]]:
        return await self._volumes(acceptor_id, outpost_id, KIND_STATE)

    async def _markers(self, acceptor_id: str, outpost_id: str) -> list[dict[str, Any]]:
        return await self._volumes(acceptor_id, outpost_id, KIND_SNAPSHOT)

    def _snapshot_of(self, marker: Mapping[str, Any]) -> Snapshot:
        labels = labels_of(marker)
        ids = ids_of(labels)
        return Snapshot(
            session_id=ids["session_id"],
            outpost_id=ids["outpost_id"],
            acceptor_id=ids["acceptor_id"],
            created_at=created_at_of(labels),
            ref=labels.get(LABEL_STATE_VOLUME, ""),
        )

    async def snapshot(self, machine: Machine) -> Snapshot:
        found = await self._machine_container(machine)
        labels = labels_of(found)
        volume = labels.get(LABEL_STATE_VOLUME, "")
        if not volume:
            raise DriverError(f"container {machine.name} names no state volume")
        # A running worker would go on writing into the kept state.
        await self.cli.run("kill", "--signal", "TERM", machine.name, what=f"signal container {machine.name}")
        await self.cli.check(
            "stop", "--time", self._grace, machine.name,
            what=f"stop container {machine.name}",
        )  # fmt: skip
        marker_name = volume + MARKER_SUFFIX
        # An older snapshot of this session: the newer state wins.
        for marker in await self._markers(machine.acceptor_id, machine.outpost_id):
            older = self._snapshot_of(marker)
            if older.session_id == machine.session_id and older.ref != volume:
                await self.delete_snapshot(older)
        existing = await self.cli.inspect("volume", marker_name)
        if existing is not None:  # snapshot() again after a failure: the marker is there already
            return self._snapshot_of(existing)
        created = round(time.time(), 3)  # what the label keeps
        marker_labels = {
            key: value
            for key, value in labels.items()
            if key in (LABEL_MANAGED_BY, LABEL_SESSION, LABEL_OUTPOST, LABEL_ACCEPTOR, LABEL_IDS)
        }
        marker_labels.update(
            {LABEL_KIND: KIND_SNAPSHOT, LABEL_STATE_VOLUME: volume, LABEL_CREATED: f"{created:.3f}"}
        )
        await self._create_volume(marker_name, marker_labels)
        return Snapshot(machine.session_id, machine.outpost_id, machine.acceptor_id, created, volume)

    async def _kept_volume(self, snapshot: Snapshot) -> dict[str, str]:
        """The labels of ``snapshot``'s state volume, after checking it is ours and still a snapshot."""
        volume = await self.cli.inspect("volume", snapshot.ref) if snapshot.ref else None
        labels = labels_of(volume) if volume is not None else {}
        if labels.get(LABEL_MANAGED_BY) != MANAGED_BY or labels.get(LABEL_KIND) != KIND_STATE:
            raise DriverError(f"snapshot {snapshot.ref or '(none)'} is not one of ours")
        if await self.cli.inspect("volume", snapshot.ref + MARKER_SUFFIX) is None:
            raise DriverError(f"snapshot {snapshot.ref} is gone (restored or deleted)")
        return labels

    async def restore(self, machine: Machine, snapshot: Snapshot) -> None:
        kept = await self._kept_volume(snapshot)
        if ids_of(kept)["session_id"] != machine.session_id:
            raise DriverError(f"snapshot {snapshot.ref} is of another session than machine {machine.name}")
        found = await self._machine_container(machine)
        labels = labels_of(found)
        fresh = labels.get(LABEL_STATE_VOLUME, "")
        ours = our_labels(labels)
        ours[LABEL_STATE_VOLUME] = snapshot.ref
        # In this order, so that an interruption never leaves the kept state unnamed: the container names
        # it first, then the marker goes, then the fresh volume (an orphan the sweep collects otherwise).
        await self._recreate(machine, ours, snapshot.ref, None)
        await self._remove_volume(snapshot.ref + MARKER_SUFFIX)
        if fresh and fresh != snapshot.ref:
            await self._remove_volume(fresh)
        machine.details["volume"] = snapshot.ref

    async def list_snapshots(self, acceptor_id: str, outpost_id: str) -> list[Snapshot]:
        found = [self._snapshot_of(marker) for marker in await self._markers(acceptor_id, outpost_id)]
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
            await self._remove_volume(snapshot.ref)
        await self._remove_volume(snapshot.ref + MARKER_SUFFIX)

    # --- garbage ---------------------------------------------------------------------------------

    async def sweep_orphans(self, acceptor_id: str, outpost_id: str, live_sessions: set[str]) -> int:
        """State volumes of ended sessions that no container and no snapshot names (left by an interrupted
        provision or restore), markers whose volume is gone, and env files no ``podman create`` uses."""
        removed = 0
        named = {m.details.get("volume", "") for m in await self.list_owned(acceptor_id, outpost_id)}
        markers = await self._markers(acceptor_id, outpost_id)
        kept = {labels_of(m).get(LABEL_STATE_VOLUME, "") for m in markers}
        states = await self._state_volumes(acceptor_id, outpost_id)
        for volume in states:
            labels = labels_of(volume)
            name = str(volume.get("Name", ""))
            if not name:
                continue
            if name in named or name in kept or ids_of(labels)["session_id"] in live_sessions:
                continue
            if await self._remove_volume(name):
                removed += 1
        existing = {str(v.get("Name", "")) for v in states}
        for marker in markers:
            gone = labels_of(marker).get(LABEL_STATE_VOLUME, "") not in existing
            if gone and await self._remove_volume(str(marker.get("Name", ""))):
                removed += 1
        if self.env_dir.is_dir():
            for path in self.env_dir.glob("*.env"):
                if path not in self._env_files_in_use:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                        removed += 1
        return removed + await self._sweep_secrets(acceptor_id, outpost_id)

    async def _sweep_secrets(self, acceptor_id: str, outpost_id: str) -> int:
        """Token secrets no ``podman create`` uses: an orchestrator died between making one and removing
        it. podman 4.3 lists secrets without their labels, so each candidate is inspected."""
        listed = await self.cli.check("secret", "ls", "--format", "{{.Name}}", what="list secrets")
        removed = 0
        for name in listed.stdout.split():
            if not TOKEN_SECRET.fullmatch(name) or name in self._secrets_in_use:
                continue
            found = await self.cli.inspect("secret", name)
            spec = found.get("Spec") if found is not None else None
            labels = labels_of(spec) if isinstance(spec, dict) else {}
            if owned_by(labels, acceptor_id, outpost_id, KIND_TOKEN) and await self._remove_secret(name):
                removed += 1
        return removed

    async def aclose(self) -> None:
        return None
