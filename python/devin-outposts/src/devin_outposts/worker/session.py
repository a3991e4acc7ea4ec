"""The worker's way of serving a claimed session: ``devin-remote serve`` on this machine.

:class:`SessionServer` is a :class:`~devin_outposts.core.serving.ClaimedSession` (renewal, status
watching, restarts and release are there) whose launches are local ``devin-remote`` processes
(docs/fleet-api.md §6.2):

1. the per-session state dir ``<data>/sessions/<id>`` (0700; the id sanitised) and the slot's working
   directory are prepared, and a remote left behind by a killed predecessor is stopped;
2. the ``devin-remote`` SHA is resolved and the verified binary fetched; a checksum mismatch is refused,
   reported and the claim released so another worker can try;
3. a session whose network policy is enabled is confined to it (:mod:`devin_outposts.core.netpolicy`):
   refused and released when this host cannot confine sessions (unless ``--network-policy ignore``), else
   each launch gets its egress proxy and runs inside the sandbox launcher;
4. each launch runs ``devin-remote serve`` with exactly the spawn-contract environment;
5. a session that is over for good (terminated, or its entry gone) has its state dir removed; a
   suspended one keeps it for a resume.

:class:`WorkerHost` is the worker's :class:`~devin_outposts.core.claiming.SessionHost`: in queue mode the
claim loop gets each claim's :class:`SessionServer` from it, and it keeps the worker's rules where the
orchestrator's differ: the sessions run on this machine's OS, restart recovery keeps no session over
``--max-sessions``, and an error no fleet reply explains ends the worker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import stat
import sys
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Callable, Optional, Union

from devin_outposts.api.models import Outpost, QueueEntry
from devin_outposts.core import tokenfile
from devin_outposts.core.claiming import KeepOverCap, keep_none
from devin_outposts.core.metrics import Metrics
from devin_outposts.core.netpolicy.confinement import Confinement
from devin_outposts.core.paths import child_dir, make_private_dir
from devin_outposts.core.platform import host_os
from devin_outposts.core.processes import reap_stale_remote
from devin_outposts.core.serving import ClaimedSession
from devin_outposts.core.sessions import (
    DETACHED,
    FAILED,
    INTERRUPTED,
    LOST,
    SERVED,
    LaunchError,
    Outcome,
    SessionFleet,
    SessionResult,
    Stop,
    release_claim,
    renew_delay,
)
from devin_outposts.worker.binary import BinaryError, BinaryStore, VerificationError
from devin_outposts.worker.options import WorkerConfig
from devin_outposts.worker.spawn import RemoteProcess, build_session_env, free_port

__all__ = [
    "DETACHED",
    "FAILED",
    "INTERRUPTED",
    "LOST",
    "SERVED",
    "Outcome",
    "SessionFleet",
    "SessionResult",
    "SessionServer",
    "Stop",
    "release_claim",
    "renew_delay",
]

log = logging.getLogger(__name__)


class SessionServer(ClaimedSession):
    """Serves one session with local ``devin-remote`` processes. ``claim`` is the claim response
    (``None`` in direct-serve mode, where the config carries the connect token)."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        session_id: str,
        acceptor_id: str,
        binaries: BinaryStore,
        metrics: Metrics,
        cwd: Path,
        fleet: Optional[SessionFleet] = None,
        claim: Optional[QueueEntry] = None,
        slot: int = 0,
    ) -> None:
        super().__init__(
            config,
            session_id=session_id,
            acceptor_id=acceptor_id,
            metrics=metrics,
            fleet=fleet,
            claim=claim,
            slot=slot,
            direct_token=config.direct_token if config.direct else None,
        )
        self.config = config
        self.binaries = binaries
        self.cwd = cwd
        self.state_dir: Optional[Path] = None
        self.binary: Optional[Path] = None
        self.confinement: Optional[Confinement] = None

    @property
    def remote(self) -> Optional[RemoteProcess]:
        """The running (or last) ``devin-remote``."""
        return self.run if isinstance(self.run, RemoteProcess) else None

    async def prepare(self) -> Optional[SessionResult]:
        make_private_dir(self.config.sessions_dir)
        state_dir = child_dir(self.config.sessions_dir, self.session_id)
        reclaim_from_session(state_dir)
        self.state_dir = make_private_dir(state_dir)
        self.cwd.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(reap_stale_remote, self.state_dir)
        refusal = await self._confine(self.state_dir)
        if refusal is not None:
            return refusal
        try:
            spec_sha = self.claim.spec.remote_binary_sha if self.claim else None
            sha, source = await self.binaries.resolve_sha(spec_sha, self.config.remote_binary_sha)
            downloads = self.binaries.downloads
            self.binary = await self.binaries.ensure(sha)
            self.metrics.inc("binary_downloads", self.binaries.downloads - downloads)
        except VerificationError as exc:
            self.metrics.inc("binary_verification_failures")
            log.error("%s", exc, extra=self._extra)
            return SessionResult(self.session_id, FAILED, str(exc), refused_binary=True)
        except BinaryError as exc:
            return SessionResult(self.session_id, FAILED, str(exc), refused_binary=True)
        log.info(
            "serving session %s with devin-remote %s (%s)",
            self.session_id,
            sha,
            source,
            extra={**self._extra, "sha": sha},
        )
        return None

    async def launch(self, token: str, gateway_url: str) -> RemoteProcess:
        assert self.state_dir is not None
        assert self.binary is not None
        if self.run is not None:  # a restart: the binary is hashed again before it runs again
            try:
                self.binary = await self.binaries.reverify(self.binary)
            except BinaryError as exc:
                raise LaunchError(str(exc)) from exc
        env = build_session_env(
            gateway_url=gateway_url,
            connect_token=token,
            session_id=self.session_id,
            state_dir=self.state_dir,
            pty_bridge_port=self.config.pty_bridge_port or free_port(),
            chrome_path=self.config.chrome_path,
            desktop=self.config.desktop,
        )
        if self.confinement is None:
            return await RemoteProcess.start(
                self.binary, cwd=self.cwd, env=env, state_dir=self.state_dir, session_id=self.session_id
            )
        await self.confinement.start(gateway_url, self.binary)
        try:
            return await RemoteProcess.start(
                self.binary,
                cwd=self.cwd,
                env=env,
                state_dir=self.state_dir,
                session_id=self.session_id,
                wrap=self.confinement.command,
            )
        finally:
            self.confinement.launched()

    async def finish(self, result: SessionResult) -> None:
        if self.confinement is not None:
            await self.confinement.close()
            self.metrics.forget_egress(self.session_id)
        if result.finished and self.state_dir is not None:  # a suspended session keeps its state
            shutil.rmtree(self.state_dir, ignore_errors=True)

    async def _confine(self, state_dir: Path) -> Optional[SessionResult]:
        """Read the claim's network policy; a refusal when it is enabled and cannot be enforced here."""
        if self.claim is not None:
            network_policy: Any = self.claim.spec.network_policy
            outpost_id = self.claim.metadata.outpost_id
        else:  # direct-serve mode: what the orchestrator passed on
            network_policy, outpost_id = self.config.session_network_policy, None
        if network_policy is None:
            return None
        self.confinement = Confinement(
            session_id=self.session_id,
            outpost_id=outpost_id or self.config.outpost or "",
            session_dir=state_dir,
            workdir=self.cwd,
            network_policy=network_policy,
            mode=self.config.network_policy,
            observer=self.metrics.count_egress,
            hide=hidden_from_sessions(self.config),
            id_range=self.config.session_uid_range,
        )
        if self.confinement.enabled and not self.confinement.confined:
            self.metrics.inc("network_policy_unenforced")
        refusal = await self.confinement.refusal()
        if refusal is None:
            return None
        self.metrics.inc("network_policy_refusals")
        return SessionResult(self.session_id, FAILED, refusal, refused_policy=True)


def reclaim_from_session(state_dir: Path) -> None:
    """A root worker's confined session owned its state directory (its ids: core/netpolicy/session_ids.py);
    taking the session back (a restart, a successor), the worker owns it again before it checks it, and gives
    it to the next lease at launch. Only a root worker's sessions have ids of their own, and only root can
    have made anything in its 0700 sessions directory, so the owner can only be such a session."""
    if sys.platform == "win32" or os.geteuid() != 0:
        return
    else:  # an else, so that neither of mypy's platform passes calls the rest unreachable
        try:
            info = os.lstat(state_dir)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(info.st_mode) and (info.st_uid, info.st_gid) != (0, 0):
            os.lchown(state_dir, 0, 0)


def hidden_from_sessions(config: WorkerConfig) -> list[str]:
    """What a confined session must not see of this worker, besides what the launcher always hides: its
    data directory (the other sessions' state, the binary cache, its identity), its working directory (the
    other slots), its user's home, the token files it read, and ``--session-hide``."""
    paths: list[Union[str, Path]] = [
        config.data_dir,
        config.workdir,
        Path.home(),
        *sorted(tokenfile.FILES_READ),
    ]
    paths += config.session_hide or ()
    return [str(Path(path).absolute()) for path in paths]


class WorkerHost:
    """What the claim loop runs a claim with in queue mode: a :class:`SessionServer` from ``server_for``
    (the runner's, which knows the binary store and the fleet client)."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        acceptor_id: str,
        metrics: Metrics,
        server_for: Callable[[QueueEntry, int], SessionServer],
    ) -> None:
        self.config = config
        self.acceptor_id = acceptor_id
        self.metrics = metrics
        self._server_for = server_for

    @property
    def machine_platform(self) -> Optional[str]:
        return host_os()

    def announce(self, outpost: Outpost) -> None:
        config = self.config
        log.info(
            "worker %s serving outpost %s (%s) on %s: %d slot(s), %s, workdir %s",
            self.acceptor_id,
            outpost.name,
            outpost.outpost_id,
            host_os(),
            config.max_sessions,
            "watching the queue" if config.watch else f"polling every {config.poll_interval:g}s",
            config.workdir,
            extra={"outpost": outpost.outpost_id, "acceptor_id": self.acceptor_id},
        )
        self.metrics.labels["outpost"] = outpost.outpost_id

    def recovery(self, outpost_id: str) -> AbstractAsyncContextManager[KeepOverCap]:
        return keep_none(outpost_id)  # a held session gets a free slot or is released

    def session_for(self, claim: QueueEntry, slot: int) -> SessionServer:
        return self._server_for(claim, slot)

    def finished(self, result: SessionResult) -> None:
        return  # the pool keeps the results the runner's exit code is made from

    def claim_failed(self, error: Exception) -> bool:
        # A bug ends the worker (exit 1, with its traceback) and its unit restarts it: unlike the
        # orchestrator's machines, nothing it runs outlives it unserved (the drain stops every remote).
        return False

    def loop_failed(self) -> None:
        return  # the pool's drain stops every session and releases its claim

    def claim_pause(self) -> float:
        return 0.0  # a remote that cannot start fails its session; the next claim is not held back

    def pause_report(self) -> Optional[Mapping[str, object]]:
        return None
