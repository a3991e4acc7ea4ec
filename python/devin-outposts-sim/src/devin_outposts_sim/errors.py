"""Errors the simulator answers with. Each maps to one HTTP status and a ``{"detail": "..."}`` body."""

from __future__ import annotations


class SimError(Exception):
    """A request the simulator refuses. ``detail`` is what goes into the response body."""

    status = 500

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class Unauthorized(SimError):
    status = 401


class Forbidden(SimError):
    status = 403


class NotFound(SimError):
    status = 404


class Conflict(SimError):
    status = 409


class Invalid(SimError):
    status = 422


#: The exact ``detail`` strings of the real service (docs/fleet-api.md §4), shared by the routes and the
#: tests.
INVALID_TOKEN = "Invalid token"  # noqa: S105 - an error message, not a secret
SESSION_NOT_FOUND = "Session not found in queue"
ALREADY_CLAIMED = "Session is already claimed"
NOT_CLAIMED_BY_ACCEPTOR = "Session is not claimed by this acceptor"
OUTPOST_NOT_FOUND = "Outpost not found"
ORG_NOT_FOUND = "Organization not found"
