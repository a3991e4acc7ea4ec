"""Errors raised by the fleet client.

Every error names the operation and the object, and carries the HTTP status and the server's ``detail``,
so a caller can print one clear line: ``Could not claim session devin-123: 409 Session is already claimed``.
Messages never contain a token.
"""

from __future__ import annotations

from typing import Optional


class FleetError(Exception):
    """Base class: something went wrong talking to the fleet API."""

    def __init__(self, operation: str, detail: str, status: Optional[int] = None) -> None:
        self.operation = operation
        self.detail = detail
        self.status = status
        prefix = f"{status} " if status is not None else ""
        super().__init__(f"Could not {operation}: {prefix}{detail}")


class FleetConnectionError(FleetError):
    """The API could not be reached (DNS, TCP, TLS, timeout)."""


class FleetCutShort(FleetConnectionError):
    """A request cut at the deadline a stopping program gave every request (``FleetClient.cut_requests``,
    after a second signal): no further attempt is made."""


class FleetAuthError(FleetError):
    """401 (unknown or missing token) or 403 (token lacks the scope). Retrying does not help."""


class FleetNotFound(FleetError):
    """404: the object does not exist (or was tombstoned)."""


class FleetConflict(FleetError):
    """409: a claim lost the race, a release by a non-holder, or a duplicate name."""


class FleetInvalid(FleetError):
    """400/422: the request was rejected as invalid."""


class FleetServerError(FleetError):
    """429 or 5xx after the retries ran out."""


class FleetProtocolError(FleetError):
    """The server answered something that does not match the contract."""


class FleetRedirect(FleetError):
    """A 3xx answer. Never followed (the token would travel to wherever it points) and never retried:
    it means ``api_url`` is not the API's base URL, which waiting does not fix."""


def error_for_status(status: int) -> type[FleetError]:
    """The exception class for an HTTP error status."""
    if status in (401, 403):
        return FleetAuthError
    if status == 404:
        return FleetNotFound
    if status == 409:
        return FleetConflict
    if status in (400, 422):
        return FleetInvalid
    if status == 429 or status >= 500:
        return FleetServerError
    return FleetError
