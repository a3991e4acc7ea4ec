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
from collections.abc import Container, Mapping
from pathlib import Path
from typing import Any, Optional

from devin_outposts.core.paths import make_private_dir
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
    StatusSource,
    WorkerLaunch,
    WorkerState,
    WorkerStatus,
    machine_name,
    name_taken,
)
from devin_outposts.orchestrator.drivers.podman.cli import PodmanCli
from devin_outposts.orchestrator.drivers.podman.events import PodmanEvents
from devin_outposts.orchestrator.drivers.podman.objects import (
    DATA_DIR,
    KIND_MACHINE,
    KIND_SNAPSHOT,
    KIND_STATE,
    LABEL_CREATED,
    LABEL_IDS,
    LABEL_KIND,
    LABEL_STATE_VOLUME,
    MARKER_SUFFIX,
    MOUNT,
    TOKEN_ENTRYPOINT,
    TOKEN_SECRET_PREFIX,
    TOKEN_TARGET,
    TOKEN_VARIABLE,
    WORKDIR,
    PodmanFailure,
    Result,
    created_at_of,
    env_file_text,
    failure_of,
    ids_label,
    ids_of,
    labels_of,
    our_labels,
    owned_by,
    owner_filters,
    worker_status_of,
)
from devin_outposts.orchestrator.drivers.podman.options import BUILTIN_NETWORKS, OPTIONS, Settings
from devin_outposts.orchestrator.drivers.podman.store import PodmanVolumes, TokenSecrets, snapshot_of

log = logging.getLogger(__name__)


class PodmanDriver(Driver):
    name = "podman"
    option_table = OPTIONS

    def __init__(self, root: Path, settings: Optional[Settings] = None) -> None:
        settings = settings or Settings()
        self.root = root
        self.env_dir = root / "env"
        self.settings = settings
        self.image = settings.image
        self.cli = PodmanCli(settings.podman, settings.command_timeout)
        self.volumes = PodmanVolumes(self.cli)
        self.secrets = TokenSecrets(self.cli)
        #: Env files of ``podman create`` calls in progress (the sweep removes any other one).
        self._env_files_in_use: set[Path] = set()
        #: Sessions whose state volume exists and whose container does not yet (a provision in flight):
        #: the sweep must not take that volume for an interrupted provision's leftover.
        self._provisioning: set[str] = set()
        #: The uid the image's worker runs as (the owner of the token file in the container), once known.
        self._uid: Optional[int] = None
        #: Per container name, why its ``podman start`` failed (podman still calls it ``created``): read
        #: by :meth:`status` and the status source until the container is replaced or torn down.
        self._start_failures: dict[str, WorkerStatus] = {}
        #: The status sources following our containers (:meth:`status_source`), told what we know first.
        self._sources: list[PodmanEvents] = []

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
        labels = {**common, LABEL_KIND: KIND_MACHINE, LABEL_STATE_VOLUME: volume}
        # Until the container names the volume, this mark keeps a sweep from removing it even when its caller
        # gives a set of live sessions read before our claim (the orchestrator now passes a live view; seen
        # under load before that: the container create then failed). Once the container exists, podman
        # itself refuses to remove a volume in use.
        self._provisioning.add(spec.session_id)
        try:
            await self.volumes.create(volume, {**common, LABEL_KIND: KIND_STATE})
            try:
                await self._create(name, self._create_arguments(name, labels, volume, spec.session_id, None))
            except DriverError:
                with contextlib.suppress(DriverError):
                    await self.volumes.remove(volume)
                raise
        finally:
            self._provisioning.discard(spec.session_id)
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
        self._start_failures.pop(machine.name, None)
        if launch is None:
            await self._create(
                machine.name, self._create_arguments(machine.name, labels, volume, machine.session_id)
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
        self.secrets.in_use.add(secret)
        try:
            await self.secrets.create(secret, token, labels)
            # podman copies the secret into the container when it creates it: the secret can go at once.
            await self._create(
                machine.name,
                self._create_arguments(
                    machine.name, labels, volume, machine.session_id, (env_file, secret, uid)
                ),
            )
        finally:
            self._env_files_in_use.discard(env_file)
            with contextlib.suppress(FileNotFoundError):
                env_file.unlink()
            await self.secrets.remove(secret)
            self.secrets.in_use.discard(secret)

    async def _create(self, name: str, args: list[str]) -> None:
        """``podman create``; an image it cannot pull is a :class:`PodmanFailure` naming the reason. The
        status sources learn the new container's id at once (the replaced one's events are stale)."""
        what = f"create container {name}"
        result = await self.cli.run(*args, what=what)
        if result.code != 0:
            raise self._failure(result, what)
        container_id = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
        for source in self._sources:
            source.expect(name, container_id)

    @staticmethod
    def _failure(result: Result, what: str) -> DriverError:
        reason = failure_of(result)
        message = f"Could not {what}: {result.error_line()}"
        return PodmanFailure(message, reason) if reason else DriverError(message)

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
        what = f"start container {machine.name}"
        result = await self.cli.run("start", machine.name, what=what)
        if result.code == 0:
            return
        reason = failure_of(result)
        if not reason:
            raise DriverError(f"Could not {what}: {result.error_line()}")
        # The container exists and cannot run (its command is missing, the runtime refused it): a status,
        # as a Pod's CreateContainerError is, so the session is released at once with the reason.
        failed = WorkerStatus(WorkerState.FAILED, reason=reason, detail=result.error_line())
        self._start_failures[machine.name] = failed
        for source in self._sources:
            source.report(machine.name, failed)

    async def status(self, machine: Machine) -> WorkerStatus:
        status = worker_status_of(await self.cli.inspect("container", machine.name))
        failed = self._start_failures.get(machine.name)
        return failed if failed is not None and status.state is WorkerState.STARTING else status

    def status_source(self, acceptor_id: str) -> Optional[StatusSource]:
        """One ``podman events`` child for every container of ``acceptor_id``, and a ``podman ps`` every
        ``reconcile_interval`` seconds (:mod:`.events`)."""
        source = PodmanEvents(
            self.cli, acceptor_id, self._start_failures, reconcile_interval=self.settings.reconcile_interval
        )
        self._sources.append(source)
        return source

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
        self._start_failures.pop(machine.name, None)
        # Also the session's state volumes no container names any more (a provision or restore that was
        # interrupted), but never one a snapshot keeps. Listed by this session's label alone: a listing
        # of every session's volumes fails when another session's teardown removes one meanwhile.
        states, markers = await self.volumes.of_session(machine)
        volumes.update(str(volume.get("Name", "")) for volume in states)
        kept = {labels_of(marker).get(LABEL_STATE_VOLUME, "") for marker in markers}
        for volume_name in sorted(volumes - kept - {""}):
            await self.volumes.remove(volume_name)
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
        for marker in await self.volumes.markers(machine.acceptor_id, machine.outpost_id):
            older = snapshot_of(marker)
            if older.session_id == machine.session_id and older.ref != volume:
                await self.delete_snapshot(older)
        existing = await self.cli.inspect("volume", marker_name)
        if existing is not None:  # snapshot() again after a failure: the marker is there already
            return snapshot_of(existing)
        created = round(time.time(), 3)  # what the label keeps
        marker_labels = {
            key: value
            for key, value in labels.items()
            if key in (LABEL_MANAGED_BY, LABEL_SESSION, LABEL_OUTPOST, LABEL_ACCEPTOR, LABEL_IDS)
        }
        marker_labels.update(
            {LABEL_KIND: KIND_SNAPSHOT, LABEL_STATE_VOLUME: volume, LABEL_CREATED: f"{created:.3f}"}
        )
        await self.volumes.create(marker_name, marker_labels)
        return Snapshot(machine.session_id, machine.outpost_id, machine.acceptor_id, created, volume)

    async def restore(self, machine: Machine, snapshot: Snapshot) -> None:
        kept = await self.volumes.kept(snapshot)
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
        await self.volumes.remove(snapshot.ref + MARKER_SUFFIX)
        if fresh and fresh != snapshot.ref:
            await self.volumes.remove(fresh)
        machine.details["volume"] = snapshot.ref

    async def list_snapshots(self, acceptor_id: str, outpost_id: str) -> list[Snapshot]:
        return await self.volumes.list_snapshots(acceptor_id, outpost_id)

    async def delete_snapshot(self, snapshot: Snapshot) -> None:
        await self.volumes.delete_snapshot(snapshot)

    # --- garbage ---------------------------------------------------------------------------------

    async def sweep_orphans(self, acceptor_id: str, outpost_id: str, live_sessions: Container[str]) -> int:
        """State volumes of ended sessions that no container and no snapshot names (left by an interrupted
        provision or restore), markers whose volume is gone, and env files no ``podman create`` uses."""
        removed = 0
        named = {m.details.get("volume", "") for m in await self.list_owned(acceptor_id, outpost_id)}
        markers = await self.volumes.markers(acceptor_id, outpost_id)
        kept = {labels_of(m).get(LABEL_STATE_VOLUME, "") for m in markers}
        states = await self.volumes.states(acceptor_id, outpost_id)
        for volume in states:
            labels = labels_of(volume)
            name = str(volume.get("Name", ""))
            if not name:
                continue
            session_id = ids_of(labels)["session_id"]
            if name in named or name in kept or session_id in live_sessions:
                continue
            if session_id in self._provisioning:  # a caller's live set may still predate the claim
                continue
            if await self.volumes.remove(name):
                removed += 1
        existing = {str(v.get("Name", "")) for v in states}
        for marker in markers:
            gone = labels_of(marker).get(LABEL_STATE_VOLUME, "") not in existing
            if gone and await self.volumes.remove(str(marker.get("Name", ""))):
                removed += 1
        if self.env_dir.is_dir():
            for path in self.env_dir.glob("*.env"):
                if path not in self._env_files_in_use:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                        removed += 1
        return removed + await self.secrets.sweep(acceptor_id, outpost_id)

    async def aclose(self) -> None:
        return None
