"""scripts/release.py fails on a version that disagrees with galaxy.yml, and on a stale CHANGELOG.md.

Each test works on a scratch copy of the files it needs, never on the working tree.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

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
