"""The simulated distribution of the official Devin CLI (``devin``), as the ``devin.outposts.cli`` role
downloads it. The contract (section 2) only gives ``curl -fsSL https://cli.devin.ai/install.sh | bash``;
the layout is our assumption (docs/roles.md), served under ``{sim_url}/cli/`` without auth:

* ``<version>/devin-<platform>``: the binary, e.g. ``1.2.3/devin-linux-x64``;
* ``<version>/devin-<platform>.sha256``: its SHA-256, hex digest only, one line;
* Windows (``windows-x64``): ``<version>/devin-windows-x64.exe`` and ``….exe.sha256``, as the role's
  Windows path asks for them. Published only when named, and only with content: the stand-in is a shell
  script, which Windows cannot run (the windows stage publishes a small ``.exe`` it builds).

Nothing is published out of the box: tests publish versions through the admin API. By default an
artifact is the **stand-in** ``devin`` of that version (:func:`standin_cli`, a POSIX shell script that
prints ``devin <version>`` for ``devin --version``); any other content can be published, and a
*tampered* artifact serves a ``.sha256`` that does not match its bytes. Artifacts are stored in SQLite
(they survive a restart of the simulator) and wiped by a reset.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Optional

from devin_outposts_sim.errors import Invalid
from devin_outposts_sim.state.db import Database

PREFIX = "/cli"
#: The platforms a publish without ``platforms`` covers (the stand-in shell script runs on each of them).
PLATFORMS = ("linux-x64", "linux-arm64", "macos-arm64")
#: Platforms whose artifacts end in ``.exe``: published only when named, and only with content.
WINDOWS_PLATFORMS = ("windows-x64",)
ALL_PLATFORMS = PLATFORMS + WINDOWS_PLATFORMS
VERSION_RE = re.compile(r"^v?[0-9][0-9A-Za-z._+-]{0,63}$")
_NAME_RE = re.compile(r"^devin-([a-z0-9]+-[a-z0-9]+)(\.exe)?(\.sha256)?$")
MAX_ARTIFACT_BYTES = 64 * 1024 * 1024

#: The tables of this part, wiped by :meth:`~devin_outposts_sim.state.store.Store.reset`.
CLI_TABLES = ("cli_artifacts",)
CLI_SCHEMA = """
CREATE TABLE IF NOT EXISTS cli_artifacts (
    version TEXT NOT NULL, platform TEXT NOT NULL, content BLOB NOT NULL, published_sha256 TEXT NOT NULL,
    created_at REAL NOT NULL, PRIMARY KEY (version, platform));
"""

STANDIN_TEMPLATE = """#!/bin/sh
# Stand-in for the official Devin CLI {version}, served by the devin.outposts fleet simulator.
# It is not the real CLI: it prints its version and otherwise says what it is.
version='{version}'
case "$1" in
--version | -V | version)
    echo "devin $version"
    ;;
worker)
    if [ "$2" != start ]; then
        echo "devin $version (stand-in): only 'devin worker start' is simulated" >&2
        exit 2
    fi
    shift 2
    # The trap first: whoever reads the line below may signal at once.
    trap 'echo "devin $version (stand-in): stopping"; exit 0' TERM INT
    echo "devin $version: stand-in for 'devin worker start' (devin.outposts simulator); it serves no sessions"
    for arg in "$@"; do
        [ "$arg" = --once ] && exit 0
    done
    while :; do sleep 1; done
    ;;
*)
    echo "devin $version (stand-in): usage: devin --version | devin worker start [--once]" >&2
    exit 2
    ;;
esac
"""


def check_version(value: Any) -> str:
    if not isinstance(value, str) or not VERSION_RE.match(value):
        raise Invalid("version must be a pinned version such as 1.2.3 (a digit first, at most 64 characters)")
    return value


def check_platforms(value: Any, *, has_content: bool = True) -> tuple[str, ...]:
    """A list of platforms, or None for all the POSIX ones (:data:`PLATFORMS`). A Windows platform needs
    content (``has_content``): the default stand-in is a shell script."""
    if value is None:
        return PLATFORMS
    if not isinstance(value, list) or not value or not all(item in ALL_PLATFORMS for item in value):
        names, default = ", ".join(ALL_PLATFORMS), ", ".join(PLATFORMS)
        raise Invalid(f"platforms must be a non-empty list of {names} (or null for {default})")
    if not has_content and any(item in WINDOWS_PLATFORMS for item in value):
        raise Invalid("a windows platform needs content (the stand-in devin is a POSIX shell script)")
    return tuple(dict.fromkeys(value))


def artifact_name(platform: str) -> str:
    """``devin-<platform>``, with ``.exe`` for Windows."""
    return f"devin-{platform}.exe" if platform in WINDOWS_PLATFORMS else f"devin-{platform}"


def standin_cli(version: str) -> bytes:
    """The stand-in ``devin`` of ``version``: ``devin --version`` prints ``devin <version>``."""
    return STANDIN_TEMPLATE.format(version=check_version(version)).encode()


def sha256_hex(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def parse_name(name: str) -> Optional[tuple[str, bool]]:
    """``(platform, is_sha256)`` for ``devin-<platform>[.sha256]`` (``devin-windows-x64.exe[.sha256]``),
    or None for anything else."""
    match = _NAME_RE.match(name)
    if match is None or match.group(1) not in ALL_PLATFORMS:
        return None
    if bool(match.group(2)) != (match.group(1) in WINDOWS_PLATFORMS):
        return None
    return match.group(1), bool(match.group(3))


@dataclass(frozen=True)
class CliArtifact:
    version: str
    platform: str
    content: bytes
    #: What ``.sha256`` serves; differs from :attr:`sha256` for a tampered artifact.
    published_sha256: str

    @property
    def sha256(self) -> str:
        return sha256_hex(self.content)

    @property
    def path(self) -> str:
        """The artifact's path under the distribution's base URL."""
        return f"{self.version}/{artifact_name(self.platform)}"

    def describe(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "platform": self.platform,
            "path": self.path,
            "size": len(self.content),
            "sha256": self.sha256,
            "published_sha256": self.published_sha256,
            "tampered": self.published_sha256 != self.sha256,
        }


class CliDist:
    """Published CLI artifacts (``store.cli_dist``), in a table of their own (:data:`CLI_TABLES`, which a
    reset of the store wipes)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        with db.lock:
            db.conn.executescript(CLI_SCHEMA)

    def publish_cli(
        self,
        version: str,
        *,
        content: Optional[bytes] = None,
        platforms: tuple[str, ...] = PLATFORMS,
        published_sha256: Optional[str] = None,
    ) -> list[CliArtifact]:
        """Publish ``content`` (default: the stand-in of ``version``) as ``version`` for ``platforms``,
        replacing what was there. ``published_sha256`` (default: the real digest) is what ``.sha256``
        will serve."""
        version = check_version(version)
        body = standin_cli(version) if content is None else content
        if len(body) > MAX_ARTIFACT_BYTES:
            raise Invalid(f"an artifact may be at most {MAX_ARTIFACT_BYTES} bytes")
        digest = published_sha256 or sha256_hex(body)
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise Invalid("published_sha256 must be 64 lowercase hex digits")
        with self._db.tx() as conn:
            now = self._db.clock()
            for platform in platforms:
                conn.execute(
                    "INSERT OR REPLACE INTO cli_artifacts (version, platform, content, published_sha256, "
                    "created_at) VALUES (?, ?, ?, ?, ?)",
                    (version, platform, body, digest, now),
                )
        return [CliArtifact(version, platform, body, digest) for platform in platforms]

    def cli_artifact(self, version: str, platform: str) -> Optional[CliArtifact]:
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT * FROM cli_artifacts WHERE version = ? AND platform = ?", (version, platform)
            ).fetchone()
        if row is None:
            return None
        return CliArtifact(version, platform, bytes(row["content"]), str(row["published_sha256"]))

    def cli_state(self) -> dict[str, Any]:
        """The platforms served (POSIX, then Windows) and every artifact (without its bytes), oldest first."""
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT version, platform FROM cli_artifacts ORDER BY created_at, version, platform"
            ).fetchall()
        artifacts = []
        for row in rows:
            found = self.cli_artifact(str(row["version"]), str(row["platform"]))
            if found is not None:
                artifacts.append(found.describe())
        return {"prefix": PREFIX + "/", "platforms": list(ALL_PLATFORMS), "artifacts": artifacts}
