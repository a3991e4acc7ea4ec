# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""The execution environment (EE) metadata and example work with ansible-builder 3.

* The collection tarball carries ``meta/execution-environment.yml`` and the two files it names, so that
  ansible-builder finds them in an installed copy (files under ``build_ignore`` would be invisible to it).
* Those files say what is true: no Python requirement, because every import in ``plugins/`` is the standard
  library, ansible-core or this collection (checked here, import by import).
* ``ansible-builder create`` turns the example (``docs/examples/execution-environment/``) and the definition
  ``scripts/ee-image.sh`` builds (``scripts/ee/``) into a build context: a Containerfile that installs the
  tarball, the tarball itself (the same bytes), the requirements file, and no secret from the environment.
* The introspection that runs inside the image build (the context's own ``introspect.py``), run here on the
  tarball installed the way the build installs it, reports our requirements.

Building the image takes minutes and root, so it is not here: ``scripts/ee-image.sh`` does it
(docs/execution-environments.md). This file takes a few seconds.

Run: ``.venv/bin/pytest tests/integration/test_execution_environment.py``.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from prerequisites import tool

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "execution-environment"
LOCAL_DEFINITION = ROOT / "scripts" / "ee"
BIN = Path(sys.executable).parent
VERSION = yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"]
TARBALL_NAME = f"devin-outposts-{VERSION}.tar.gz"
# What a leaked credential would look like: the value planted in the environment below, and the shapes of
# the simulator's and Devin's tokens.
PLANTED_TOKEN = "cog_" + "e" * 48
SECRET = re.compile(r"\bcog_[a-z0-9]{48}|\bct_[A-Za-z0-9_-]{43}|\bsimadmin_[A-Za-z0-9_-]{43}")
# Characters a POSIX shell treats specially in an unquoted word (ansible-builder's ANSIBLE_INSTALL_REFS).
SHELL_SPECIAL = re.compile(r"[<>|;&$`(){}\\\"'*?\[\]~#]")


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(  # noqa: S603 - our tools, no shell
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The collection built from this checkout (build_ignore applied), as ``make build`` builds it."""
    out = tmp_path_factory.mktemp("dist")
    run([tool("ansible-galaxy"), "collection", "build", "--output-path", str(out), str(ROOT)], cwd=out)
    built = out / TARBALL_NAME
    assert built.is_file(), sorted(p.name for p in out.iterdir())
    return built


def builder_env(home: Path) -> dict[str, str]:
    """The environment of ansible-builder: ours, plus a token it must not copy anywhere."""
    env = dict(os.environ)
    env["DEVIN_OUTPOSTS_TOKEN"] = PLANTED_TOKEN
    env["DEVIN_API_URL"] = "https://fleet.example.invalid"
    env["HOME"] = str(home)
    return env


def create_context(definition_dir: Path, definition: str, extra: dict[str, Path], tmp: Path) -> Path:
    """``ansible-builder create`` on a copy of ``definition_dir`` with ``extra`` files beside it."""
    work = tmp / "work"
    shutil.copytree(definition_dir, work)
    for name, source in extra.items():
        if source.is_dir():
            shutil.copytree(source, work / name)
        else:
            shutil.copy2(source, work / name)
    run(
        [tool("ansible-builder"), "create", "--file", definition, "--context", "context", "-v", "2"],
        cwd=work,
        env=builder_env(tmp),
    )
    return work / "context"


def assert_no_secret(context: Path) -> None:
    """No planted token and no token shape in any file of the context, nor in the tarball's members."""
    for path in context.rglob("*"):
        if not path.is_file():
            continue
        if path.name.endswith(".tar.gz"):
            with tarfile.open(path) as tar:
                for member in tar.getmembers():
                    handle = tar.extractfile(member)
                    if handle is None:
                        continue
                    text = handle.read().decode("utf-8", errors="replace")
                    assert PLANTED_TOKEN not in text, f"{path.name}:{member.name}"
                    assert not SECRET.search(text), f"{path.name}:{member.name}: {SECRET.search(text)}"
            continue
        text = path.read_text(errors="replace")
        assert PLANTED_TOKEN not in text, path
        assert "fleet.example.invalid" not in text, path
        assert not SECRET.search(text), f"{path}: {SECRET.search(text)}"


def install_refs(containerfile: str) -> str:
    match = re.search(r'^ARG ANSIBLE_INSTALL_REFS="([^"]*)"$', containerfile, re.MULTILINE)
    assert match, containerfile
    return match.group(1)


def test_tarball_carries_the_ee_metadata(tarball: Path) -> None:
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
        handle = tar.extractfile("meta/execution-environment.yml")
        assert handle is not None
        meta = yaml.safe_load(handle.read())
    assert meta["version"] == 1
    deps = meta["dependencies"]
    assert set(deps) == {"python", "system"}
    # ansible-builder reads the files a relative path names from the installed collection's root.
    for path in deps.values():
        assert path in names, f"{path} is not in the tarball (build_ignore?)"


def test_python_requirements_are_none_because_plugins_use_only_the_standard_library() -> None:
    meta = yaml.safe_load((ROOT / "meta" / "execution-environment.yml").read_text())
    lines = (ROOT / meta["dependencies"]["python"]).read_text().splitlines()
    assert [line for line in lines if line.strip() and not line.lstrip().startswith("#")] == []

    allowed_roots = set(sys.stdlib_module_names) | {"ansible", "__future__"}
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                ours = name.startswith("ansible_collections.devin.outposts.")
                assert ours or name.split(".")[0] in allowed_roots, f"{path.relative_to(ROOT)} imports {name}"


def test_example_gives_a_build_context(tarball: Path, tmp_path: Path) -> None:
    context = create_context(EXAMPLE, "execution-environment.yml", {TARBALL_NAME: tarball}, tmp_path)
    containerfile = (context / "Containerfile").read_text()

    # The tarball, byte for byte, where the example's requirements.yml names it (relative to _build).
    copied = context / "_build" / "collections" / TARBALL_NAME
    assert copied.read_bytes() == tarball.read_bytes()
    requirements = yaml.safe_load((context / "_build" / "requirements.yml").read_text())
    assert {"name": f"collections/{TARBALL_NAME}", "type": "file"} in requirements["collections"]
    assert "COPY _build /build" in containerfile
    assert re.search(r"^RUN .*ansible-galaxy collection install .*-r requirements\.yml", containerfile, re.M)
    # The introspection and assembly of collection requirements run in the build.
    assert "/output/scripts/introspect.py introspect" in containerfile
    assert "RUN /output/scripts/install-from-bindep" in containerfile
    assert 'ARG EE_BASE_IMAGE="registry.access.redhat.com/ubi9/ubi:latest"' in containerfile

    # ansible-builder puts these in an unquoted shell word: a '<' or '>' would be a redirection.
    refs = install_refs(containerfile)
    assert refs.startswith("ansible-core") and "ansible-runner" in refs
    assert not SHELL_SPECIAL.search(refs.replace("~=", "==")), refs
    assert_no_secret(context)


def test_local_definition_gives_a_build_context(tarball: Path, tmp_path: Path) -> None:
    """What scripts/ee-image.sh builds: the example on the Debian base, offline from a wheelhouse."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "placeholder.whl").write_bytes(b"")  # the script downloads the real ones
    example_requirements = EXAMPLE / "requirements.yml"
    context = create_context(
        LOCAL_DEFINITION,
        "execution-environment.yml",
        {TARBALL_NAME: tarball, "requirements.yml": example_requirements, "wheels": wheels},
        tmp_path,
    )
    containerfile = (context / "Containerfile").read_text()
    assert (context / "_build" / "collections" / TARBALL_NAME).read_bytes() == tarball.read_bytes()
    assert (context / "_build" / "requirements.yml").read_text() == example_requirements.read_text()
    assert (context / "_build" / "wheels" / "placeholder.whl").is_file()
    assert 'ARG PKGMGR="/usr/bin/apt-get"' in containerfile
    assert 'ARG ANSIBLE_GALAXY_CLI_COLLECTION_OPTS="--offline"' in containerfile
    assert "RUN rm -rf /var/cache/ee-wheels /etc/pip.conf" in containerfile
    assert not SHELL_SPECIAL.search(install_refs(containerfile).replace("~=", "==")), containerfile
    assert_no_secret(context)


def test_introspection_reports_our_requirements(tarball: Path, tmp_path: Path) -> None:
    """The build's own introspect.py, on the tarball installed as the build's galaxy stage installs it."""
    context = create_context(EXAMPLE, "execution-environment.yml", {TARBALL_NAME: tarball}, tmp_path)
    collections = tmp_path / "collections"
    env = builder_env(tmp_path)
    env["ANSIBLE_COLLECTIONS_PATH"] = str(collections)  # only this path: no other copy is "already installed"
    run(
        [tool("ansible-galaxy"), "collection", "install", "--offline", "--force", "-p", str(collections), str(tarball)],
        cwd=tmp_path,
        env=env,
    )
    installed = collections / "ansible_collections" / "devin" / "outposts"
    assert (installed / "meta" / "execution-environment.yml").is_file()

    proc = run(
        [sys.executable, str(context / "_build" / "scripts" / "introspect.py"), "introspect", str(collections)],
        cwd=tmp_path,
        env=env,
    )
    data = yaml.safe_load(proc.stdout.split("---", 1)[1])
    assert data["python"] == []
    bindep = (ROOT / "meta" / "ee-bindep.txt").read_text().splitlines()
    expected = [f"{line}  # from collection devin.outposts" for line in bindep if line and not line.startswith("#")]
    assert expected, "meta/ee-bindep.txt lists nothing"
    assert data["system"] == expected


@pytest.mark.parametrize("definition", [EXAMPLE / "execution-environment.yml", LOCAL_DEFINITION / "execution-environment.yml"])
def test_definitions_name_the_current_version(definition: Path) -> None:
    """A version bump (galaxy.yml) must update the tarball name the examples copy and install."""
    data = yaml.safe_load(definition.read_text())
    sources = [entry["src"] for entry in data["additional_build_files"]]
    assert TARBALL_NAME in sources
    requirements = yaml.safe_load((EXAMPLE / "requirements.yml").read_text())
    assert f"collections/{TARBALL_NAME}" in [entry["name"] for entry in requirements["collections"]]
