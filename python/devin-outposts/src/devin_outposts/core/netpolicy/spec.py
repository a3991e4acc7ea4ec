"""What the launcher of one session is told: :class:`SandboxSpec` (:mod:`.sandbox` carries it to the launcher
in an anonymous file; docs/network-policy.md, "How a session is confined")."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Optional

from .policy import Policy


@dataclass(frozen=True)
class SandboxSpec:
    """What the launcher of one session is told (JSON in an anonymous file)."""

    #: The claim's ``spec.network_policy`` (the wire dict).
    network_policy: Any
    gateway_url: Optional[str]
    #: The session's working directory (its ``cwd``; writable).
    workdir: str
    #: The session's state directory (``DEVIN_REMOTE_STATE_DIR``; writable; ``home``, ``tmp`` and ``var-tmp``
    #: in it are the session's ``HOME``, ``/tmp`` and ``/var/tmp``).
    state_dir: str
    #: Paths covered for the session besides the launcher's own list (:data:`.view.ALWAYS_HIDDEN`...).
    hide: Sequence[str] = ()
    #: Paths the session keeps read-only where they would be hidden (the ``devin-remote`` it runs).
    readonly: Sequence[str] = ()
    #: The host's uid and gid the session runs as, when not the worker's own (a root worker's sessions).
    session_uid: Optional[int] = None
    session_gid: Optional[int] = None
    #: The user name the session's uid gets in its ``/etc/passwd`` when the host has none for it.
    session_user: str = "devin-session"

    @property
    def home(self) -> str:
        return os.path.join(self.state_dir, "home")

    def policy(self) -> Policy:
        return Policy.from_spec(self.network_policy, self.gateway_url)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SandboxSpec:
        document = json.loads(text)
        if not isinstance(document, dict):
            raise ValueError("the sandbox spec is not an object")
        known = {name: document[name] for name in cls.__dataclass_fields__ if name in document}
        for name in ("workdir", "state_dir"):
            if not isinstance(known.get(name), str) or not os.path.isabs(known[name]):
                raise ValueError(f"the sandbox spec's {name} is not an absolute path")
        for name in ("hide", "readonly"):
            paths = known.get(name, ())
            if not isinstance(paths, list) or not all(isinstance(p, str) and os.path.isabs(p) for p in paths):
                raise ValueError(f"the sandbox spec's {name} is not a list of absolute paths")
            known[name] = tuple(paths)
        spec = cls(**known)
        spec.policy()  # refuse here what the launcher could not read
        return spec
