"""Bearer-token authentication and scope checks for the fleet API and the admin API.

Order of checks, as on the real service: a missing or unknown token is a 401 ``Invalid token``; a token
without the needed scope is a 403 that names the scope; only then are the request and the object looked
at (so a token of another account or scope cannot probe which ids exist). Tokens are never logged or echoed.
"""

from __future__ import annotations

import hmac
from typing import Optional

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from devin_outposts_sim.errors import INVALID_TOKEN, Forbidden, Unauthorized
from devin_outposts_sim.state.accounts import MACHINE_SCOPE, ORCHESTRATOR_SCOPE, Principal
from devin_outposts_sim.state.store import Store

#: The role permission that grants each scope (docs/fleet-api.md §1.2), for readable 403s.
ROLE_OF_SCOPE = {
    MACHINE_SCOPE: "Use outpost machine",
    ORCHESTRATOR_SCOPE: "Manage outposts",
}


def bearer_token(request: Request) -> Optional[str]:
    header = request.headers.get("authorization", "")
    scheme, _sep, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


async def authenticate(request: Request, store: Store, scope: str, action: str) -> Principal:
    """The caller's principal, or 401/403. ``action`` completes "... required to <action>"."""
    token = bearer_token(request)
    if token is None:
        raise Unauthorized(INVALID_TOKEN)
    # A token seen before is answered from memory, without a trip to the thread pool.
    accounts = store.accounts
    principal = accounts.cached_principal(token) or await run_in_threadpool(accounts.authenticate, token)
    if principal is None:
        raise Unauthorized(INVALID_TOKEN)
    if not principal.has(scope):
        raise Forbidden(
            f"Token lacks the {scope} scope ({ROLE_OF_SCOPE.get(scope, scope)}), required to {action}"
        )
    return principal


def require_admin(request: Request, admin_token: str) -> None:
    token = bearer_token(request)
    if token is None or not hmac.compare_digest(token.encode(), admin_token.encode()):
        raise Unauthorized("Invalid admin token")
