"""ansible-lint passes on the collection as users install it, not only on this checkout.

The issue: "linting the installed tree fails on 271 ``var-naming[no-role-prefix]``, because the skip lives in an
unshipped ``.ansible-lint``". The role variables use the collection-wide prefix ``devin_outposts_<role>_``
(docs/roles.md), which the rule does not accept, and the configuration that says so (with ``mock_modules`` for
kubernetes.core, which docs/examples/orchestrator_kubernetes.yml uses) was left out of the tarball. It ships now
(docs/architecture.md, "What the release carries").

This test builds the tarball from this checkout with ``ansible-galaxy collection build`` (what ``make build``
runs; the wheel is not needed to lint), installs it with ``ansible-galaxy collection install --offline`` into a
scratch collections path, and runs ``ansible-lint`` (the development venv's, production profile) in the installed
copy, with only that path and awx.awx (which docs/examples/awx/configure.yml uses; scripts/bootstrap.sh unpacks it
into .cache/collections) on ``ANSIBLE_COLLECTIONS_PATH``.

Run: ``.venv/bin/python -m pytest tests/roles/test_installed_lint.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
AWX = ROOT / ".cache" / "collections" / "ansible_collections" / "awx" / "awx"


@pytest.mark.timeout(600)
def test_ansible_lint_passes_on_the_installed_collection(tmp_path: Path) -> None:
    if not (BIN / "ansible-lint").exists():
        pytest.fail("ansible-lint is not in the development venv (scripts/bootstrap.sh installs it)")
    if not AWX.is_dir():
        pytest.fail("awx.awx is not in .cache/collections (run scripts/bootstrap.sh)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "DEVIN_", "VIRTUAL_ENV"))}
    env.update(PATH=os.pathsep.join([str(BIN), env.get("PATH", "")]), HOME=str(tmp_path / "home"),
               ANSIBLE_HOME=str(tmp_path / "ansible-home"), NO_COLOR="1")  # fmt: skip
    build = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(tmp_path / "dist"), str(ROOT)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    (tarball,) = (tmp_path / "dist").glob("devin-outposts-*.tar.gz")
    collections = tmp_path / "collections"
    install = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "install", "--offline", "--force", "-p", str(collections),
         str(tarball)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    installed = collections / "ansible_collections" / "devin" / "outposts"
    # awx.awx beside it, as a user who runs the AWX example has it; nothing of this checkout.
    (collections / "ansible_collections" / "awx").mkdir()
    (collections / "ansible_collections" / "awx" / "awx").symlink_to(AWX, target_is_directory=True)
    lint = subprocess.run(
        [str(BIN / "ansible-lint"), "--offline", "--nocolor"],
        cwd=installed, env={**env, "ANSIBLE_COLLECTIONS_PATH": str(collections)},
        capture_output=True, text=True, timeout=500, check=False,
    )  # fmt: skip
    out = lint.stdout + lint.stderr
    assert lint.returncode == 0, out[-4000:]
    assert "Profile 'production' was required, and it passed." in out, out[-4000:]
    with tarfile.open(tarball) as members:
        assert ".ansible-lint" in members.getnames()
