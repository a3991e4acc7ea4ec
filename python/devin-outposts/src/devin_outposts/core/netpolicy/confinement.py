"""One session's confinement, as whatever starts the session uses it: may the session run here, its egress
proxy, its sandbox and its command line (docs/network-policy.md, "How the worker enforces a policy").

The worker's :class:`~devin_outposts.worker.session.SessionServer` holds one :class:`Confinement` per claimed
session:

1. :meth:`Confinement.refusal` before anything is started: a session whose policy is enabled is refused
   (released, so that a worker that can enforce it takes it) when this host cannot confine sessions
   (:func:`~.probe.probe`), or when a root worker has no ids to give it (:mod:`.session_ids`), unless the
   mode is :attr:`EnforcementMode.IGNORE`, which runs it unfiltered with a warning, every time;
2. :meth:`Confinement.start` before each launch: the session's directories, its sandbox spec and a fresh
   egress proxy behind a fresh doorway, for the gateway this launch uses;
3. :meth:`Confinement.command` turns the session's command into the sandbox launcher's, with the
   descriptors it must inherit; :meth:`Confinement.launched` once it runs;
4. :meth:`Confinement.close` when the session is over: the proxy and every tunnel it holds end, and a root
   worker's lease on the session's ids is given back.

A session whose policy is not enabled (or that has none) is untouched: no proxy, its command as it was.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

from . import session_ids
from .policy import Policy
from .probe import probe
from .proxy import EgressProxy, Observer
from .sandbox import SandboxSpec, sandbox_command, write_spec

log = logging.getLogger(__name__)

#: Where a direct-serve worker (``worker start --session``, started by the orchestrator in a machine) finds
#: its session's ``spec.network_policy``, as JSON: it never sees the claim.
ENV_SESSION_NETWORK_POLICY = "DEVIN_WORKER_SESSION_NETWORK_POLICY"
#: The session's own directories in its state directory: its ``HOME``, ``/tmp`` and ``/var/tmp``.
OWN_DIRS = (("home", 0o700), ("tmp", 0o1777), ("var-tmp", 0o1777))


class EnforcementMode(str, enum.Enum):
    """What a worker does with a session whose network policy is enabled (``--network-policy``)."""

    __str__ = str.__str__

    #: Confine it to its policy; a host that cannot confine sessions refuses (releases) it.
    ENFORCE = "enforce"
    #: Run it unfiltered, with a warning each time (unsafe: the policy is not applied at all).
    IGNORE = "ignore"


class SandboxCommand(NamedTuple):
    """What to start: ``argv``, with ``pass_fds`` inherited."""

    argv: list[str]
    pass_fds: tuple[int, ...] = ()


class Confinement:
    """The network confinement of one session. ``network_policy`` is the claim's ``spec.network_policy``
    (a wire dict, an ``api.models.NetworkPolicy`` or None); ``hide``: paths the session must not see besides
    the launcher's own list; ``id_range``: ``--session-uid-range`` (a root worker's)."""

    def __init__(
        self,
        *,
        session_id: str,
        outpost_id: str,
        session_dir: Path,
        workdir: Path,
        network_policy: Any,
        mode: EnforcementMode = EnforcementMode.ENFORCE,
        observer: Optional[Observer] = None,
        can_confine: Callable[[], Optional[str]] = probe,
        hide: Sequence[str] = (),
        id_range: Optional[str] = None,
    ) -> None:
        if hasattr(network_policy, "model_dump"):
            network_policy = network_policy.model_dump(mode="json")
        self.session_id = session_id
        self.outpost_id = outpost_id
        self.session_dir = session_dir
        self.workdir = workdir
        self.network_policy = network_policy
        self.mode = mode
        self.observer = observer
        self.hide = tuple(hide)
        self.id_range = id_range
        self._can_confine = can_confine
        #: Whether the policy asks for filtering at all (read once: a malformed policy raises here).
        self.enabled = Policy.from_spec(network_policy).enforced
        self.proxy: Optional[EgressProxy] = None
        self.ids: Optional[session_ids.Lease] = None
        self._handed: list[int] = []
        self._launcher_end: Optional[socket.socket] = None

    @property
    def confined(self) -> bool:
        """The session runs in the sandbox, through its egress proxy."""
        return self.enabled and self.mode is EnforcementMode.ENFORCE

    async def refusal(self) -> Optional[str]:
        """None when the session may run here; else why not, in one line (the session is then released)."""
        if not self.enabled:
            return None
        if self.mode is EnforcementMode.IGNORE:
            log.warning(
                "session %s: its network policy is NOT enforced (--network-policy ignore): it can reach "
                "anything this host can",
                self.session_id,
                extra={"session_id": self.session_id},
            )
            return None
        reason = await asyncio.to_thread(self._can_confine)
        if reason is None and _is_root():
            reason = self._lease_ids()
        if reason is None:
            return None
        return (
            f"session {self.session_id} has an enabled network policy and this host cannot enforce it "
            f"({reason}): released for a worker that can"
        )

    def _lease_ids(self) -> Optional[str]:
        """A root worker's session gets ids of its own; why not, when it cannot."""
        if self.ids is not None:
            return None
        try:
            id_range = session_ids.configured_range(self.id_range)
            if id_range is None:
                return (
                    "this worker runs as root and has no ids to run confined sessions as: give it "
                    "--session-uid-range START-END (DEVIN_WORKER_SESSION_UID_RANGE), or subordinate ranges "
                    "for root in /etc/subuid and /etc/subgid, or run it as an unprivileged user"
                )
            self.ids = session_ids.lease(id_range)
        except (session_ids.IdRangeError, OSError) as exc:
            return f"no ids for the session: {exc}"
        return None

    async def start(self, gateway_url: str, binary: Path) -> None:
        """Before a launch: the session's directories, its spec, and a fresh egress proxy for
        ``gateway_url`` (a previous launch's is closed first). Nothing when the session is not confined."""
        await self._close_launch()
        if not self.confined:
            return
        await asyncio.to_thread(self._own_dirs)
        spec = SandboxSpec(
            network_policy=self.network_policy,
            gateway_url=gateway_url,
            workdir=str(self.workdir),
            state_dir=str(self.session_dir),
            hide=self.hide,
            readonly=(str(binary),),
            session_uid=self.ids.uid if self.ids else None,
            session_gid=self.ids.gid if self.ids else None,
        )
        proxy = EgressProxy(
            spec.policy(),
            session_id=self.session_id,
            outpost_id=self.outpost_id,
            observer=self.observer,
        )
        self._launcher_end = await proxy.start()
        self.proxy = proxy
        self._handed = [write_spec(spec), self._launcher_end.fileno()]

    def command(self, argv: Sequence[str]) -> SandboxCommand:
        """What runs ``argv`` as this session must run (in the sandbox when confined)."""
        if not self.confined or not self._handed:
            return SandboxCommand(list(argv))
        spec_fd, doorway_fd = self._handed
        return SandboxCommand(
            sandbox_command(argv, spec_fd=spec_fd, doorway_fd=doorway_fd), (spec_fd, doorway_fd)
        )

    def launched(self) -> None:
        """The launcher runs (or could not be started): the worker's copies of its descriptors go."""
        spec_fd = self._handed[0] if self._handed else None
        self._handed = []
        if spec_fd is not None:
            os.close(spec_fd)
        if self._launcher_end is not None:
            self._launcher_end.close()
            self._launcher_end = None

    async def close(self) -> None:
        """End the egress proxy and every tunnel it holds; give the session's ids back (idempotent)."""
        await self._close_launch()
        if self.ids is not None:
            self.ids.release()
            self.ids = None

    async def _close_launch(self) -> None:
        self.launched()
        proxy, self.proxy = self.proxy, None
        if proxy is not None:
            await proxy.close()

    def _own_dirs(self) -> None:
        """``home``, ``tmp`` and ``var-tmp`` in the state directory; the working directory 0700; for a session
        with ids of its own, its state and working directories become its own (the working directory's
        contents too, when a previous session of the slot had other ids)."""
        for name, mode in OWN_DIRS:
            path = self.session_dir / name
            path.mkdir(exist_ok=True)
            os.chmod(path, mode)
        # Its working directory is its own alone (no other uid of the host enters it: another worker's
        # session, above all); the state directory is already 0700.
        os.chmod(self.workdir, 0o700)
        if self.ids is None or sys.platform == "win32":
            return
        else:  # an else, so that neither of mypy's platform passes calls the rest unreachable
            uid, gid = self.ids.uid, self.ids.gid
            for top in (self.session_dir, self.workdir):
                info = os.lstat(top)
                if (info.st_uid, info.st_gid) == (uid, gid) and top == self.workdir:
                    continue
                for directory, subdirs, files in os.walk(top):
                    for name in [*subdirs, *files]:
                        os.lchown(os.path.join(directory, name), uid, gid)
                os.lchown(top, uid, gid)


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0
