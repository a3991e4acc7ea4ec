"""The release's version and changelog: one version, in galaxy.yml; a CHANGELOG.md that follows the fragments.

Run it through scripts/release.sh (which puts the dev venv first on PATH); docs/release.md is the procedure.

    versions             check that every place that repeats the version agrees with galaxy.yml
    bump VERSION         set galaxy.yml's version and every place that repeats it
    changelog            regenerate CHANGELOG.md (the same input gives the same file)
    check-changelog      fail, with a diff, when CHANGELOG.md is not what 'changelog' would write
    stage DIR            write the tree the collection tarball is built from into DIR (scripts/build.sh)
    check-tarball FILE   fail when a built tarball's changelogs/changelog.yaml does not record its version

CHANGELOG.md: when galaxy.yml's version is not yet in changelogs/changelog.yaml (it is being developed), the
file is what 'antsibull-changelog release' would write for it from the fragments as they are now, made in a
scratch copy of the tree, so changelog.yaml and the fragments stay untouched and a fragment added later shows
up on the next run. When the version is released, the file is what 'antsibull-changelog generate' writes from
changelog.yaml; fragments left over then belong to a version that galaxy.yml does not name yet, which is an
error (bump first). An unreleased version with no fragment yet (just after a bump) shows only the releases.

A first release (changelog.yaml records no release yet) has nothing to break, deprecate or remove: a
fragment with breaking_changes, deprecated_features or removed_features is then an error, so CHANGELOG.md
cannot list them.

The tarball: 'stage' copies what git would commit into DIR and, while the version is unreleased, runs
'antsibull-changelog release' there (dated by the last commit), so the tarball's changelogs/changelog.yaml
records the version with its fragments exactly as the release commit will (docs/release.md); a released
version is copied as it is. 'check-tarball' is the tarball stage's check that this happened.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
GALAXY = Path("galaxy.yml")
GALAXY_VERSION = re.compile(r"^version: *(?P<version>\S+) *$", re.MULTILINE)
# X.Y.Z: what galaxy.yml, PEP 440 and antsibull-changelog all read the same way.
VERSION_SYNTAX = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$")
# Every other place that repeats the release's version: (file, pattern whose group 'version' is the version).
# Each pattern must match at least once, so a file that changes shape fails the check instead of escaping it.
VERSION_PLACES = (
    # the wheels' versions (pyproject.toml reads them: dynamic = ["version"])
    (Path("python/devin-outposts/src/devin_outposts/__init__.py"),
     re.compile(r'^__version__ = "(?P<version>[^"]+)"$', re.MULTILINE)),
    (Path("python/devin-outposts-sim/src/devin_outposts_sim/__init__.py"),
     re.compile(r'^__version__ = "(?P<version>[^"]+)"$', re.MULTILINE)),
    # the modules' User-Agent (module_utils cannot read galaxy.yml on the host that runs them)
    (Path("plugins/module_utils/_fleet_api.py"),
     re.compile(r'^COLLECTION_VERSION = "(?P<version>[^"]+)"$', re.MULTILINE)),
    (Path("tests/unit/plugins/module_utils/test_fleet_api.py"),
     re.compile(r'http_agent="devin\.outposts/(?P<version>[^"]+)"')),
    # the README's install commands name the files make build writes
    (Path("README.md"),
     re.compile(r"dist/devin[-_]outposts(?:[-_]sim)?-(?P<version>[0-9][^-/\s]*?)"
                r"(?:\.tar\.gz|-py3-none-any\.whl)")),
)
CHANGELOG = Path("CHANGELOG.md")
CHANGES = Path("changelogs/changelog.yaml")
FRAGMENTS = Path("changelogs/fragments")
# antsibull-changelog release wants a date; CHANGELOG.md does not show it, changelog.yaml (untouched) would.
PREVIEW_DATE = "1980-01-01"
# Only what antsibull-changelog reads (galaxy.yml, changelogs/, and the plugins and roles it lists as new).
COPIED = tuple(map(Path, ("galaxy.yml", "changelogs", "plugins", "roles", "playbooks", "meta")))
# Sections a first release cannot have: there is no earlier release to break, deprecate or remove from.
NOT_IN_A_FIRST_RELEASE = ("breaking_changes", "deprecated_features", "removed_features")


class ReleaseError(Exception):
    """What the user must fix, in one line."""


def galaxy_version(root: Path) -> str:
    found = GALAXY_VERSION.search((root / GALAXY).read_text(encoding="utf-8"))
    if found is None:
        raise ReleaseError(f"{GALAXY} has no 'version:' line")
    return found["version"]


def version_mismatches(root: Path) -> list[str]:
    """One line per place whose version differs from galaxy.yml's (or that no longer shows one)."""
    expected = galaxy_version(root)
    problems = []
    for path, pattern in VERSION_PLACES:
        text = (root / path).read_text(encoding="utf-8")
        matches = list(pattern.finditer(text))
        if not matches:
            problems.append(f"{path}: no version found (pattern {pattern.pattern!r}); fix scripts/release.py")
        for match in matches:
            if match["version"] != expected:
                line = text.count("\n", 0, match.start()) + 1
                problems.append(f"{path}:{line}: {match['version']!r}, but galaxy.yml says {expected!r}")
    return problems


def replace_versions(text: str, pattern: re.Pattern[str], version: str) -> str:
    pieces, last = [], 0
    for match in pattern.finditer(text):
        pieces += [text[last:match.start("version")], version]
        last = match.end("version")
    return "".join(pieces) + text[last:]


def bump(root: Path, version: str) -> list[Path]:
    if not VERSION_SYNTAX.match(version):
        raise ReleaseError(f"{version!r} is not a version of the form X.Y.Z")
    changed = []
    for path, pattern in ((GALAXY, GALAXY_VERSION), *VERSION_PLACES):
        text = (root / path).read_text(encoding="utf-8")
        new = replace_versions(text, pattern, version)
        if new != text:
            (root / path).write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


def released_versions(root: Path) -> set[str]:
    data = yaml.safe_load((root / CHANGES).read_text(encoding="utf-8")) or {}
    return {str(version) for version in (data.get("releases") or {})}


def fragments(root: Path) -> list[Path]:
    return sorted(p for p in (root / FRAGMENTS).glob("*") if p.suffix in (".yml", ".yaml"))


def tracked_files(root: Path) -> list[Path]:
    """The files git would commit (tracked, and new ones not ignored), under the COPIED folders."""
    listing = subprocess.run(  # noqa: S603
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",  # noqa: S607
         *map(str, COPIED)],
        check=True, capture_output=True, text=True,
    ).stdout
    return [Path(name) for name in listing.split("\0") if name and (root / name).is_file()]


def first_release_problems(root: Path) -> list[str]:
    """One line per fragment section that a first release cannot have (none once a release is recorded)."""
    if released_versions(root):
        return []
    problems = []
    for path in fragments(root):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for section in NOT_IN_A_FIRST_RELEASE:
            if data.get(section):
                problems.append(
                    f"{FRAGMENTS / path.name}: {section} in the first release, which has nothing to break, "
                    f"deprecate or remove: say it under minor_changes (or known_issues) instead")
    return problems


def copy_tree(root: Path, dest: Path, names: list[Path]) -> None:
    for name in names:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, dest / name)


def run_antsibull_changelog(copy: Path, scratch: Path, command: list[str]) -> None:
    """antsibull-changelog in copy, a tree at .../ansible_collections/devin/outposts (it lists the new plugins
    with ansible-doc, which finds the collection there)."""
    collections = copy.parent.parent.parent
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_HOME=str(scratch / "home"))
    result = subprocess.run(  # noqa: S603
        command, cwd=copy, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ReleaseError(f"{' '.join(command)} failed (exit {result.returncode}):\n"
                           f"{result.stdout}{result.stderr}")


def check_release_inputs(root: Path) -> tuple[str, bool]:
    """galaxy.yml's version and whether it is released, after refusing fragments that cannot go with it."""
    version = galaxy_version(root)
    released = version in released_versions(root)
    if released and fragments(root):
        names = ", ".join(p.name for p in fragments(root))
        raise ReleaseError(
            f"galaxy.yml says {version}, which is released, but there are fragments for the next release "
            f"({names}): bump the version first (scripts/release.sh bump X.Y.Z)")
    problems = first_release_problems(root)
    if problems:
        raise ReleaseError("\n".join(problems))
    return version, released


def render_changelog(root: Path) -> str:
    """The CHANGELOG.md that belongs to the tree at root (see the module's docstring)."""
    version, released = check_release_inputs(root)
    with tempfile.TemporaryDirectory(prefix="devin-outposts-changelog.") as scratch:
        copy = Path(scratch, "ansible_collections", "devin", "outposts")
        copy_tree(root, copy, tracked_files(root))
        if released or not fragments(root):
            command = ["antsibull-changelog", "generate"]
        else:
            command = ["antsibull-changelog", "release", "--version", version, "--date", PREVIEW_DATE]
        run_antsibull_changelog(copy, Path(scratch), command)
        return (copy / CHANGELOG).read_text(encoding="utf-8")


def commit_date(root: Path) -> str:
    """The last commit's date (YYYY-MM-DD): the date an unreleased version's build records."""
    result = subprocess.run(  # noqa: S603
        ["git", "-C", str(root), "log", "-1", "--format=%cs"],  # noqa: S607
        capture_output=True, text=True, check=False)
    date = result.stdout.strip()
    if result.returncode != 0 or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
        raise ReleaseError(f"cannot read the last commit's date in {root} (git log: "
                           f"{result.stderr.strip()}); the build dates an unreleased version by it")
    return date


def stage(root: Path, dest: Path) -> str:
    """Write the tree the tarball is built from into dest (empty or absent); returns what happened, in words.

    Every file git would commit (uncommitted edits and new files included, ignored ones not), then, for an
    unreleased version, 'antsibull-changelog release' in that copy, so changelogs/changelog.yaml records
    it."""
    version, released = check_release_inputs(root)
    if dest.exists() and any(dest.iterdir()):
        raise ReleaseError(f"{dest} is not empty; stage writes into an empty directory")
    listing = subprocess.run(  # noqa: S603
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],  # noqa: S607
        capture_output=True, text=True, check=False)
    if listing.returncode != 0:
        raise ReleaseError(f"{root} is not a git checkout (git ls-files: {listing.stderr.strip()}); "
                           "the release is built from one (docs/release.md)")
    copy_tree(root, dest, [Path(n) for n in listing.stdout.split("\0") if n and (root / n).is_file()])
    if released:
        return f"stage: {version} is released; changelogs/changelog.yaml as committed"
    date = commit_date(root)
    with tempfile.TemporaryDirectory(prefix="devin-outposts-stage.") as scratch:
        # antsibull-changelog needs the collection at .../ansible_collections/devin/outposts: a link to dest
        link = Path(scratch, "ansible_collections", "devin", "outposts")
        link.parent.mkdir(parents=True)
        link.symlink_to(dest.resolve(), target_is_directory=True)
        run_antsibull_changelog(link, Path(scratch), ["antsibull-changelog", "release", "--version", version,
                                                      "--date", date])
    (dest / "changelogs" / ".plugin-cache.yaml").unlink(missing_ok=True)
    staged = yaml.safe_load((dest / CHANGES).read_text(encoding="utf-8")) or {}
    if version not in (staged.get("releases") or {}):
        raise ReleaseError(f"antsibull-changelog release did not record {version} in {CHANGES}")
    if (dest / CHANGELOG).read_text(encoding="utf-8") != (root / CHANGELOG).read_text(encoding="utf-8"):
        raise ReleaseError(f"{CHANGELOG} is out of date: run scripts/release.sh changelog")
    return f"stage: {version} recorded in {CHANGES} as of {date} (unreleased: the last commit's date)"


def tarball_problems(path: Path) -> list[str]:
    """What is wrong with a built tarball's record of its own release (empty when nothing is)."""
    def member(tar: tarfile.TarFile, name: str) -> str:
        try:
            handle = tar.extractfile(name)
        except KeyError:
            handle = None
        if handle is None:
            raise ReleaseError(f"{path.name} has no {name}")
        return handle.read().decode("utf-8")

    with tarfile.open(path) as tar:
        version = json.loads(member(tar, "MANIFEST.json"))["collection_info"]["version"]
        changes = yaml.safe_load(member(tar, str(CHANGES))) or {}
        changelog_md = member(tar, str(CHANGELOG))
    release = (changes.get("releases") or {}).get(version)
    if not release:
        recorded = sorted(changes.get("releases") or {}) or "{}"
        return [f"{path.name}: {CHANGES} records no release {version} (releases: {recorded}): build with "
                "scripts/build.sh, which records it"]
    problems = []
    if not release.get("changes") or not release.get("fragments"):
        problems.append(f"{path.name}: {CHANGES} records {version} without its changes or fragments")
    headings = re.findall(r"^## v(\S+)$", changelog_md.replace("\\.", "."), re.MULTILINE)
    if not headings or headings[0] != version:
        problems.append(f"{path.name}: {CHANGELOG}'s first version is {headings[:1]}, not v{version}")
    return problems


def main(argv: list[str]) -> int:
    root = Path(os.environ.get("RELEASE_ROOT", ROOT))
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    try:
        if command == "versions" and not args:
            problems = version_mismatches(root)
            for problem in problems:
                print(f"ERROR: {problem}", file=sys.stderr)
            if problems:
                print("ERROR: set it with scripts/release.sh bump X.Y.Z (docs/release.md)", file=sys.stderr)
                return 1
            print(f"versions: every place says {galaxy_version(root)}")
        elif command == "bump" and len(args) == 1:
            for path in bump(root, args[0]):
                print(f"bump: {path}")
            print(f"bump: {args[0]}; now run scripts/release.sh changelog")
        elif command == "changelog" and not args:
            new = render_changelog(root)
            old = (root / CHANGELOG).read_text(encoding="utf-8") if (root / CHANGELOG).exists() else ""
            (root / CHANGELOG).write_text(new, encoding="utf-8")
            print(f"changelog: {CHANGELOG} {'rewritten' if new != old else 'unchanged'}")
        elif command == "stage" and len(args) == 1:
            print(stage(root, Path(args[0])))
        elif command == "check-tarball" and len(args) == 1:
            problems = tarball_problems(Path(args[0]))
            for problem in problems:
                print(f"ERROR: {problem}", file=sys.stderr)
            if problems:
                return 1
            print(f"check-tarball: {Path(args[0]).name} records its release in {CHANGES}")
        elif command == "check-changelog" and not args:
            new = render_changelog(root)
            old = (root / CHANGELOG).read_text(encoding="utf-8") if (root / CHANGELOG).exists() else ""
            if new != old:
                sys.stderr.writelines(difflib.unified_diff(
                    old.splitlines(keepends=True), new.splitlines(keepends=True),
                    f"{CHANGELOG} (committed)", f"{CHANGELOG} (from the fragments)"))
                print(f"\nERROR: {CHANGELOG} is out of date: run scripts/release.sh changelog",
                      file=sys.stderr)
                return 1
            print(f"changelog: {CHANGELOG} matches the fragments")
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except ReleaseError as error:
        print(f"ERROR: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
