# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""The private fleet API client of the devin.outposts collection.

This is the only code in the collection's plugins that talks HTTP. Modules build it with
:meth:`FleetClient.from_module`, plugins (the lookup) with plain keyword arguments. It owns:

* the base URL (``api_url``, default ``https://api.devin.ai``; ``/opbeta/...`` and ``/v3beta1/...`` are
  appended here, a pasted ``.../opbeta/outposts`` suffix is tolerated),
* the bearer token (never logged, never part of a message: every error text is redacted),
* TLS (``validate_certs``, ``ca_path``), the ``timeout`` and the proxy from the environment
  (``HTTPS_PROXY``/``NO_PROXY``, as urllib reads them). ``timeout`` bounds each socket operation, as urllib
  does, and also each request as a whole, from connecting to the last byte of the answer: a server that
  answers a byte at a time never trips a socket timeout (issue 37, S5), so every request runs in a thread of
  its own that is given up at the deadline,
* bounded retries on 429, 5xx and connection errors with the fleet API's one backoff (a random wait between
  half and all of ``min(backoff_max, backoff_base * 2**attempt)``), honouring ``Retry-After``; creating an
  outpost is not replayed after the server may have acted on it,
* both pagination envelopes (outposts and organizations: ``end_cursor``/``after``; queue: ``cursor``, upserted by
  ``metadata.session_id`` because page boundaries repeat rows),
* error mapping into one exception, :class:`FleetAPIError`, whose text names the operation and the object:
  ``Could not create outpost gpu-h200: 403 token lacks scope account.outposts.orchestrator``,
* a cap on what is read of a reply (:data:`MAX_BODY_BYTES`, as the worker's and the event source's clients):
  the body is read a piece at a time, so a gzip body (which ``open_url`` decompresses as it is read, though
  the client never asks for one) is capped before it is decompressed, and a gzip bomb costs at most the cap.

"Not found" is data: lookups return ``None`` and deletes return ``False`` instead of raising.

The leading underscore marks this as internal to the collection; its API may change in any release.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import email.utils
import json
import os
import random
import re
import socket
import ssl
import threading
import time
from http.client import HTTPException
from urllib.error import HTTPError, URLError
from urllib.parse import quote, urlencode

from ansible.module_utils.basic import env_fallback
from ansible.module_utils.common.text.converters import to_native, to_text
from ansible.module_utils.urls import ConnectionError as UrlsConnectionError
from ansible.module_utils.urls import SSLValidationError, open_url

COLLECTION_VERSION = "0.1.0"
DEFAULT_API_URL = "https://api.devin.ai"
DEFAULT_TIMEOUT = 30
OUTPOSTS_PATH = "/opbeta/outposts/outposts"
QUEUE_PATH = "/opbeta/outposts/devins"
DEFAULT_PLATFORM_PATH = "/v3beta1/organizations/{0}/default-platform"
ORGANIZATIONS_PATH = "/v3/enterprise/organizations"
PLATFORMS = ("linux", "macos", "windows")
PHASES = ("pending", "claimed")
OUTPOST_ID_PREFIX = "outpost_env-"
MAX_PAGE_SIZE = 200
#: Outpost names, as the fleet simulator accepts them (``devin_outposts/sim/validate.py``): a letter or digit,
#: then letters, digits, ``.``, ``_`` or ``-``, 63 characters at most. The fleet API documents no rule; its
#: examples (``rhel``, ``gpu-h200``, ``dev-boxes``) all fit. ``\Z``, not ``$``, so that a trailing newline
#: is refused too.
OUTPOST_NAME_MAX = 63
_OUTPOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")
OUTPOST_NAME_RULE = ("an outpost name is 1 to {0} letters, digits, '.', '_' or '-', starting with a letter or "
                     "digit".format(OUTPOST_NAME_MAX))
_SHOWN_MAX = 60
RETRY_STATUSES = frozenset((429, 500, 502, 503, 504))
#: Longest ``Retry-After`` we honour; a longer one is shortened to this.
MAX_RETRY_AFTER = 60.0
_MAX_PAGES = 10000
#: The most of a reply that is read (decoded), and of an error answer (for its detail).
MAX_BODY_BYTES = 8 << 20
MAX_ERROR_BODY_BYTES = 64 << 10
_READ_SIZE = 64 << 10


class FleetAPIError(Exception):
    """Any failure talking to the fleet API.

    ``str(exc)`` is one line for a user: ``Could not <operation>: [<status> ]<detail>``.
    """

    def __init__(self, operation, detail, status=None):
        self.operation = operation
        self.detail = detail
        self.status = status
        prefix = "{0} ".format(status) if status is not None else ""
        super(FleetAPIError, self).__init__("Could not {0}: {1}{2}".format(operation, prefix, detail))

    def to_result(self):
        """Extra keys for ``fail_json``: the HTTP status and the server's detail."""
        return dict(http_status=self.status, detail=self.detail)


def fleet_argument_spec(**extra):
    """The argument spec of the ``devin.outposts.fleet_api`` doc fragment, plus the module's own options."""
    spec = dict(
        api_url=dict(type="str", fallback=(env_fallback, ["DEVIN_API_URL"]), default=DEFAULT_API_URL),
        token=dict(type="str", no_log=True, fallback=(env_fallback, ["DEVIN_OUTPOSTS_TOKEN"])),
        validate_certs=dict(type="bool", default=True),
        ca_path=dict(type="path"),
        timeout=dict(type="float", default=DEFAULT_TIMEOUT),
    )
    spec.update(extra)
    return spec


def normalize_api_url(url):
    """The base URL without a trailing slash or a pasted ``/opbeta[/outposts]`` suffix."""
    text = (url or DEFAULT_API_URL).strip().rstrip("/")
    if not text.startswith(("http://", "https://")):
        raise FleetAPIError("use the fleet API", "api_url must start with https:// or http://, got {0!r}".format(url))
    for suffix in ("/opbeta/outposts", "/opbeta"):
        if text.endswith(suffix):
            text = text[: -len(suffix)]
    return text


def _segment(value):
    """Quote an id as exactly one URL path segment; ``.`` and ``..`` too, which URL handling would collapse."""
    text = to_native(value)
    if text in (".", ".."):
        return text.replace(".", "%2E")
    return quote(text, safe="")


def _check_page_size(operation, page_size):
    try:
        size = int(page_size)
    except (TypeError, ValueError):
        size = None
    if size is None or not 1 <= size <= MAX_PAGE_SIZE:
        raise FleetAPIError(operation, "page size must be between 1 and {0}, got {1}".format(MAX_PAGE_SIZE, page_size))
    return size


def _validation_error(item):
    """One FastAPI validation error as ``loc.path: msg``."""
    if not isinstance(item, dict):
        return to_text(item)
    message = to_text(item.get("msg", json.dumps(item)))
    loc = item.get("loc")
    if isinstance(loc, list) and loc:
        return ".".join(to_text(part) for part in loc) + ": " + message
    return message


def _detail_from_body(raw, fallback):
    """The FastAPI ``detail`` of an error body, else a short piece of the body, else ``fallback``."""
    text = to_text(raw or b"", errors="surrogate_or_replace").strip()
    try:
        body = json.loads(text)
    except ValueError:
        return text[:200] if text else fallback
    if isinstance(body, dict) and "detail" in body:
        detail = body["detail"]
        if isinstance(detail, list):  # FastAPI validation errors
            return "; ".join(_validation_error(item) for item in detail)[:300]
        return detail if isinstance(detail, str) else json.dumps(detail)[:300]
    return text[:200]


def _read_capped(response, limit):
    """The body of ``response``, or None when it is longer than ``limit`` bytes. Read ``_READ_SIZE`` bytes at a
    time: ``open_url`` decompresses a gzip body as it is read, and ``GzipFile.read(n)`` inflates only ``n``
    bytes, so nothing past the cap is ever inflated."""
    parts = []
    size = 0
    while True:
        chunk = response.read(_READ_SIZE)
        if not chunk:
            return b"".join(parts)
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)


def _parse_retry_after(value, now=None):
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date), bounded; else None."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_tz(value)
            if when is None:
                return None
            seconds = email.utils.mktime_tz(when) - (time.time() if now is None else now)
        except (TypeError, ValueError, OverflowError):
            return None
    return max(0.0, min(seconds, MAX_RETRY_AFTER))


#: What OpenSSL says when the bytes that came back are not TLS at all, e.g. a plain-HTTP server's 400 answer
#: to the ClientHello (``WRONG_VERSION_NUMBER`` up to OpenSSL 3.1, ``RECORD_LAYER_FAILURE`` from 3.2,
#: ``PACKET_LENGTH_TOO_LONG``, ``UNKNOWN_PROTOCOL`` in older releases), or when the server hung up instead of
#: answering it.
_NOT_TLS_REASONS = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "UNKNOWN_PROTOCOL",
                    "UNEXPECTED_EOF_WHILE_READING")
_CERT_HOSTNAME_MISMATCH = 62  # X509_V_ERR_HOSTNAME_MISMATCH, as ssl.SSLCertVerificationError.verify_code


def _is_tls_error(reason):
    return isinstance(reason, (ssl.SSLError, ssl.CertificateError, SSLValidationError))


def _tls_detail(api_url, reason):
    """The error text for a failed TLS connection, with the fix that matches the failure.

    Only a certificate that could not be verified is fixed by ``ca_path``. A server that does not speak
    TLS on that port (``https://`` to a plain-HTTP port, or the wrong port) fails the handshake instead,
    and a certificate issued for another host name needs the right host in ``api_url``.
    """
    text = to_text(reason)
    if isinstance(reason, (ssl.CertificateError, SSLValidationError)):  # CertificateError: SSLCertVerificationError
        if getattr(reason, "verify_code", None) == _CERT_HOSTNAME_MISMATCH or "Hostname mismatch" in text:
            hint = "the certificate is not for the host in api_url; use the host name it was issued for"
        else:
            hint = "set ca_path to the CA bundle that signed the API's certificate"
        return "the TLS certificate of {0} was not accepted ({1}): {2}".format(api_url, text, hint)
    if isinstance(reason, ssl.SSLEOFError) or getattr(reason, "reason", None) in _NOT_TLS_REASONS or any(
            "[SSL: {0}]".format(name) in text for name in _NOT_TLS_REASONS):
        return ("no TLS handshake with {0} ({1}): the server did not speak TLS; is api_url https:// where the "
                "server speaks http://, or is the port wrong?".format(api_url, text))
    return "TLS error talking to {0}: {1}".format(api_url, text)


class _Deadline(Exception):
    """A request did not end within its total deadline (its thread is left to finish on its own)."""


class _ErrorAnswer(Exception):
    """An HTTP error answer and its body, read in the request's thread (an error body can drip too)."""

    def __init__(self, error, body):
        super(_ErrorAnswer, self).__init__(to_native(error))
        self.error = error
        self.body = body


def _within(seconds, exchange):
    """``exchange()`` run in a daemon thread: its result, or its exception raised here, or :class:`_Deadline`
    once ``seconds`` have passed. A thread cannot be stopped: one past its deadline is left blocked on its
    socket, which urllib's own ``timeout`` or the end of the process (a module, a lookup's worker) ends."""
    outcome = {}

    def run():
        try:
            outcome["value"] = exchange()
        except BaseException as exc:  # pylint: disable=broad-except
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="devin.outposts fleet request")
    thread.daemon = True
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise _Deadline()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _status_of(response):
    """The HTTP status of an ``open_url`` response (200 when it does not say)."""
    for attribute in ("status", "code"):
        value = getattr(response, attribute, None)
        if isinstance(value, int):
            return value
    getcode = getattr(response, "getcode", None)
    return getcode() if getcode else 200


def _unsent(reason):
    """True when a connection error proves the request never reached the server."""
    return isinstance(reason, (ConnectionRefusedError, socket.gaierror))


# --- accessors for the Kubernetes-style objects -------------------------------------------------------


def outpost_id_of(outpost):
    return (outpost.get("metadata") or {}).get("outpost_id")


def outpost_name_of(outpost):
    return (outpost.get("spec") or {}).get("name")


def session_id_of(entry):
    return (entry.get("metadata") or {}).get("session_id")


def org_id_of(organization):
    """The id of an item of ``GET /v3/enterprise/organizations`` (``org_id``, or ``id`` as a fallback)."""
    if not isinstance(organization, dict):
        return None
    return organization.get("org_id", organization.get("id"))


def outpost_settings(outpost):
    """The user-settable part of an outpost, for comparisons and diffs."""
    spec = outpost.get("spec") or {}
    return dict(name=spec.get("name"), platform=spec.get("platform"), description=spec.get("description"))


def outpost_differences(current, desired):
    """``[(field, current, desired)]`` for every field the user set (not None) that differs on the server."""
    have = outpost_settings(current)
    return [
        (key, have.get(key), value)
        for key, value in sorted(desired.items())
        if value is not None and have.get(key) != value
    ]


def default_platform_settings(value):
    """The three documented fields of an organization default platform (all ``None`` when unset)."""
    value = value or {}
    return dict(
        platform=value.get("platform"),
        outpost_pool_id=value.get("outpost_pool_id"),
        outpost_pool_name=value.get("outpost_pool_name"),
    )


def default_platform_matches(current, platform=None, outpost_pool_id=None):
    """True when the organization's default is already what a PUT of these values would set."""
    have = default_platform_settings(current)
    if outpost_pool_id is not None:
        return have["outpost_pool_id"] == outpost_pool_id
    return have["platform"] == platform and have["outpost_pool_id"] is None


def looks_like_outpost_id(value):
    return to_text(value).startswith(OUTPOST_ID_PREFIX)


def outpost_name_error(option, value):
    """One line saying why ``value``, given for ``option``, is not an outpost name; ``None`` when it is one.

    Modules get their str options already converted by Ansible, so a list shows up as its text (``[1, 2]``);
    plugins (the lookup) get the value itself.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        shown = "{0} (a {1}, not a string)".format(to_text(value)[:_SHOWN_MAX], type(value).__name__)
    elif isinstance(value, int):
        shown = "{0} (an int, not a string)".format(value)
    elif _OUTPOST_NAME.match(value):
        return None
    else:
        text = value if len(value) <= _SHOWN_MAX + 3 else value[:_SHOWN_MAX] + "..."
        shown = repr(text)
        if value.startswith("[") and value.endswith("]"):
            shown += " (a list? give one name)"
        elif value.startswith("{") and value.endswith("}"):
            shown += " (a dict? give one name)"
    return "{0}: {1} is not a valid outpost name: {2}".format(option, shown, OUTPOST_NAME_RULE)


def outpost_ref_error(option, value):
    """Like :func:`outpost_name_error` for an option that takes a name or an id: ids are the server's."""
    if isinstance(value, str) and looks_like_outpost_id(value):
        return None
    return outpost_name_error(option, value)


def run_module(module, work):
    """Exit ``module`` with the result dict that ``work(client)`` returns, or fail it with the API error.

    Every fleet module ends this way: a FleetAPIError becomes ``fail_json`` with its message, HTTP status and
    detail (FleetAPIError.to_result); anything else is a bug and keeps its traceback.
    """
    client = FleetClient.from_module(module)
    try:
        result = work(client)
    except FleetAPIError as exc:
        module.fail_json(msg=to_native(exc), **exc.to_result())
    module.exit_json(**result)


class FleetClient:
    """A synchronous client for one account's fleet API, built on ``open_url``."""

    def __init__(self, api_url=DEFAULT_API_URL, token=None, validate_certs=True, ca_path=None,
                 timeout=DEFAULT_TIMEOUT, retries=3, backoff_base=0.5, backoff_max=8.0, sleep=None):
        self.api_url = normalize_api_url(api_url)
        if not token:
            raise FleetAPIError(
                "use the fleet API",
                "no API token: set the token option or the DEVIN_OUTPOSTS_TOKEN environment variable",
            )
        if ca_path and not os.path.isfile(ca_path):
            raise FleetAPIError("use the fleet API", "ca_path {0} is not a file".format(ca_path))
        self._token = to_text(token)
        self.validate_certs = validate_certs
        self.ca_path = ca_path
        self.timeout = float(timeout) if timeout else DEFAULT_TIMEOUT
        self.retries = max(0, int(retries))
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self._sleep = sleep or time.sleep

    @classmethod
    def from_module(cls, module):
        """Build the client from a module's ``fleet_argument_spec`` params; fail the module on bad options."""
        params = module.params
        try:
            return cls(
                api_url=params.get("api_url"),
                token=params.get("token"),
                validate_certs=params.get("validate_certs"),
                ca_path=params.get("ca_path"),
                timeout=params.get("timeout"),
            )
        except FleetAPIError as exc:
            module.fail_json(msg=to_native(exc))

    def __repr__(self):
        return "FleetClient(api_url={0!r}, token={1})".format(self.api_url, "set" if self._token else "unset")

    # --- transport --------------------------------------------------------------------------------

    def _redact(self, text):
        text = to_text(text)
        return text.replace(self._token, "<redacted>") if self._token else text

    def _error(self, operation, detail, status=None):
        return FleetAPIError(operation, self._redact(detail), status)

    def _backoff(self, attempt):
        """Between half and all of ``min(backoff_max, backoff_base * 2**attempt)``: the formula of the worker
        package's ``devin_outposts/api/backoff.py``, repeated because modules run on Python 3.6 and import
        nothing but the standard library and Ansible. The backoff cases of python/contract/stream.yaml
        (tests/unit/plugins/module_utils/test_contract.py) fail when the two differ."""
        ceiling = min(self.backoff_max, self.backoff_base * (2 ** min(max(attempt, 0), 32)))
        return random.uniform(ceiling / 2, ceiling)

    def _headers(self, has_body):
        headers = {
            "Authorization": "Bearer {0}".format(self._token),
            "Accept": "application/json",
        }
        if has_body:
            headers["Content-Type"] = "application/json"
        return headers

    def _open(self, method, url, data, headers):
        return open_url(
            url,
            data=data,
            headers=headers,
            method=method,
            use_proxy=True,
            timeout=self.timeout,
            validate_certs=self.validate_certs,
            ca_path=self.ca_path,
            http_agent="devin.outposts/{0}".format(COLLECTION_VERSION),
            follow_redirects="none",
            use_netrc=False,  # a ~/.netrc entry would otherwise replace our Authorization header
        )

    def _exchange(self, method, url, data, headers):
        """One request and its whole answer, within ``timeout`` in all: ``(response, body)``, the body None when
        it is over ``MAX_BODY_BYTES``; an HTTP error answer raises :class:`_ErrorAnswer` with its body (at most
        ``MAX_ERROR_BODY_BYTES``), and a request past its deadline :class:`_Deadline`."""

        def exchange():
            try:
                response = self._open(method, url, data, headers)
                return response, _read_capped(response, MAX_BODY_BYTES)
            except HTTPError as exc:
                try:
                    body = _read_capped(exc, MAX_ERROR_BODY_BYTES) or b""
                except Exception:  # pylint: disable=broad-except
                    body = b""
                raise _ErrorAnswer(exc, body)

        return _within(self.timeout, exchange)

    def request(self, method, path, operation, query=None, body=None, replay_safe=True, allow_empty=False):
        """Send one request with bounded retries; return the decoded JSON body.

        An empty body is an error unless ``allow_empty`` (a DELETE): a list that comes back empty must
        never read as "nothing there". ``replay_safe=False`` (creating an outpost) retries only when the
        server cannot have acted on the request: a 429, a refused connection or an unresolvable host.
        """
        url = self.api_url + path
        params = [(k, v) for k, v in sorted((query or {}).items()) if v is not None]
        if params:
            url += "?" + urlencode(params)
        data = json.dumps(body).encode("utf-8") if body is not None else None
        attempt = 0
        while True:
            delay = None
            try:
                response, raw = self._exchange(method, url, data, self._headers(data is not None))
            except _ErrorAnswer as answer:
                exc, raw_error = answer.error, answer.body
                status = exc.code
                if 300 <= status < 400:
                    location = exc.headers.get("Location") if exc.headers else None
                    raise self._error(operation, "redirected to {0}; set api_url to the API's base URL".format(
                        location or "another URL"), status)
                detail = _detail_from_body(raw_error, to_text(exc.reason or "HTTP error"))
                retryable = status in RETRY_STATUSES and (replay_safe or status == 429)
                if not retryable or attempt >= self.retries:
                    raise self._error(operation, detail, status)
                delay = _parse_retry_after(exc.headers.get("Retry-After") if exc.headers else None)
            except URLError as exc:
                reason = exc.reason
                if _is_tls_error(reason):  # never retried: the same server gives the same handshake
                    raise self._error(operation, _tls_detail(self.api_url, reason))
                if attempt >= self.retries or not (replay_safe or _unsent(reason)):
                    raise self._error(operation, "cannot reach {0}: {1}".format(self.api_url, reason))
            except (SSLValidationError, ssl.SSLError, ssl.CertificateError) as exc:
                raise self._error(operation, _tls_detail(self.api_url, exc))
            except _Deadline:
                if attempt >= self.retries or not replay_safe:  # it was sent: the server may have acted
                    raise self._error(operation, "no complete answer from {0} within {1:g}s".format(
                        self.api_url, self.timeout))
            except (socket.timeout, UrlsConnectionError, HTTPException, ConnectionError) as exc:
                if attempt >= self.retries or not (replay_safe or _unsent(exc)):
                    raise self._error(operation, "cannot reach {0}: {1}: {2}".format(
                        self.api_url, type(exc).__name__, exc))
            else:
                status = _status_of(response)
                if raw is None:
                    raise self._error(operation, "the API answered with a body larger than {0} bytes".format(
                        MAX_BODY_BYTES), status)
                if allow_empty and (not raw or not raw.strip()):
                    return None
                try:
                    return json.loads(to_text(raw, errors="surrogate_or_strict"))
                except ValueError:
                    raise self._error(operation, "the API answered with a body that is not JSON: {0!r}".format(
                        to_text((raw or b"")[:120], errors="surrogate_or_replace")), status)
            if delay is None:
                delay = self._backoff(attempt)
            attempt += 1
            self._sleep(delay)

    def _envelope(self, operation, page):
        """A list page must be an object with an ``items`` list; anything else is not the fleet API."""
        if not isinstance(page, dict) or not isinstance(page.get("items", []), list):
            raise self._error(operation, "unexpected response: a list page must be an object with an items list, "
                                         "got {0}".format(type(page).__name__), 200)
        return page

    # --- outposts ---------------------------------------------------------------------------------

    def list_after(self, path, operation, key_of, page_size=100):
        """Every item of an ``items``/``end_cursor``/``has_next_page`` list, paged with ``first`` and ``after``.

        Items are keyed by ``key_of(item)``: an item seen again on a later page replaces the earlier copy
        and keeps its place. Used by the outposts list and the organizations list, which share the envelope.
        """
        page_size = _check_page_size(operation, page_size)
        found = {}
        after = None
        for dummy in range(_MAX_PAGES):
            page = self.request("GET", path, operation, query=dict(first=page_size, after=after))
            page = self._envelope(operation, page)
            for item in page.get("items") or []:
                found[key_of(item)] = item
            end_cursor = page.get("end_cursor")
            if not page.get("has_next_page"):
                return list(found.values())
            if not end_cursor or end_cursor == after:
                raise self._error(operation, "the API reported another page but did not advance end_cursor")
            after = end_cursor
        raise self._error(operation, "more than {0} pages".format(_MAX_PAGES))

    def list_outposts(self, page_size=100):
        """Every outpost of the account, following ``end_cursor`` while ``has_next_page``."""
        return self.list_after(OUTPOSTS_PATH, "list outposts", outpost_id_of, page_size)

    def find_outpost(self, name=None, outpost_id=None):
        """The outpost with this name (or id), or ``None``. Uses the list, which a machine token may read."""
        for outpost in self.list_outposts():
            if name is not None and outpost_name_of(outpost) == name:
                return outpost
            if outpost_id is not None and outpost_id_of(outpost) == outpost_id:
                return outpost
        return None

    def resolve_outpost(self, name_or_id):
        """The outpost named ``name_or_id`` or with that id; raises a clear error when there is none."""
        key = "outpost_id" if looks_like_outpost_id(name_or_id) else "name"
        outpost = self.find_outpost(**{key: name_or_id})
        if outpost is None:
            raise FleetAPIError(
                "find outpost {0}".format(name_or_id),
                "no outpost with this {0} exists in the account".format("id" if key == "outpost_id" else "name"),
            )
        return outpost

    def get_outpost(self, outpost_id):
        """``GET .../outposts/{id}`` (needs the orchestrator scope), or ``None`` on 404."""
        try:
            return self.request("GET", "{0}/{1}".format(OUTPOSTS_PATH, _segment(outpost_id)),
                                "get outpost {0}".format(outpost_id))
        except FleetAPIError as exc:
            if exc.status == 404:
                return None
            raise

    def create_outpost(self, name, platform=None, description=None):
        body = dict(name=name, platform=platform)
        if description is not None:
            body["description"] = description
        return self.request("POST", OUTPOSTS_PATH, "create outpost {0}".format(name), body=body, replay_safe=False)

    def delete_outpost(self, outpost_id, name=None):
        """Delete; ``False`` when it was already gone (a 404, e.g. a race with another delete)."""
        operation = "delete outpost {0}".format(name or outpost_id)
        if name:
            operation += " ({0})".format(outpost_id)
        try:
            self.request("DELETE", "{0}/{1}".format(OUTPOSTS_PATH, _segment(outpost_id)), operation, allow_empty=True)
        except FleetAPIError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # --- queue ------------------------------------------------------------------------------------

    def list_sessions(self, outpost_id=None, phase=None, acceptor_id=None, page_size=100, cursor=None):
        """All matching queue entries across pages, and the final cursor (where a watch would start).

        A row at a page boundary repeats on the next page; entries are upserted by
        ``metadata.session_id`` and the later (fresher) copy wins.
        """
        operation = "list sessions" + (" on outpost {0}".format(outpost_id) if outpost_id else "")
        page_size = _check_page_size(operation, page_size)
        entries = {}
        for dummy in range(_MAX_PAGES):
            query = dict(outpost=outpost_id, phase=phase, acceptor_id=acceptor_id, first=int(page_size),
                         cursor=cursor)
            page = self._envelope(operation, self.request("GET", QUEUE_PATH, operation, query=query))
            for entry in page.get("items") or []:
                key = session_id_of(entry)
                entries.pop(key, None)  # keep the fresher copy, in server order
                entries[key] = entry
            next_cursor = page.get("cursor")
            if not page.get("has_next_page"):
                return list(entries.values()), next_cursor or cursor
            if not next_cursor or next_cursor == cursor:
                raise self._error(operation, "the API reported another page but did not advance the cursor")
            cursor = next_cursor
        raise self._error(operation, "more than {0} pages".format(_MAX_PAGES))

    # --- organizations ------------------------------------------------------------------------------

    def list_organizations(self, page_size=100):
        """Every organization the token can see (``GET /v3/enterprise/organizations``), across pages."""
        return self.list_after(ORGANIZATIONS_PATH, "list organizations", org_id_of, page_size)

    # --- organization default platform ------------------------------------------------------------

    def get_default_platform(self, org_id):
        return self.request("GET", DEFAULT_PLATFORM_PATH.format(_segment(org_id)),
                            "get the default platform of organization {0}".format(org_id)) or {}

    def set_default_platform(self, org_id, platform=None, outpost_pool_id=None):
        """PUT the default platform; with neither value set it is cleared."""
        if platform is not None and outpost_pool_id is not None:
            raise FleetAPIError("set the default platform of organization {0}".format(org_id),
                                "give at most one of platform and outpost_pool_id")
        return self.request("PUT", DEFAULT_PLATFORM_PATH.format(_segment(org_id)),
                            "set the default platform of organization {0}".format(org_id),
                            body=dict(platform=platform, outpost_pool_id=outpost_pool_id), allow_empty=True) or {}
