"""One session's network confinement, as whatever starts the session uses it: may the session run here, its
egress proxy, and its command line (docs/network-policy.md, "How the worker enforces a policy").

The worker's :class:`~devin_outposts.worker.session.SessionServer` holds one :class:`Confinement` per claimed
session:

1. :meth:`Confinement.refusal` before anything is started: a session whose policy is enabled is refused
   (released, so that a worker that can enforce it takes it) when this host cannot confine sessions
   (:func:`~.probe.probe`), unless the mode is :attr:`EnforcementMode.IGNORE`, which runs it unfiltered with
   a warning, every time;
2. :meth:`Confinement.start` before each launch: the policy file and the egress proxy on the session's Unix
   socket, for the gateway this launch uses;
3. :meth:`Confinement.wrap` turns the session's command into the sandbox launcher's;
4. :meth:`Confinement.close` when the session is over: the proxy and every tunnel it holds end.

A session whose policy is not enabled (or that has none) is untouched: no proxy, its command as it was.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Optional

from .policy import Policy
from .probe import probe
from .proxy import EgressProxy, Observer
from .sandbox import sandbox_argv, write_policy_file

log = logging.getLogger(__name__)

#: Where a direct-serve worker (``worker start --session``, started by the orchestrator in a machine) finds
#: its session's ``spec.network_policy``, as JSON: it never sees the claim.
ENV_SESSION_NETWORK_POLICY = "DEVIN_WORKER_SESSION_NETWORK_POLICY"
#: The longest Unix socket path the kernel takes is 107 bytes (108 with the NUL); leave room.
MAX_SOCKET_PATH = 100


class EnforcementMode(str, enum.Enum):
    """What a worker does with a session whose network policy is enabled (``--network-policy``)."""

    __str__ = str.__str__

    #: Confine it to its policy; a host that cannot confine sessions refuses (releases) it.
    ENFORCE = "enforce"
    #: Run it unfiltered, with a warning each time (unsafe: the policy is not applied at all).
    IGNORE = "ignore"


class Confinement:
    """The network confinement of one session. ``network_policy`` is the claim's ``spec.network_policy``
    (a wire dict, an ``api.models.NetworkPolicy`` or None)."""

    def __init__(
        self,
        *,
        session_id: str,
        outpost_id: str,
        session_dir: Path,
        network_policy: Any,
        mode: EnforcementMode = EnforcementMode.ENFORCE,
        observer: Optional[Observer] = None,
        can_confine: Callable[[], Optional[str]] = probe,
    ) -> None:
        if hasattr(network_policy, "model_dump"):
            network_policy = network_policy.model_dump(mode="json")
        self.session_id = session_id
        self.outpost_id = outpost_id
        self.session_dir = session_dir
        self.network_policy = network_policy
        self.mode = mode
        self.observer = observer
        self._can_confine = can_confine
        #: Whether the policy asks for filtering at all (read once: a malformed policy raises here).
        self.enabled = Policy.from_spec(network_policy).enforced
        self.proxy: Optional[EgressProxy] = None
        self._socket_dir: Optional[Path] = None

    @property
    def confined(self) -> bool:
        """The session runs in the sandbox, through its egress proxy."""
        return self.enabled and self.mode is EnforcementMode.ENFORCE

    @property
    def policy_file(self) -> Path:
        return self.session_dir / "network-policy.json"

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
        if reason is None:
            return None
        return (
            f"session {self.session_id} has an enabled network policy and this host cannot enforce it "
            f"({reason}): released for a worker that can"
        )

    async def start(self, gateway_url: str) -> None:
        """Before a launch: the policy file and a fresh egress proxy for ``gateway_url`` (a previous
        launch's proxy is closed first). Nothing when the session is not confined."""
        await self.close()
        if not self.confined:
            return
        write_policy_file(self.policy_file, self.network_policy, gateway_url)
        proxy = EgressProxy(
            Policy.from_spec(self.network_policy, gateway_url),
            session_id=self.session_id,
            outpost_id=self.outpost_id,
            socket_path=self._socket_path(),
            observer=self.observer,
        )
        await proxy.start()
        self.proxy = proxy

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """The command that runs ``argv`` as this session must run (in the sandbox when confined)."""
        if not self.confined:
            return list(argv)
        return sandbox_argv(argv, self._socket_path(), self.policy_file)

    async def close(self) -> None:
        """End the egress proxy and every tunnel it holds (idempotent)."""
        proxy, self.proxy = self.proxy, None
        if proxy is not None:
            await proxy.close()
        socket_dir, self._socket_dir = self._socket_dir, None
        if socket_dir is not None:
            shutil.rmtree(socket_dir, ignore_errors=True)

    def _socket_path(self) -> Path:
        """``<session dir>/egress.sock``, or, when that path is too long for a Unix socket, a socket in a
        private (0700) directory of ``/tmp`` named after it. ``/tmp`` itself, not ``$TMPDIR``, which can be
        as long; a worker with a private ``/tmp`` (systemd's ``PrivateTmp=``) shares it with its sessions."""
        preferred = self.session_dir / "egress.sock"
        if len(os.fsencode(preferred)) <= MAX_SOCKET_PATH:
            return preferred
        if self._socket_dir is None:
            digest = hashlib.sha256(os.fsencode(self.session_dir)).hexdigest()[:16]
            self._socket_dir = Path(tempfile.mkdtemp(prefix=f"devin-egress-{digest}-", dir="/tmp"))
        return self._socket_dir / "egress.sock"
