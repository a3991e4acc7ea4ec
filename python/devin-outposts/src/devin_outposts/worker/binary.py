"""Finding, downloading, verifying and caching the ``devin-remote`` binary (docs/fleet-api.md §8).

* The SHA comes from the session (``spec.remote_binary_sha``), then ``--remote-binary-sha`` /
  ``DEVIN_WORKER_REMOTE_SHA``, then ``<base>/latest_<suffix>``; every SHA must match ``^[0-9a-f]{6,40}$``.
* ``<base>/devin-remote_<sha>_<suffix>`` is streamed into a temporary file in the cache dir while it is
  hashed, compared with ``<base>/devin-remote_<sha>_<suffix>.sha256``, fsynced, made 0755 and renamed into
  place, so a half-written or unverified file never carries the final name. An answer whose
  ``Content-Length`` is over the 1 GiB cap is refused before the file is made (issue 37, S7), and one that
  goes past it is cut off there; a compressed answer is capped before it is inflated
  (:func:`~devin_outposts.api.limits.decoded_chunks`). A download is an ordinary ``await``: cancelling the
  session that waits for it (a signal's drain) stops it at once and removes the temporary file.
* A cached binary is hashed again before every start (:meth:`BinaryStore.ensure` in each session's
  prepare; :meth:`BinaryStore.reverify` is for each restart) and compared with the published digest
  (fetched once per process, with the ``.sha256`` saved beside the binary as a fallback when the server
  cannot be reached), so a cache that a session rewrote is never run: the file is removed with one
  warning that names it and downloaded again (verified), and if that fails the session fails with one line
  that says so. A cache entry that is not a regular file (a symlink put in its place) counts as altered. An
  unconfined session runs as the worker's user and can rewrite the cache; hashing once per start (about
  0.1 s for 100 MiB) is what keeps it from choosing what the next start runs (docs/security.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import time
import uuid
from pathlib import Path
from typing import Optional

import httpx

from devin_outposts.api.limits import (
    ACCEPT_ENCODING,
    ResponseTooLarge,
    UndecodableBody,
    declared_length,
    decoded_chunks,
    read_capped,
)
from devin_outposts.core import platform
from devin_outposts.core.config import SHA_RE

log = logging.getLogger(__name__)

_DIGEST_RE = re.compile(r"[0-9a-fA-F]{64}")
MAX_BINARY_BYTES = 1 << 30
#: A ``latest_*`` file holds one SHA; a ``.sha256`` file one digest and perhaps a file name.
MAX_LATEST_BYTES = 1 << 10
MAX_DIGEST_BYTES = 4 << 10
LATEST_TTL = 60.0
#: Every download asks for the codings :mod:`devin_outposts.api.inflate` decodes within the caps.
_HEADERS = {"Accept-Encoding": ACCEPT_ENCODING}


class BinaryError(Exception):
    """The binary could not be obtained (network, HTTP status, bad SHA): retry later."""


class VerificationError(BinaryError):
    """A binary did not match its published sha256: it is never run."""


class UnsupportedPlatform(BinaryError):
    """No devin-remote build exists for this OS/architecture."""


def platform_suffix(system: Optional[str] = None, machine: Optional[str] = None) -> str:
    """The distribution suffix for an OS/arch (default: this machine's)."""
    host = platform.current()
    if system is not None or machine is not None:
        host = platform.HostPlatform(system, machine)
    try:
        return host.binary_suffix()
    except platform.UnsupportedHost as exc:
        raise UnsupportedPlatform(str(exc)) from exc


def check_sha(value: str, source: str) -> str:
    text = value.strip().lower()
    if not SHA_RE.fullmatch(text):
        raise BinaryError(f"{source} is not a 6-40 character hex SHA: {value.strip()[:60]!r}")
    return text


def parse_digest(text: str) -> str:
    """The hex digest of a ``.sha256`` file: ``<digest>`` or ``<digest>  <filename>``."""
    for line in text.splitlines():
        token = line.strip().split(maxsplit=1)[0] if line.strip() else ""
        if token:
            token = token.lstrip("\\")
            if _DIGEST_RE.fullmatch(token):
                return token.lower()
            break
    raise VerificationError("the .sha256 file does not start with a 64-character hex digest")


def _cached_digest(path: Path) -> Optional[str]:
    """The sha256 of a cached binary, or None when it is not a regular file (a symlink in its place)."""
    if path.is_symlink() or not path.is_file():
        return None
    return file_sha256(path)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class BinaryStore:
    """Resolves SHAs and hands out verified ``devin-remote`` paths from the cache."""

    def __init__(
        self,
        cache_dir: Path,
        static_base_url: str,
        *,
        http: Optional[httpx.AsyncClient] = None,
        owns_http: bool = False,
        suffix: Optional[str] = None,
        latest_ttl: float = LATEST_TTL,
    ) -> None:
        self.cache_dir = cache_dir
        self.base = static_base_url if static_base_url.endswith("/") else static_base_url + "/"
        self.suffix = suffix or platform_suffix()
        self._http = http or httpx.AsyncClient(
            timeout=httpx.Timeout(60.0, connect=10.0), follow_redirects=True
        )
        self._own_http = http is None or owns_http
        self._latest: Optional[tuple[str, float]] = None
        self._latest_ttl = latest_ttl
        self._digests: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.downloads = 0
        self.verification_failures = 0

    async def aclose(self) -> None:
        if self._own_http:
            await self._http.aclose()

    def binary_name(self, sha: str) -> str:
        return f"devin-remote_{sha}_{self.suffix}"

    async def _get_small(self, name: str, limit: int) -> str:
        """The text of a small published file (``latest_*``, ``*.sha256``), refusing more than ``limit``."""
        url = self.base + name
        try:
            async with self._http.stream("GET", url, headers=_HEADERS) as response:
                if response.status_code != 200:
                    raise BinaryError(f"Could not download {url}: HTTP {response.status_code}")
                content = await read_capped(response, limit)
        except httpx.HTTPError as exc:
            raise BinaryError(f"Could not download {url}: {type(exc).__name__}: {exc}") from exc
        except (ResponseTooLarge, UndecodableBody) as exc:
            raise BinaryError(f"Could not download {url}: {exc}") from exc
        return content.decode("utf-8", errors="replace")

    async def latest_sha(self) -> str:
        now = time.monotonic()
        if self._latest and now - self._latest[1] < self._latest_ttl:
            return self._latest[0]
        names = [f"latest_{self.suffix}"]
        if self.suffix.endswith(".exe"):  # the Windows latest_* name is unconfirmed (docs/fleet-api.md §8)
            names.append(f"latest_{self.suffix[:-4]}")
        error: Optional[BinaryError] = None
        for name in names:
            try:
                text = await self._get_small(name, MAX_LATEST_BYTES)
            except BinaryError as exc:
                error = exc
                continue
            sha = check_sha(text, f"{self.base}{name}")
            self._latest = (sha, now)
            return sha
        assert error is not None
        raise error

    async def resolve_sha(self, session_sha: Optional[str], fallback_sha: Optional[str]) -> tuple[str, str]:
        """The SHA to run and where it came from: ``session``, ``worker`` or ``latest``."""
        if session_sha:
            return check_sha(session_sha, "the session's remote_binary_sha"), "session"
        if fallback_sha:
            return check_sha(fallback_sha, "--remote-binary-sha"), "worker"
        return await self.latest_sha(), "latest"

    async def _published_digest(self, sha: str, *, sidecar: Path) -> str:
        cached = self._digests.get(sha)
        if cached:
            return cached
        try:
            published = await self._get_small(self.binary_name(sha) + ".sha256", MAX_DIGEST_BYTES)
        except BinaryError:
            if sidecar.exists():  # noqa: ASYNC240 - a tiny local file
                log.warning(
                    "could not fetch the published sha256 of devin-remote %s; using the saved copy", sha
                )
                return parse_digest(sidecar.read_text(encoding="utf-8", errors="replace"))  # noqa: ASYNC240
            raise
        digest = parse_digest(published)
        self._digests[sha] = digest
        return digest

    async def ensure(self, sha: str) -> Path:
        """A verified, executable ``devin-remote`` for ``sha``: the cached file, hashed now, else a fresh
        download. Call it before every start: a cached file that no longer matches is never returned."""
        sha = check_sha(sha, "devin-remote SHA")
        lock = self._locks.setdefault(sha, asyncio.Lock())
        async with lock:
            self.cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            path = self.cache_dir / self.binary_name(sha)
            sidecar = path.with_name(path.name + ".sha256")
            expected = await self._published_digest(sha, sidecar=sidecar)
            altered = None
            if path.is_symlink() or path.exists():
                found = await asyncio.to_thread(_cached_digest, path)
                if found == expected:
                    return path
                altered = self._discard_altered(sha, path, expected, found)
            try:
                await self._download(sha, path, expected)
            except BinaryError as exc:
                if altered is None:
                    raise
                refusal = f"Refusing the cached devin-remote {path}: {altered}"
                raise type(exc)(f"{refusal}, and downloading it again failed: {exc}") from exc
            sidecar_tmp = sidecar.with_name(f".{sidecar.name}.{uuid.uuid4().hex}")
            sidecar_tmp.write_text(f"{expected}  {path.name}\n", encoding="utf-8")
            os.replace(sidecar_tmp, sidecar)
            return path

    async def reverify(self, binary: Path) -> Path:
        """:meth:`ensure` for a path it returned before (a restart of the same session): the file hashed
        again, downloaded again if it was altered meanwhile."""
        prefix, suffix = "devin-remote_", f"_{self.suffix}"
        name = binary.name
        if binary.parent != self.cache_dir or not (name.startswith(prefix) and name.endswith(suffix)):
            raise BinaryError(f"{binary} is not a devin-remote of the cache {self.cache_dir}")
        return await self.ensure(name[len(prefix) : -len(suffix)])

    def _discard_altered(self, sha: str, path: Path, expected: str, found: Optional[str]) -> str:
        """Remove a cached binary that no longer matches its digest, with one warning naming it; the
        reason, for a failure line."""
        self.verification_failures += 1
        why = (
            "it is no longer a regular file"
            if found is None
            else f"its sha256 is {found}, not the published {expected}"
        )
        log.warning(
            "cached devin-remote %s was altered since it was verified (%s): removing it, never running it, "
            "and downloading it again",
            path,
            why,
            extra={"sha": sha},
        )
        path.unlink(missing_ok=True)
        return f"it was altered ({why})"

    async def _download(self, sha: str, path: Path, expected: str) -> None:
        url = self.base + self.binary_name(sha)
        try:
            async with self._http.stream("GET", url, headers=_HEADERS) as response:
                if response.status_code != 200:
                    raise BinaryError(f"Could not download {url}: HTTP {response.status_code}")
                declared = declared_length(response)
                if declared is not None and declared > MAX_BINARY_BYTES:
                    raise BinaryError(
                        f"Could not download {url}: its Content-Length is {declared} bytes, more than the "
                        f"{MAX_BINARY_BYTES}-byte cap on devin-remote; nothing was written"
                    )
                size = await self._write_verified(sha, url, response, path, expected)
        except httpx.HTTPError as exc:
            raise BinaryError(f"Could not download {url}: {type(exc).__name__}: {exc}") from exc
        except ResponseTooLarge as exc:
            raise BinaryError(f"Could not download {url}: larger than {MAX_BINARY_BYTES} bytes") from exc
        except UndecodableBody as exc:
            raise BinaryError(f"Could not download {url}: {exc}") from exc
        self.downloads += 1
        log.info("downloaded devin-remote %s (%d bytes, sha256 verified)", sha, size, extra={"sha": sha})

    async def _write_verified(
        self, sha: str, url: str, response: httpx.Response, path: Path, expected: str
    ) -> int:
        """Stream the body into a temporary file beside ``path`` while hashing it; rename it into place
        (0755) only if it matches ``expected``. The temporary file is removed whatever happens, a
        cancellation included. Returns the size."""
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.part")
        digest = hashlib.sha256()
        size = 0
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                async for chunk in decoded_chunks(response, MAX_BINARY_BYTES):
                    size += len(chunk)
                    digest.update(chunk)
                    handle.write(chunk)
                handle.flush()
                os.fsync(handle.fileno())
            actual = digest.hexdigest()
            if actual != expected:
                self.verification_failures += 1
                raise VerificationError(
                    f"Refusing devin-remote {sha}: the download from {url} has sha256 {actual}, but the "
                    f"published checksum is {expected}"
                )
            os.chmod(tmp, 0o755)  # noqa: S103 - an executable, as the docs' chmod +x
            os.replace(tmp, path)
            platform.current().fsync_dir(path.parent)
            return size
        finally:
            if tmp.exists():
                tmp.unlink()
