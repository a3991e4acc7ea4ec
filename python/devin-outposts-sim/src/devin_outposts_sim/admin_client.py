"""A small synchronous client of the simulator's ``/_sim`` admin API (httpx only, no server deps).

::

    admin = SimAdmin("http://127.0.0.1:8787", admin_token)
    token = admin.create_token("orchestrator")           # an API token of account acct-default
    outpost = admin.create_outpost("rhel", "linux")       # or create it through the fleet API
    entry = admin.enqueue(outpost.outpost_id)             # the "brain" queues a session
    admin.set_status(entry.session_id, "running")
    admin.tombstone(entry.session_id)
    history = admin.claims(session_id=entry.session_id)   # claim/renew/release/expire/tombstone records
    admin.add_calls(entry.session_id, [tools.run("make")])  # the brain: see admin_remote.py

Failures raise :class:`SimAdminError`, whose message names the operation, the status and the detail.
The admin token is never part of a message or ``repr``.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Union

import httpx

from devin_outposts.api.models import Outpost, QueueEntry
from devin_outposts_sim.accounts import DEFAULT_ACCOUNT
from devin_outposts_sim.admin_remote import RemoteAdmin
from devin_outposts_sim.cli_dist import CliDistAdmin


class SimAdminError(Exception):
    """An admin call failed: ``status`` is the HTTP status (None if the simulator was unreachable)."""

    def __init__(self, operation: str, detail: str, status: Optional[int] = None) -> None:
        self.operation = operation
        self.detail = detail
        self.status = status
        prefix = f"{status} " if status is not None else ""
        super().__init__(f"Could not {operation}: {prefix}{detail}")


class SimAdmin(RemoteAdmin, CliDistAdmin):
    """Synchronous admin client. Use as a context manager, or call :meth:`close`.

    The brain (tool calls, remote connections, ending sessions) and the ``devin-remote`` distribution
    methods are in :class:`~devin_outposts_sim.admin_remote.RemoteAdmin`.
    """

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

    def _error(self, operation: str, detail: str) -> Exception:
        return SimAdminError(operation, detail)

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

    def reset(self) -> None:
        """Delete every account, token, outpost, session and record."""
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

    def create_org(self, *, account: str = DEFAULT_ACCOUNT) -> str:
        result = self._call(
            "POST", "/orgs", f"create an organization in account {account}", body={"account_id": account}
        )
        return str(result["org_id"])

    def orgs(self, *, account: Optional[str] = None) -> list[dict[str, Any]]:
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
