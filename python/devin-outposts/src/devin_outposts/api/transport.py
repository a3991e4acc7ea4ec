"""What every request of the fleet client shares: the API URL rule, ids as path segments, TLS, the reply
read within its limit, ``Retry-After`` and the page-size rule (split out of :mod:`.client`, which sends the
requests; its names are re-exported there).
"""

from __future__ import annotations

import email.utils
import os
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional, Union
from urllib.parse import quote

import httpx

from devin_outposts.api.decode import error_detail

DEFAULT_API_URL = "https://api.devin.ai"
MAX_PAGE_SIZE = 200
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_RETRY_AFTER = 60.0

#: ``verify`` as httpx takes it: on/off, a CA bundle path, or a ready SSL context (shared between clients).
VerifyType = Union[bool, str, ssl.SSLContext]


def tls_context(environ: Optional[Mapping[str, str]] = None) -> ssl.SSLContext:
    """The TLS context a long-running process shares between its clients (each costs megabytes): it
    trusts ``DEVIN_CA_BUNDLE`` when set, else httpx's defaults (certifi, ``SSL_CERT_FILE``/``DIR``).
    Verification is never off."""
    env = os.environ if environ is None else environ
    return httpx.create_ssl_context(verify=env.get("DEVIN_CA_BUNDLE") or True, trust_env=True)


def normalize_api_url(url: str) -> str:
    """Return the API base URL without a trailing slash or an ``/opbeta...`` suffix.

    Users sometimes paste ``https://api.devin.ai/opbeta/outposts/``; the contract says to give the base
    only, so we accept both rather than building ``/opbeta/outposts/opbeta/outposts/...``.
    """
    text = url.strip()
    if not text.startswith(("http://", "https://")):
        raise ValueError(f"API URL must start with http:// or https://, got {url!r}")
    text = text.rstrip("/")
    for suffix in ("/opbeta/outposts", "/opbeta"):
        if text.endswith(suffix):
            text = text[: -len(suffix)]
    return text


def path_segment(value: str) -> str:
    """Quote a server- or user-provided id for use as exactly one URL path segment.

    Every reserved character is escaped (``/``, ``?``, ``#``, ``%``), and so are the dot segments ``.``
    and ``..``, which URL normalisation (httpx's included) would otherwise remove, turning a claim of
    session ``..`` into ``POST /opbeta/outposts/claim``.
    """
    if not value:
        raise ValueError("an id cannot be empty")
    if value in (".", ".."):
        return value.replace(".", "%2E")
    return quote(value, safe="")


@dataclass(frozen=True)
class Reply:
    """A fleet API answer, read in full but within :data:`~devin_outposts.api.limits.MAX_BODY_BYTES`."""

    status_code: int
    headers: httpx.Headers
    content: bytes
    reason_phrase: str


def reply_detail(response: Reply) -> str:
    """The server's ``detail`` (FastAPI style), else a truncated body, for error messages (never raises,
    whatever the body holds: :func:`~devin_outposts.api.decode.error_detail`)."""
    return error_detail(response.content, response.reason_phrase)


def retry_after(response: Reply) -> Optional[float]:
    """Seconds to wait from ``Retry-After`` (delta-seconds or an HTTP date), at most a minute; else None."""
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - time.time()
    return max(0.0, min(seconds, MAX_RETRY_AFTER))


def check_page_size(first: int) -> None:
    if not 1 <= first <= MAX_PAGE_SIZE:
        raise ValueError(f"page size must be between 1 and {MAX_PAGE_SIZE}, got {first}")
