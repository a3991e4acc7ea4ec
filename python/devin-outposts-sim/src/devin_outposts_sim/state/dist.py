"""The simulated ``devin-remote`` distribution (docs/fleet-api.md §8): what
``static.devin.ai/devin-rs/remote/`` holds.

The simulator serves, under ``{sim_url}/devin-rs/remote/`` and without auth (it is a public CDN):

* ``latest_<suffix>``: the SHA of the latest build, one line;
* ``devin-remote_<sha>_<suffix>``: the binary;
* ``devin-remote_<sha>_<suffix>.sha256``: its SHA-256, hex digest only, one line.

Out of the box every suffix (``linux_x64``, ``linux_arm64``, ``macos_arm64``, ``windows_x64.exe``) serves
the **built-in stand-in** ``devin-remote`` (:mod:`devin_outposts_sim.remote.standin`, the same bytes for
every suffix) under its version id, and ``latest_<suffix>`` names it. The built-in artifact is not
stored: it is always the stand-in this package ships. Tests publish more through the admin API: any
content under any SHA, a *tampered* artifact whose ``.sha256`` does not match its bytes, and which SHA
is ``latest``. Those are stored in SQLite and wiped by a reset.

The Windows latest file is ``latest_windows_x64.exe`` (``latest_<suffix>`` for every suffix); because the
real name is unconfirmed, ``latest_windows_x64`` answers the same.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from typing import Any, Optional

from devin_outposts_sim.errors import Invalid
from devin_outposts_sim.remote import standin_path
from devin_outposts_sim.state.db import Database

SUFFIXES = ("linux_x64", "linux_arm64", "macos_arm64", "windows_x64.exe")
#: Extra ``latest_*`` names: the Windows one is unconfirmed (docs/fleet-api.md §8 and §10.1 Q12).
LATEST_ALIASES = {"windows_x64": "windows_x64.exe"}
SHA_RE = re.compile(r"^[0-9a-f]{6,40}$")
_ARTIFACT_RE = re.compile(r"^devin-remote_([0-9a-f]{6,40})_(.+?)(\.sha256)?$")
MAX_ARTIFACT_BYTES = 64 * 1024 * 1024


#: Prepended when the stand-in is served as an executable. The source file carries no shebang because it
#: is package source, not a script (ansible-test's shebang check rejects one there).
STANDIN_SHEBANG = b"#!/usr/bin/env python3\n"


@functools.lru_cache(maxsize=1)
def standin_bytes() -> bytes:
    """The stand-in as published: a shebang line, then the module's source."""
    return STANDIN_SHEBANG + standin_path().read_bytes()


def version_id(content: bytes) -> str:
    """A build's SHA: the first 12 hex digits of the SHA-1 of its bytes (what the stand-in reports)."""
    return hashlib.sha1(content, usedforsecurity=False).hexdigest()[:12]


def builtin_sha() -> str:
    return version_id(standin_bytes())


def sha256_hex(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def check_sha(value: Any) -> str:
    if not isinstance(value, str) or not SHA_RE.match(value):
        raise Invalid("sha must be 6-40 lowercase hex digits")
    return value


def check_suffixes(value: Any) -> tuple[str, ...]:
    """A list of suffixes, or None for all of them."""
    if value is None:
        return SUFFIXES
    if not isinstance(value, list) or not value or not all(item in SUFFIXES for item in value):
        raise Invalid(f"suffixes must be a non-empty list of {', '.join(SUFFIXES)} (or null for all)")
    return tuple(dict.fromkeys(value))


def parse_name(name: str) -> Optional[tuple[str, Optional[str], str]]:
    """``("latest", None, suffix)``, ``("binary"|"sha256", sha, suffix)``, or None for anything else."""
    if name.startswith("latest_"):
        suffix = LATEST_ALIASES.get(name[len("latest_") :], name[len("latest_") :])
        return ("latest", None, suffix) if suffix in SUFFIXES else None
    match = _ARTIFACT_RE.match(name)
    if match is None or match.group(2) not in SUFFIXES:
        return None
    return ("sha256" if match.group(3) else "binary", match.group(1), match.group(2))


@dataclass(frozen=True)
class Artifact:
    sha: str
    suffix: str
    content: bytes
    #: What ``.sha256`` serves; differs from :attr:`sha256` for a tampered artifact.
    published_sha256: str
    builtin: bool = False

    @property
    def sha256(self) -> str:
        return sha256_hex(self.content)

    @property
    def name(self) -> str:
        return f"devin-remote_{self.sha}_{self.suffix}"

    def describe(self) -> dict[str, Any]:
        return {
            "sha": self.sha,
            "suffix": self.suffix,
            "name": self.name,
            "size": len(self.content),
            "sha256": self.sha256,
            "published_sha256": self.published_sha256,
            "tampered": self.published_sha256 != self.sha256,
            "builtin": self.builtin,
        }


def builtin_artifact(suffix: str) -> Artifact:
    content = standin_bytes()
    return Artifact(builtin_sha(), suffix, content, sha256_hex(content), builtin=True)


class RemoteDist:
    """Published ``devin-remote`` artifacts and the ``latest`` pointers (``store.dist``; the built-in
    stand-in needs no row)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def publish_artifact(
        self,
        content: bytes,
        *,
        sha: Optional[str] = None,
        suffixes: tuple[str, ...] = SUFFIXES,
        published_sha256: Optional[str] = None,
        make_latest: bool = False,
    ) -> list[Artifact]:
        """Publish ``content`` under ``sha`` (default: its version id) for ``suffixes``, replacing what
        was there. ``published_sha256`` (default: the real digest) is what ``.sha256`` will serve."""
        if len(content) > MAX_ARTIFACT_BYTES:
            raise Invalid(f"an artifact may be at most {MAX_ARTIFACT_BYTES} bytes")
        sha = check_sha(sha) if sha is not None else version_id(content)
        digest = published_sha256 or sha256_hex(content)
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise Invalid("published_sha256 must be 64 lowercase hex digits")
        with self._db.tx() as conn:
            now = self._db.clock()
            for suffix in suffixes:
                conn.execute(
                    "INSERT OR REPLACE INTO dist_artifacts (sha, suffix, content, published_sha256, "
                    "created_at) VALUES (?, ?, ?, ?, ?)",
                    (sha, suffix, content, digest, now),
                )
                if make_latest:
                    conn.execute(
                        "INSERT OR REPLACE INTO dist_latest (suffix, sha) VALUES (?, ?)", (suffix, sha)
                    )
        return [Artifact(sha, suffix, content, digest) for suffix in suffixes]

    def set_latest(self, sha: str, suffixes: tuple[str, ...] = SUFFIXES, *, check: bool = True) -> None:
        """Point ``latest_<suffix>`` at ``sha``. With ``check``, ``sha`` must be a published SHA
        (or the built-in one); without it, any text of at most 100 characters (to test clients)."""
        if check:
            check_sha(sha)
            missing = [s for s in suffixes if self.artifact(sha, s) is None]
            if missing:
                raise Invalid(f"no artifact {sha} is published for {', '.join(missing)}")
        elif not sha or len(sha) > 100 or "\n" in sha:
            raise Invalid("latest must be a single line of at most 100 characters")
        with self._db.tx() as conn:
            for suffix in suffixes:
                conn.execute("INSERT OR REPLACE INTO dist_latest (suffix, sha) VALUES (?, ?)", (suffix, sha))

    def latest_sha(self, suffix: str) -> str:
        with self._db.read() as conn:
            row = conn.execute("SELECT sha FROM dist_latest WHERE suffix = ?", (suffix,)).fetchone()
        return builtin_sha() if row is None else str(row["sha"])

    def artifact(self, sha: str, suffix: str) -> Optional[Artifact]:
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT * FROM dist_artifacts WHERE sha = ? AND suffix = ?", (sha, suffix)
            ).fetchone()
        if row is not None:
            return Artifact(sha, suffix, bytes(row["content"]), str(row["published_sha256"]))
        if sha == builtin_sha():
            return builtin_artifact(suffix)
        return None

    def dist_state(self) -> dict[str, Any]:
        """Every artifact (the built-in ones first, without their bytes) and the latest pointers."""
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT sha, suffix FROM dist_artifacts ORDER BY created_at, sha, suffix"
            ).fetchall()
        stored = [(str(row["sha"]), str(row["suffix"])) for row in rows]
        builtin = [(builtin_sha(), suffix) for suffix in SUFFIXES if (builtin_sha(), suffix) not in stored]
        artifacts = []
        for sha, suffix in builtin + stored:
            found = self.artifact(sha, suffix)
            if found is not None:
                artifacts.append(found.describe())
        return {
            "builtin_sha": builtin_sha(),
            "suffixes": list(SUFFIXES),
            "latest": {suffix: self.latest_sha(suffix) for suffix in SUFFIXES},
            "artifacts": artifacts,
        }
