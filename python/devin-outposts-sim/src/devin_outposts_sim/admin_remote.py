"""The brain and distribution methods of :class:`~devin_outposts_sim.admin_client.SimAdmin`.

::

    from devin_outposts_sim import tools

    sha = admin.publish_standin_variant("v2", latest=True)  # another working build; now latest
    bad = admin.publish_tampered()                  # its .sha256 does not match its bytes
    admin.add_calls(sid, [tools.run("echo hi"), tools.read("notes.txt")])
    admin.wait_connection(sid)                      # what the remote reported: pid, cwd, env, version
    calls = admin.wait_calls(sid)                   # every call done: call["result"]["exit_code"], ...
    admin.end_session(sid, "terminated")            # the remote exits 0
"""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from typing import Any, Optional

from devin_outposts.api.models import QueueEntry
from devin_outposts_sim.admin_mixin import AdminMixin
from devin_outposts_sim.dist import sha256_hex, standin_bytes, version_id

#: Seconds one admin long poll may last; longer waits are several polls.
POLL_SLICE = 25.0


class RemoteAdmin(AdminMixin):
    """Mixed into ``SimAdmin``, which provides ``_call`` and ``url``."""

    # --- the brain -------------------------------------------------------------------------------

    def add_calls(self, session_id: str, calls: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Append tool calls (see :mod:`devin_outposts_sim.tools`); returns them with their ``id``."""
        result = self._call(
            "POST",
            f"/sessions/{session_id}/calls",
            f"add tool calls to session {session_id}",
            body={"calls": list(calls)},
        )
        return list(result["items"])

    def calls(self, session_id: str) -> list[dict[str, Any]]:
        """Every call of the session, oldest first: ``id``, ``tool``, ``args``, ``state`` (queued,
        delivered, done, cancelled), timings, and ``result`` (``exit_code``, ``output``, ``stderr``,
        ``error``, ``ok``, ``data``, ``duration``) once done."""
        result = self._call("GET", f"/sessions/{session_id}/calls", f"read the calls of session {session_id}")
        return list(result["items"])

    def wait_calls(self, session_id: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Wait until no call of the session is queued or delivered; raise after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        operation = f"wait for the calls of session {session_id}"
        while True:
            remaining = deadline - time.monotonic()
            wait = max(0.0, min(remaining, POLL_SLICE))
            result = self._call(
                "GET",
                f"/sessions/{session_id}/calls",
                operation,
                params={"wait": f"{wait:.3f}"},
                timeout=wait + 10,
            )
            if result["complete"]:
                return list(result["items"])
            if remaining <= 0:
                open_calls = [c for c in result["items"] if c["state"] in ("queued", "delivered")]
                raise self._error(
                    operation,
                    f"{len(open_calls)} of {len(result['items'])} calls not done after {timeout:g}s",
                )

    def connections(self, session_id: str) -> list[dict[str, Any]]:
        """What each remote connection reported, oldest first: ``connection_id``, ``pid``, ``ppid``,
        ``cwd``, ``argv``, ``env`` (connect token masked as ``***``), ``version``, ``state_dir``, ...,
        and the ``acceptor_id``/``token_fingerprint`` of the claim whose token it used."""
        result = self._call(
            "GET", f"/sessions/{session_id}/connections", f"read the connections of session {session_id}"
        )
        return list(result["items"])

    def wait_connection(self, session_id: str, *, count: int = 1, timeout: float = 30.0) -> dict[str, Any]:
        """Wait until the session has had ``count`` remote connections; returns the newest one."""
        deadline = time.monotonic() + timeout
        operation = f"wait for a remote connection of session {session_id}"
        while True:
            remaining = deadline - time.monotonic()
            wait = max(0.0, min(remaining, POLL_SLICE))
            result = self._call(
                "GET",
                f"/sessions/{session_id}/connections",
                operation,
                params={"wait": f"{wait:.3f}", "count": count},
                timeout=wait + 10,
            )
            items = list(result["items"])
            if len(items) >= count:
                return dict(items[-1])
            if remaining <= 0:
                raise self._error(operation, f"{len(items)} of {count} connections after {timeout:g}s")

    def end_session(self, session_id: str, session_status: str = "terminated") -> QueueEntry:
        """End the session as ``suspended`` or ``terminated``: its remote is told to exit 0."""
        data = self._call(
            "POST",
            f"/sessions/{session_id}/end",
            f"end session {session_id}",
            body={"session_status": session_status},
        )
        return QueueEntry.model_validate(data)

    # --- the distribution ------------------------------------------------------------------------

    @property
    def static_base_url(self) -> str:
        """The ``--static-base-url`` that serves this simulator's ``devin-remote`` builds."""
        return f"{self.url}/devin-rs/remote/"

    def dist(self) -> dict[str, Any]:
        """``builtin_sha``, ``suffixes``, ``latest`` (suffix -> SHA) and ``artifacts``."""
        result: dict[str, Any] = self._call("GET", "/dist", "read the distribution")
        return result

    def publish_remote(
        self,
        content: bytes,
        *,
        sha: Optional[str] = None,
        suffixes: Optional[Sequence[str]] = None,
        latest: bool = False,
        published_sha256: Optional[str] = None,
    ) -> str:
        """Publish ``content`` as ``devin-remote_<sha>_<suffix>`` (all suffixes unless given); returns
        the SHA (default: the first 12 hex digits of the content's SHA-1)."""
        body = {
            "content_b64": base64.b64encode(content).decode(),
            "sha": sha,
            "suffixes": list(suffixes) if suffixes is not None else None,
            "latest": latest,
            "published_sha256": published_sha256,
        }
        result = self._call("POST", "/dist/artifacts", "publish a devin-remote artifact", body=body)
        return str(result["sha"])

    def publish_standin_variant(
        self,
        tag: str,
        *,
        latest: bool = False,
        suffixes: Optional[Sequence[str]] = None,
        python: Optional[str] = None,
    ) -> str:
        """Publish a working build that differs from the built-in stand-in (so it has another SHA,
        which it reports as its ``version`` on connect); returns that SHA.

        ``python`` (e.g. ``sys.executable``) replaces the ``#!/usr/bin/env python3`` shebang by that
        interpreter: a launcher such as a pyenv shim adds variables (``PYENV_*``, ``SHLVL``, ``PWD``) to
        the environment the stand-in sees and reports, which a test of the spawn environment must avoid.
        """
        content = standin_bytes()
        if python is not None:
            if not python.startswith("/") or any(c.isspace() for c in python):
                raise ValueError("python must be an absolute path without spaces")
            content = f"#!{python}\n".encode() + content.split(b"\n", 1)[1]
        content += f"\n# stand-in variant {tag}\n".encode()
        return self.publish_remote(content, suffixes=suffixes, latest=latest)

    def publish_tampered(self, *, sha: Optional[str] = None, suffixes: Optional[Sequence[str]] = None) -> str:
        """Publish an artifact whose bytes do not match its ``.sha256`` (the digest served is the
        genuine stand-in's); returns its SHA. A worker must refuse to run it."""
        content = standin_bytes() + b"\n# tampered after signing\n"
        return self.publish_remote(
            content,
            sha=sha or version_id(content),
            suffixes=suffixes,
            published_sha256=sha256_hex(standin_bytes()),
        )

    def set_latest(
        self, sha: str, *, suffixes: Optional[Sequence[str]] = None, check: bool = True
    ) -> dict[str, str]:
        """Point ``latest_<suffix>`` at ``sha``; ``check=False`` allows any text (to test clients)."""
        body = {"sha": sha, "suffixes": list(suffixes) if suffixes is not None else None, "check": check}
        result = self._call("POST", "/dist/latest", f"set latest to {sha}", body=body)
        return dict(result["latest"])
