"""The client of the simulator's ``/_sim`` admin API: one synchronous class over HTTP (httpx only, no
server dependencies).

::

    admin = SimAdmin("http://127.0.0.1:8787", admin_token)
    token = admin.create_token("orchestrator")           # an API token of account acct-default
    outpost = admin.create_outpost("rhel", "linux")       # or create it through the fleet API
    entry = admin.enqueue(outpost.outpost_id)             # the "brain" queues a session
    admin.set_status(entry.session_id, "running")
    admin.tombstone(entry.session_id)
    history = admin.claims(session_id=entry.session_id)   # claim/renew/release/expire/tombstone records

    # the brain (tool calls from devin_outposts_sim.remote.tools) and the devin-remote distribution
    sha = admin.publish_standin_variant("v2", latest=True)  # another working build; now latest
    bad = admin.publish_tampered()                  # its .sha256 does not match its bytes
    admin.add_calls(sid, [tools.run("echo hi"), tools.read("notes.txt")])
    admin.wait_connection(sid)                      # what the remote reported: pid, cwd, env, version
    calls = admin.wait_calls(sid)                   # every call done: call["result"]["exit_code"], ...
    admin.end_session(sid, "terminated")            # the remote exits 0

    # the official Devin CLI distribution
    admin.publish_cli("1.2.3")                      # the stand-in devin 1.2.3, every platform
    admin.publish_cli("9.9.9", tampered=True)       # its .sha256 does not match its bytes
    admin.cli_base_url                              # the role's devin_outposts_cli_base_url

Failures raise :class:`SimAdminError`, whose message names the operation, the status and the detail.
The admin token is never part of a message or ``repr``.

Why one class: every method is one admin request through :meth:`SimAdmin._call`; there is one transport
(in-process tests use :class:`~devin_outposts_sim.state.store.Store` directly, not a client).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from typing import Any, Optional, Union

import httpx

from devin_outposts.api.models import Outpost, QueueEntry
from devin_outposts_sim.state.accounts import DEFAULT_ACCOUNT
from devin_outposts_sim.state.cli_dist import PREFIX as CLI_PREFIX
from devin_outposts_sim.state.dist import sha256_hex, standin_bytes, version_id

#: Seconds one admin long poll may last; longer waits are several polls.
POLL_SLICE = 25.0


class SimAdminError(Exception):
    """An admin call failed: ``status`` is the HTTP status (None if the simulator was unreachable)."""

    def __init__(self, operation: str, detail: str, status: Optional[int] = None) -> None:
        self.operation = operation
        self.detail = detail
        self.status = status
        prefix = f"{status} " if status is not None else ""
        super().__init__(f"Could not {operation}: {prefix}{detail}")


class SimAdmin:
    """Synchronous admin client. Use as a context manager, or call :meth:`close`."""

    def __init__(self, url: str, admin_token: str, *, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=timeout
        )

    def __repr__(self) -> str:
        return f"SimAdmin({self.url!r})"

    def __enter__(self) -> SimAdmin:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(
        self,
        method: str,
        path: str,
        operation: str,
        *,
        body: Optional[dict[str, Any]] = None,
        params: Optional[dict[str, Any]] = None,
        timeout: Optional[float] = None,
    ) -> Any:
        clean = {k: v for k, v in (params or {}).items() if v is not None}
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        try:
            response = self._http.request(method, f"/_sim{path}", json=body, params=clean, **extra)
        except httpx.TransportError as exc:
            raise SimAdminError(
                operation, f"simulator unreachable at {self.url} ({type(exc).__name__})"
            ) from exc
        if response.status_code >= 400:
            try:
                detail = str(response.json().get("detail", response.text))
            except ValueError:
                detail = response.text[:200]
            raise SimAdminError(operation, detail, response.status_code)
        return response.json()

    # --- health and settings ----------------------------------------------------------------------

    def health(self) -> bool:
        """True when the simulator answers (this route needs no admin token)."""
        try:
            return bool(self._call("GET", "/health", "check simulator health").get("status") == "ok")
        except SimAdminError:
            return False

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Poll :meth:`health` until it answers, or raise after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.health():
            if time.monotonic() > deadline:
                raise SimAdminError("reach the simulator", f"no answer from {self.url} within {timeout}s")
            time.sleep(0.05)

    def config(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/config", "read the simulator config")
        return result

    def set_tombstone_after(self, seconds: Optional[float]) -> dict[str, Any]:
        """Tombstone ended sessions ``seconds`` after their end (None: never), from now on and for those
        already ended; a :meth:`reset` restores the configured value. Returns the settings."""
        result: dict[str, Any] = self._call(
            "PUT", "/config", "set tombstone_after", body={"tombstone_after": seconds}
        )
        return result

    def reset(self) -> None:
        """Delete every account, token, outpost, session and record (and restore ``tombstone_after``)."""
        self._call("POST", "/reset", "reset the simulator")

    # --- accounts, tokens, organizations ---------------------------------------------------------

    def create_token_info(
        self,
        scope: Union[str, list[str]] = "machine",
        *,
        account: str = DEFAULT_ACCOUNT,
        label: Optional[str] = None,
    ) -> dict[str, Any]:
        """Issue an API token; returns ``token``, ``account_id``, ``scopes`` and ``default_org_id``.

        ``scope`` is ``machine``, ``orchestrator``, a full scope name, or a list of them (``[]`` for a
        token with no outposts scope at all).
        """
        scopes = [scope] if isinstance(scope, str) else list(scope)
        body = {"scopes": scopes, "account_id": account, "label": label}
        result: dict[str, Any] = self._call(
            "POST", "/tokens", f"create a token for account {account}", body=body
        )
        return result

    def create_token(
        self, scope: Union[str, list[str]] = "machine", *, account: str = DEFAULT_ACCOUNT
    ) -> str:
        """Issue an API token and return it (see :meth:`create_token_info`)."""
        return str(self.create_token_info(scope, account=account)["token"])

    def create_org_info(
        self, *, account: str = DEFAULT_ACCOUNT, name: Optional[str] = None
    ) -> dict[str, Any]:
        """Create an organization; returns its ``org_id``, ``account_id`` and ``name``.

        Without ``name`` the simulator names it ``Organization <n>`` (``n``: its place in the account, the
        default organization being 1). Names need not be unique.
        """
        body: dict[str, Any] = {"account_id": account}
        if name is not None:
            body["name"] = name
        result: dict[str, Any] = self._call(
            "POST", "/orgs", f"create an organization in account {account}", body=body
        )
        return result

    def create_org(self, *, account: str = DEFAULT_ACCOUNT, name: Optional[str] = None) -> str:
        """Create an organization and return its id (see :meth:`create_org_info`)."""
        return str(self.create_org_info(account=account, name=name)["org_id"])

    def orgs(self, *, account: Optional[str] = None) -> list[dict[str, Any]]:
        """The organizations (of ``account``, or of every account) in creation order: ``org_id``,
        ``account_id``, ``name`` and ``default``."""
        result = self._call("GET", "/orgs", "list organizations", params={"account_id": account})
        return list(result["items"])

    def default_org(self, *, account: str = DEFAULT_ACCOUNT) -> str:
        """The organization created with the account (the account is created now if it is new)."""
        result = self._call("POST", "/accounts", f"create account {account}", body={"account_id": account})
        return str(result["default_org_id"])

    # --- outposts and the queue ------------------------------------------------------------------

    def create_outpost(
        self,
        name: str,
        platform: Optional[str] = None,
        description: Optional[str] = None,
        *,
        account: str = DEFAULT_ACCOUNT,
    ) -> Outpost:
        body = {"name": name, "platform": platform, "description": description, "account_id": account}
        return Outpost.model_validate(self._call("POST", "/outposts", f"create outpost {name}", body=body))

    def enqueue(
        self,
        outpost_id: str,
        *,
        session_id: Optional[str] = None,
        kind: str = "new",
        platform: Optional[str] = None,
        remote_binary_sha: Optional[str] = None,
        session_status: Optional[str] = None,
        network_policy: Optional[dict[str, Any]] = None,
    ) -> QueueEntry:
        """Queue a session (``devin-<hex>`` unless ``session_id`` is given) on an outpost."""
        body = {
            "outpost_id": outpost_id,
            "session_id": session_id,
            "kind": kind,
            "platform": platform,
            "remote_binary_sha": remote_binary_sha,
            "session_status": session_status,
            "network_policy": network_policy,
        }
        data = self._call("POST", "/sessions", f"enqueue a session on outpost {outpost_id}", body=body)
        return QueueEntry.model_validate(data)

    def set_status(self, session_id: str, session_status: str) -> QueueEntry:
        data = self._call(
            "POST",
            f"/sessions/{session_id}/status",
            f"set the status of session {session_id}",
            body={"session_status": session_status},
        )
        return QueueEntry.model_validate(data)

    def tombstone(self, session_id: str) -> QueueEntry:
        data = self._call("POST", f"/sessions/{session_id}/tombstone", f"tombstone session {session_id}")
        return QueueEntry.model_validate(data)

    def session(self, session_id: str) -> dict[str, Any]:
        """The simulator's view of one row (tombstoned too): ``entry``, ``deleted``, ``rev``, ..."""
        result: dict[str, Any] = self._call("GET", f"/sessions/{session_id}", f"read session {session_id}")
        return result

    def sessions(
        self, *, outpost_id: Optional[str] = None, include_deleted: bool = False
    ) -> list[dict[str, Any]]:
        params = {"outpost_id": outpost_id, "include_deleted": "true" if include_deleted else None}
        return list(self._call("GET", "/sessions", "list sessions", params=params)["items"])

    # --- records ---------------------------------------------------------------------------------

    def claims(
        self,
        *,
        session_id: Optional[str] = None,
        outpost_id: Optional[str] = None,
        acceptor_id: Optional[str] = None,
        account: Optional[str] = None,
    ) -> list[dict[str, Any]]:
        """The claim history, oldest first: one record per claim, renew, release, expire or tombstone."""
        params = {
            "session_id": session_id,
            "outpost_id": outpost_id,
            "acceptor_id": acceptor_id,
            "account_id": account,
        }
        return list(self._call("GET", "/claims", "read the claim history", params=params)["items"])

    def check_connect_token(self, session_id: str, token: str) -> bool:
        """Whether a gateway would accept ``token`` for ``session_id`` right now."""
        body = {"session_id": session_id, "token": token}
        return bool(self._call("POST", "/connect-tokens/check", "check a connect token", body=body)["valid"])

    # --- the brain -------------------------------------------------------------------------------

    def add_calls(self, session_id: str, calls: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Append tool calls (see :mod:`devin_outposts_sim.remote.tools`); returns them with their ``id``."""
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
                raise SimAdminError(
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
                raise SimAdminError(operation, f"{len(items)} of {count} connections after {timeout:g}s")

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

    # --- the official Devin CLI distribution ------------------------------------------------------

    @property
    def cli_base_url(self) -> str:
        """The base URL that serves this simulator's CLI artifacts."""
        return f"{self.url}{CLI_PREFIX}/"

    def cli_dist(self) -> dict[str, Any]:
        """``prefix``, ``platforms`` and ``artifacts`` (version, platform, path, sha256, tampered, ...)."""
        result: dict[str, Any] = self._call("GET", "/cli", "read the CLI distribution")
        return result

    def publish_cli(
        self,
        version: str,
        *,
        content: Optional[bytes] = None,
        platforms: Optional[list[str]] = None,
        tampered: bool = False,
    ) -> list[dict[str, Any]]:
        """Publish ``content`` (default: the stand-in of ``version``); returns the artifacts.
        ``tampered`` serves a ``.sha256`` that does not match the bytes."""
        body: dict[str, Any] = {"version": version, "platforms": platforms, "tampered": tampered}
        if content is not None:
            body["content_b64"] = base64.b64encode(content).decode()
        result = self._call("POST", "/cli/artifacts", f"publish the devin CLI {version}", body=body)
        return list(result["artifacts"])
