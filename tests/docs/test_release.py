"""The release's metadata and contents.

* scripts/release.py fails on a version that disagrees with galaxy.yml, on a stale CHANGELOG.md, on a first
  release whose fragments break, deprecate or remove something, and on a built tarball whose
  changelogs/changelog.yaml does not record its version; its ``stage`` command makes the tree the tarball is
  built from, with the release recorded;
* every role has the README.md that Galaxy's importer requires;
* docs/examples/requirements.yml names every collection the examples use besides ansible.builtin and this one.

Each test works on a scratch copy of the files it needs, never on the working tree.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from types import ModuleType

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def load_release() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release", ROOT / "scripts/release.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_files(root: Path, names: list[Path]) -> Path:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, root / name)
    return root


def version_files(release: ModuleType, root: Path) -> Path:
    return copy_files(root, [release.GALAXY, *(path for path, dummy in release.VERSION_PLACES)])


def test_the_tree_agrees_with_galaxy_yml() -> None:
    release = load_release()
    assert release.version_mismatches(ROOT) == []


def test_a_place_that_disagrees_fails(tmp_path: Path) -> None:
    release = load_release()
    root = version_files(release, tmp_path)
    version = release.galaxy_version(root)
    fleet_api = root / "plugins/module_utils/_fleet_api.py"
    text = fleet_api.read_text(encoding="utf-8")
    fleet_api.write_text(text.replace(f'COLLECTION_VERSION = "{version}"', 'COLLECTION_VERSION = "9.9.9"'),
                         encoding="utf-8")
    problems = release.version_mismatches(root)
    assert len(problems) == 1, problems
    assert problems[0].startswith("plugins/module_utils/_fleet_api.py:"), problems
    assert "'9.9.9'" in problems[0], problems
    assert release.main(["versions"]) == 0  # the real tree is untouched


def test_a_place_that_no_longer_shows_a_version_fails(tmp_path: Path) -> None:
    release = load_release()
    root = version_files(release, tmp_path)
    (root / "README.md").write_text("# devin.outposts\n", encoding="utf-8")
    problems = release.version_mismatches(root)
    assert problems and problems[0].startswith("README.md: no version found"), problems


def test_bump_sets_every_place(tmp_path: Path) -> None:
    release = load_release()
    root = version_files(release, tmp_path)
    old = release.galaxy_version(root)
    changed = release.bump(root, "7.8.9")
    assert set(changed) == {release.GALAXY, *(path for path, dummy in release.VERSION_PLACES)}
    assert release.galaxy_version(root) == "7.8.9"
    assert release.version_mismatches(root) == []
    for path, pattern in release.VERSION_PLACES:
        found = [match["version"] for match in pattern.finditer((root / path).read_text(encoding="utf-8"))]
        assert found and set(found) == {"7.8.9"}, (path, found, old)
    with pytest.raises(release.ReleaseError):
        release.bump(root, "8.0")


def test_changelog_misses_a_new_fragment(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    release = load_release()
    listing = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard",  # noqa: S607
         "--", *map(str, release.COPIED), "CHANGELOG.md"],
        check=True, capture_output=True, text=True,
    ).stdout
    root = copy_files(tmp_path / "tree", [Path(name) for name in listing.split("\0") if name])
    subprocess.run(["git", "init", "-q", str(root)], check=True)  # noqa: S607
    monkeypatch.setenv("RELEASE_ROOT", str(root))
    assert release.main(["check-changelog"]) == 0, capsys.readouterr().err
    (root / "changelogs/fragments/planted.yml").write_text(
        "bugfixes:\n  - outpost - a planted fix that CHANGELOG.md does not have yet.\n", encoding="utf-8")
    assert release.main(["check-changelog"]) == 1
    error = capsys.readouterr().err
    assert "+* outpost \\- a planted fix" in error and "run scripts/release.sh changelog" in error, error
    assert release.main(["changelog"]) == 0
    assert "a planted fix" in (root / "CHANGELOG.md").read_text(encoding="utf-8")
    assert release.main(["check-changelog"]) == 0  # idempotent: a second run matches what the first wrote


def scratch_tree(release: ModuleType, root: Path) -> Path:
    """A git repository holding what release.py reads of the working tree (uncommitted edits included)."""
    listing = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard",  # noqa: S607
         "--", *map(str, release.COPIED), "CHANGELOG.md"],
        check=True, capture_output=True, text=True,
    ).stdout
    copy_files(root, [Path(name) for name in listing.split("\0") if name and (ROOT / name).is_file()])
    subprocess.run(["git", "init", "-q", str(root)], check=True)  # noqa: S607
    return root


def released_sections(changelog_md: str, version: str) -> list[str]:
    """The section titles (### ...) of one version's part of CHANGELOG.md (which escapes dots)."""
    changelog_md = changelog_md.replace("\\.", ".")
    part = re.search(rf"^## v{re.escape(version)}\n(.*?)(?=^## v|\Z)", changelog_md, re.MULTILINE | re.DOTALL)
    assert part is not None, f"CHANGELOG.md has no section v{version}"
    return re.findall(r"^### (.+)$", part.group(1), re.MULTILINE)


def test_a_first_release_breaks_deprecates_and_removes_nothing() -> None:
    release = load_release()
    titles = ("Breaking Changes / Porting Guide", "Deprecated Features",
              "Removed Features (previously deprecated)")
    changes = yaml.safe_load((ROOT / "changelogs/changelog.yaml").read_text(encoding="utf-8"))
    recorded = changes["releases"] or {}
    if recorded:  # released: the first release in changelog.yaml
        first = min(recorded, key=lambda version: tuple(map(int, str(version).split("."))))
        sections = sorted(recorded[first].get("changes") or {})
        assert not set(sections) & set(release.NOT_IN_A_FIRST_RELEASE), (first, sections)
        return
    version = release.galaxy_version(ROOT)  # the first release, still being developed: CHANGELOG.md's preview
    sections = released_sections((ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), version)
    assert sections, sections
    for title in titles:
        assert title not in sections, f"the first release lists {title!r}: {sections}"


@pytest.mark.parametrize("section", ["breaking_changes", "deprecated_features", "removed_features"])
def test_a_first_release_fragment_that_breaks_something_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        section: str) -> None:
    release = load_release()
    root = scratch_tree(release, tmp_path / "tree")
    monkeypatch.setenv("RELEASE_ROOT", str(root))
    (root / "changelogs/fragments/planted.yml").write_text(
        f"{section}:\n  - outpost - something a first release cannot have changed.\n", encoding="utf-8")
    assert release.main(["changelog"]) == 1
    error = capsys.readouterr().err
    assert "planted.yml" in error and section in error and "first release" in error, error


def test_the_release_is_recorded_in_the_tree_the_tarball_is_built_from(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    release = load_release()
    root = scratch_tree(release, tmp_path / "tree")
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)  # noqa: S607
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.invalid",  # noqa: S607
                    "-c", "commit.gpgsign=false", "commit", "-qm", "tree"], check=True,
                   env={**os.environ, "GIT_COMMITTER_DATE": "2031-02-03T04:05:06Z"})
    version = release.galaxy_version(root)
    names = sorted(p.name for p in release.fragments(root))
    monkeypatch.setenv("RELEASE_ROOT", str(root))
    stage = tmp_path / "stage"
    assert release.main(["stage", str(stage)]) == 0, capsys.readouterr().err
    changes = yaml.safe_load((stage / "changelogs/changelog.yaml").read_text(encoding="utf-8"))
    recorded = changes["releases"][version]
    assert sorted(recorded["fragments"]) == names
    assert str(recorded["release_date"]) == "2031-02-03"  # an unreleased version: the last commit's date
    assert recorded["changes"]["release_summary"].startswith("Initial release"), recorded["changes"]
    assert {m["name"] for m in recorded["modules"]} >= {"outpost", "outpost_info", "session_info"}, recorded
    assert not list((stage / "changelogs/fragments").glob("*.yml"))
    # what the tarball carries as CHANGELOG.md is the committed one
    assert (stage / "CHANGELOG.md").read_bytes() == (root / "CHANGELOG.md").read_bytes()
    # the working tree the stage was made from is unchanged
    assert yaml.safe_load((root / "changelogs/changelog.yaml").read_text(encoding="utf-8"))["releases"] == {}
    assert sorted(p.name for p in release.fragments(root)) == names


def make_tarball(path: Path, version: str, changelog_yaml: str, changelog_md: str) -> Path:
    manifest = json.dumps({"collection_info": {"namespace": "devin", "name": "outposts", "version": version}})
    with tarfile.open(path, "w:gz") as tar:
        for name, text in (("MANIFEST.json", manifest), ("changelogs/changelog.yaml", changelog_yaml),
                           ("CHANGELOG.md", changelog_md)):
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_tarball_whose_changelog_records_no_release_fails(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    release = load_release()
    version = release.galaxy_version(ROOT)
    changelog_md = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    empty = make_tarball(tmp_path / "empty.tar.gz", version, "---\nancestor: null\nreleases: {}\n",
                         changelog_md)
    assert release.main(["check-tarball", str(empty)]) == 1
    error = capsys.readouterr().err
    assert f"records no release {version}" in error, error
    recorded = (f"---\nancestor: null\nreleases:\n  {version}:\n"
                f"    changes:\n      release_summary: Initial.\n"
                f"    fragments:\n      - {version}.yml\n    release_date: '1980-01-01'\n")
    other = make_tarball(tmp_path / "other.tar.gz", "9.9.9", recorded, changelog_md)
    assert release.main(["check-tarball", str(other)]) == 1
    assert "records no release 9.9.9" in capsys.readouterr().err
    good = make_tarball(tmp_path / "good.tar.gz", version, recorded, changelog_md)
    assert release.main(["check-tarball", str(good)]) == 0, capsys.readouterr().err


def test_every_role_has_a_readme() -> None:
    """Galaxy's importer refuses a collection with a role that has none ("No role readme found")."""
    roles = sorted(p for p in (ROOT / "roles").iterdir() if (p / "tasks").is_dir())
    assert roles
    missing = [role.name for role in roles if not (role / "README.md").is_file()]
    assert missing == [], f"roles without README.md: {missing}"


FQCN_TASK_KEY = re.compile(r"^\s*(?:- )?([a-z0-9_]+)\.([a-z0-9_]+)\.[a-z0-9_]+:", re.MULTILINE)


def test_the_examples_requirements_name_every_collection_they_use() -> None:
    examples = ROOT / "docs" / "examples"
    used = set()
    for path in examples.rglob("*.yml"):
        if "execution-environment" in path.parts:
            continue  # the EE's own requirements.yml installs the tarball
        used |= {f"{m[0]}.{m[1]}" for m in FQCN_TASK_KEY.findall(path.read_text(encoding="utf-8"))}
    used -= {"ansible.builtin", "devin.outposts"}
    assert used, "found no collection in docs/examples: the pattern is broken"
    requirements = yaml.safe_load((examples / "requirements.yml").read_text(encoding="utf-8"))
    named = {entry["name"] for entry in requirements["collections"]}
    assert named == used, f"docs/examples/requirements.yml: {sorted(named)}; the examples use {sorted(used)}"
    for entry in requirements["collections"]:
        assert entry.get("version"), f"{entry['name']}: no version range"
