"""Async client for the Outposts fleet API (contract section 3) and the organization default platform (6).

One :class:`FleetClient` owns the connection: base URL, bearer token, timeouts (each request has a total
deadline beside its per-read timeout, and the watch an idle one: :mod:`.deadlines`), TLS verification, the CA
bundle and proxies (both from the environment, as httpx reads ``SSL_CERT_FILE``, ``HTTPS_PROXY`` and
``NO_PROXY``), bounded retries on 429/5xx and connection errors (waiting the one backoff of
:mod:`.backoff`), both pagination envelopes, the SSE watch (read by :mod:`.stream`, the one reader of the
stream) and error mapping. Methods return the pydantic models of :mod:`devin_outposts.api.models`. It reads
none of our variables: the URL and the token are given (the programs' option tables and the command line
read them, with the token's one reader, ``core/tokenfile.py``).

Usage::

    async with FleetClient(api_url, token) as client:
        entries, cursor = await client.list_all_devins(outpost="outpost_env-...", phase="pending")
        async for event in client.watch_devins(outpost="outpost_env-...", cursor=cursor):
            ...
"""

from __future__ import annotations

import logging
import random
import sys
from collections.abc import AsyncIterator, Mapping
from typing import Any, Optional

# httpx imports its command-line client (rich, click, pygments: about 5 MiB resident) whenever those
# happen to be installed, and falls back to a stub when that import fails. Nothing here uses it, so
# make the import fail: a None entry in sys.modules makes ``import httpx._main`` raise ImportError.
if "httpx" not in sys.modules:
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
import httpx

from devin_outposts import __version__
from devin_outposts.api.backoff import backoff_delay
from devin_outposts.api.deadlines import DeadlinePassed, Deadlines, Idle
from devin_outposts.api.decode import UndecodableReply, decode
from devin_outposts.api.errors import (
    FleetConflict,
    FleetConnectionError,
    FleetCutShort,
    FleetError,
    FleetNotFound,
    FleetProtocolError,
    FleetRedirect,
    error_for_status,
)
from devin_outposts.api.limits import (
    ACCEPT_ENCODING,
    MAX_BODY_BYTES,
    ResponseTooLarge,
    UndecodableBody,
    decoded_chunks,
    read_capped,
)
from devin_outposts.api.listwatch import Listing, PagingStalled
from devin_outposts.api.models import (
    DefaultPlatform,
    Outpost,
    OutpostList,
    QueueEntry,
    QueueList,
    WatchEvent,
)
from devin_outposts.api.stream import EVENT_STREAM, EventStreamReader, EventStreamTooLarge, watch_params
from devin_outposts.api.transport import (
    DEFAULT_API_URL,
    MAX_PAGE_SIZE,
    RETRY_STATUSES,
    Reply,
    VerifyType,
    check_page_size,
    normalize_api_url,
    path_segment,
    reply_detail,
    retry_after,
    tls_context,
)

log = logging.getLogger(__name__)

QUEUE_PATH = "/opbeta/outposts/devins"
#: The documented outposts CRUD path; the simulator also serves ``/opbeta/outposts`` and ``…/pools``.
OUTPOSTS_PATH = "/opbeta/outposts/outposts"


class FleetClient:
    """Async client for one account's fleet API. Use as an async context manager or call :meth:`aclose`.

    ``timeout`` limits each read and write (``connect_timeout`` the connection); ``deadline`` one request as a
    whole, from its connection to the last byte of its answer (each retry has its own); the watch has no
    total deadline but ``watch_idle_timeout``: no event and no keepalive for that long fails it.
    """

    def __init__(
        self,
        api_url: str = DEFAULT_API_URL,
        token: Optional[str] = None,
        *,
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        deadline: float = 30.0,
        watch_idle_timeout: float = 60.0,
        verify: VerifyType = True,
        retries: int = 3,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        self.api_url = normalize_api_url(api_url)
        self._token = token
        self._retries = max(0, retries)
        self._backoff_base = backoff_base
        self._backoff_max = backoff_max
        self._watch_timeout = httpx.Timeout(timeout, connect=connect_timeout, read=watch_idle_timeout)
        self._watch_idle = watch_idle_timeout
        self._deadlines = Deadlines(deadline)
        headers = {"User-Agent": f"devin-outposts/{__version__}", "Accept": "application/json"}
        headers["Accept-Encoding"] = ACCEPT_ENCODING  # what limits.py decodes, within its caps
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.AsyncClient(
            base_url=self.api_url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            verify=verify,
            transport=transport,
            trust_env=True,
        )

    async def __aenter__(self) -> FleetClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    def __repr__(self) -> str:  # never show the token
        return f"FleetClient(api_url={self.api_url!r}, token={'set' if self._token else 'unset'})"

    def cut_requests(self, within: float) -> None:
        """Every request in flight, and every one made from now on, ends within ``within`` seconds (what a
        second signal gives the releases still to make); one past that moment fails with
        :class:`FleetCutShort` and is not retried. The watch is not cut: a stopping program closes it."""
        self._deadlines.cut(within)

    # --- transport --------------------------------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        """The wait before retry ``attempt``: between half and all of ``min(max, base * 2**attempt)``."""
        # S311: spreading retries, not a secret.
        return backoff_delay(attempt, self._backoff_base, self._backoff_max, random.random())  # noqa: S311

    async def _request(
        self,
        method: str,
        path: str,
        operation: str,
        *,
        params: Optional[Mapping[str, Any]] = None,
        body: Optional[Mapping[str, Any]] = None,
        replay_safe: bool = True,
    ) -> Reply:
        """Send one request with bounded retries; raise the mapped :class:`FleetError` on failure.

        ``replay_safe=False`` (outpost creation) retries only when the server cannot have acted on the
        request: a refused connection or a 429. Claims and releases are safe to replay because a
        re-claim by the same acceptor is a renewal and a repeated release answers 409/404.
        """
        clean_params = {k: v for k, v in (params or {}).items() if v is not None}
        attempt = 0
        while True:
            try:
                response = await self._deadlines.run(
                    self._send(method, path, operation, params=clean_params, body=body)
                )
            except DeadlinePassed as exc:
                if exc.cut:
                    raise FleetCutShort(operation, str(exc)) from None
                if attempt >= self._retries or not replay_safe:  # it was sent: the server may have acted
                    raise FleetConnectionError(operation, str(exc)) from None
                delay = self._backoff(attempt)
                log.debug("retrying %s after %s (%.2fs)", operation, exc, delay)
            except httpx.TransportError as exc:
                unsent = isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
                if attempt >= self._retries or not (replay_safe or unsent):
                    raise FleetConnectionError(operation, f"{type(exc).__name__}: {exc}") from exc
                delay = self._backoff(attempt)
                log.debug("retrying %s after %s (%.2fs)", operation, type(exc).__name__, delay)
            else:
                if 300 <= response.status_code < 400:
                    # Never followed: the token must not travel to wherever a redirect points.
                    location = response.headers.get("Location") or "another URL"
                    raise FleetRedirect(
                        operation,
                        f"redirected to {location}; set api_url to the API's base URL",
                        response.status_code,
                    )
                if response.status_code < 400:
                    return response
                retryable = response.status_code in RETRY_STATUSES and (
                    replay_safe or response.status_code == 429
                )
                if not retryable or attempt >= self._retries:
                    raise error_for_status(response.status_code)(
                        operation, reply_detail(response), response.status_code
                    )
                after = retry_after(response)
                delay = self._backoff(attempt) if after is None else after
                log.debug("retrying %s after HTTP %s (%.2fs)", operation, response.status_code, delay)
            attempt += 1
            await self._deadlines.pause(delay)

    async def _send(
        self,
        method: str,
        path: str,
        operation: str,
        *,
        params: Mapping[str, Any],
        body: Optional[Mapping[str, Any]],
    ) -> Reply:
        """One request; the reply read within the size limit (a larger one is a protocol error). Run by
        :meth:`_request` within the request's deadline."""
        request = self._http.build_request(method, path, params=params, json=body)
        response = await self._http.send(request, stream=True)
        try:
            content = await read_capped(response, MAX_BODY_BYTES)
        except (ResponseTooLarge, UndecodableBody) as exc:
            raise FleetProtocolError(operation, str(exc), response.status_code) from exc
        finally:
            await response.aclose()
        return Reply(response.status_code, response.headers, content, response.reason_phrase)

    @staticmethod
    def _parse(model: Any, response: Reply, operation: str) -> Any:
        """The reply as ``model``; any decoding failure is one :class:`FleetProtocolError`."""
        try:
            return decode(model, response.content)
        except UndecodableReply as exc:
            raise FleetProtocolError(operation, exc.reason, response.status_code) from exc

    # --- queue ------------------------------------------------------------------------------------

    async def list_devins(
        self,
        *,
        outpost: Optional[str] = None,
        phase: Optional[str] = None,
        acceptor_id: Optional[str] = None,
        first: int = 100,
        cursor: Optional[str] = None,
    ) -> QueueList:
        """One page of ``GET /opbeta/outposts/devins``."""
        check_page_size(first)
        operation = f"list sessions{f' on outpost {outpost}' if outpost else ''}"
        params = {"outpost": outpost, "phase": phase, "acceptor_id": acceptor_id, "first": first}
        params["cursor"] = cursor
        response = await self._request("GET", QUEUE_PATH, operation, params=params)
        result: QueueList = self._parse(QueueList, response, operation)
        return result

    async def list_all_devins(
        self,
        *,
        outpost: Optional[str] = None,
        phase: Optional[str] = None,
        acceptor_id: Optional[str] = None,
        first: int = 100,
        cursor: Optional[str] = None,
    ) -> tuple[list[QueueEntry], Optional[str]]:
        """Every matching entry across pages, upserted by session id, and the final cursor.

        Rows at a page boundary come back on the next page; the later copy wins because it is fresher.
        The returned cursor is the place to start a watch from.
        """
        listing: Listing[QueueEntry] = Listing(cursor)  # the paging rules every client follows
        while True:
            page = await self.list_devins(
                outpost=outpost, phase=phase, acceptor_id=acceptor_id, first=first, cursor=listing.cursor
            )
            try:
                rows = ((entry.session_id, entry) for entry in page.items)
                more = listing.add_page(rows, page.cursor, page.has_next_page)
            except PagingStalled as exc:
                raise FleetProtocolError("list sessions", str(exc)) from None
            if not more:
                return listing.rows, listing.cursor

    async def watch_devins(
        self, *, outpost: Optional[str] = None, cursor: Optional[str] = None
    ) -> AsyncIterator[WatchEvent]:
        """Stream ``MODIFIED``/``DELETED`` events until the server ends the stream.

        Streams end after at most a few minutes by design, so callers reconnect with the last event's
        cursor. A connection or HTTP error raises :class:`FleetError` (no retry here: the caller's
        reconnect loop owns the backoff).
        """
        operation = f"watch sessions{f' on outpost {outpost}' if outpost else ''}"
        headers = {"Accept": EVENT_STREAM}
        try:
            request = self._http.build_request(
                "GET",
                QUEUE_PATH,
                params=watch_params(outpost, cursor),
                headers=headers,
                timeout=self._watch_timeout,
            )
            # Its answer's head, and an error's body, within the deadline of any request; then the stream.
            response = await self._deadlines.run(self._http.send(request, stream=True))
            try:
                if response.status_code >= 400:
                    content = await self._deadlines.run(read_capped(response, MAX_BODY_BYTES))
                    reply = Reply(response.status_code, response.headers, content, response.reason_phrase)
                    raise error_for_status(response.status_code)(
                        operation, reply_detail(reply), response.status_code
                    )
                reader, idle, received = EventStreamReader(), Idle(self._watch_idle), 0
                async for chunk in decoded_chunks(response):
                    events = reader.feed(chunk)
                    received += len(events)
                    idle.progress(received + reader.comments)
                    if idle.expired:
                        why = f"watch stream: no event and no keepalive for {idle.seconds:g}s"
                        raise FleetConnectionError(operation, why)
                    for event in events:
                        yield self._parse_event(event.data, operation)
            finally:
                await response.aclose()
        except DeadlinePassed as exc:
            raise FleetConnectionError(operation, str(exc)) from None
        except httpx.TransportError as exc:
            raise FleetConnectionError(operation, f"{type(exc).__name__}: {exc}") from exc
        except (ResponseTooLarge, UndecodableBody) as exc:
            raise FleetProtocolError(operation, f"watch stream: {exc}") from exc
        except EventStreamTooLarge as exc:
            raise FleetProtocolError(operation, str(exc)) from exc

    @staticmethod
    def _parse_event(data: str, operation: str) -> WatchEvent:
        try:
            return decode(WatchEvent, data)
        except UndecodableReply as exc:
            raise FleetProtocolError(operation, f"malformed watch event: {exc.reason}") from exc

    async def get_devin(self, session_id: str) -> QueueEntry:
        """``GET …/devins/{id}``; raises :class:`FleetNotFound` once the entry is gone."""
        operation = f"get session {session_id}"
        response = await self._request("GET", f"{QUEUE_PATH}/{path_segment(session_id)}", operation)
        result: QueueEntry = self._parse(QueueEntry, response, operation)
        return result

    async def claim(self, session_id: str, acceptor_id: str) -> QueueEntry:
        """Claim (or renew, when ``acceptor_id`` already holds it). Losers get :class:`FleetConflict`."""
        operation = f"claim session {session_id}"
        response = await self._request(
            "POST",
            f"{QUEUE_PATH}/{path_segment(session_id)}/claim",
            operation,
            body={"acceptor_id": acceptor_id},
        )
        result: QueueEntry = self._parse(QueueEntry, response, operation)
        return result

    async def release(
        self, session_id: str, acceptor_id: str, *, missing_ok: bool = True
    ) -> Optional[QueueEntry]:
        """Return a claimed session to the queue.

        With ``missing_ok`` (the default) a 409 (not ours any more) or 404 (tombstoned) is treated as
        "already released", as the contract recommends, and returns ``None``.
        """
        operation = f"release session {session_id}"
        try:
            response = await self._request(
                "POST",
                f"{QUEUE_PATH}/{path_segment(session_id)}/release",
                operation,
                body={"acceptor_id": acceptor_id},
            )
        except (FleetConflict, FleetNotFound):
            if missing_ok:
                return None
            raise
        result: QueueEntry = self._parse(QueueEntry, response, operation)
        return result

    # --- outposts ---------------------------------------------------------------------------------

    async def list_outposts(self, *, first: int = 100, after: Optional[str] = None) -> OutpostList:
        check_page_size(first)
        operation = "list outposts"
        response = await self._request(
            "GET", OUTPOSTS_PATH, operation, params={"first": first, "after": after}
        )
        result: OutpostList = self._parse(OutpostList, response, operation)
        return result

    async def list_all_outposts(self, *, page_size: int = MAX_PAGE_SIZE) -> list[Outpost]:
        """Every outpost of the account, following ``end_cursor`` until ``has_next_page`` is false."""
        found: dict[str, Outpost] = {}
        after: Optional[str] = None
        while True:
            page = await self.list_outposts(first=page_size, after=after)
            for outpost in page.items:
                found[outpost.outpost_id] = outpost
            if not page.has_next_page:
                return list(found.values())
            if page.end_cursor is None or page.end_cursor == after:
                raise FleetProtocolError(
                    "list outposts", "the API reported another page but did not advance end_cursor"
                )
            after = page.end_cursor

    async def find_outpost(self, name_or_id: str) -> Optional[Outpost]:
        """The outpost with this id or name, or ``None``. Uses the list, which a machine token may read."""
        for outpost in await self.list_all_outposts():
            if name_or_id in (outpost.outpost_id, outpost.name):
                return outpost
        return None

    async def get_outpost(self, outpost_id: str) -> Outpost:
        operation = f"get outpost {outpost_id}"
        response = await self._request("GET", f"{OUTPOSTS_PATH}/{path_segment(outpost_id)}", operation)
        result: Outpost = self._parse(Outpost, response, operation)
        return result

    async def create_outpost(
        self, name: str, *, platform: Optional[str] = None, description: Optional[str] = None
    ) -> Outpost:
        operation = f"create outpost {name}"
        body: dict[str, Any] = {"name": name, "platform": platform}
        if description is not None:
            body["description"] = description
        response = await self._request("POST", OUTPOSTS_PATH, operation, body=body, replay_safe=False)
        result: Outpost = self._parse(Outpost, response, operation)
        return result

    async def delete_outpost(self, outpost_id: str, *, missing_ok: bool = False) -> bool:
        """Delete an outpost. Returns False when it was already gone and ``missing_ok`` is set."""
        operation = f"delete outpost {outpost_id}"
        try:
            await self._request("DELETE", f"{OUTPOSTS_PATH}/{path_segment(outpost_id)}", operation)
        except FleetNotFound:
            if missing_ok:
                return False
            raise
        return True

    # --- organization default platform ------------------------------------------------------------

    async def get_default_platform(self, org_id: str) -> DefaultPlatform:
        operation = f"get the default platform of organization {org_id}"
        response = await self._request(
            "GET", f"/v3beta1/organizations/{path_segment(org_id)}/default-platform", operation
        )
        result: DefaultPlatform = self._parse(DefaultPlatform, response, operation)
        return result

    async def set_default_platform(
        self, org_id: str, *, platform: Optional[str] = None, outpost_pool_id: Optional[str] = None
    ) -> DefaultPlatform:
        """Set (or, with neither argument, clear) the organization's default platform."""
        if platform is not None and outpost_pool_id is not None:
            raise ValueError("give at most one of platform and outpost_pool_id")
        operation = f"set the default platform of organization {org_id}"
        response = await self._request(
            "PUT",
            f"/v3beta1/organizations/{path_segment(org_id)}/default-platform",
            operation,
            body={"platform": platform, "outpost_pool_id": outpost_pool_id},
        )
        result: DefaultPlatform = self._parse(DefaultPlatform, response, operation)
        return result


__all__ = [
    "DEFAULT_API_URL",
    "MAX_PAGE_SIZE",
    "OUTPOSTS_PATH",
    "QUEUE_PATH",
    "FleetClient",
    "FleetError",
    "normalize_api_url",
    "tls_context",
]
