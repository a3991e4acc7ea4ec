"""The worker role's controller side works on the oldest controller Python that its ansible-cores support.

ansible-core 2.16 and 2.17 run on a Python 3.10 controller. The role's controller-side work, finding the
worker package, reading its version, building its wheel from a git checkout with pip, and the filter
plugins, used to need Python 3.11 (a hand-written wheel builder imported ``tomllib``) and failed on 3.10
with "Expecting value: line 1 column 1". This test makes a Python 3.10 venv with ansible-core 2.17 from PyPI
and runs exactly those tasks (``tasks_from`` of ``devin.outposts._common``, which the worker and orchestrator
roles import) on localhost, then checks the wheel they built:
its name and version, and that Python 3.10 can install it.

It needs a Python 3.10 interpreter: ``DEVIN_OUTPOSTS_PYTHON310``, else ``python3.10`` on PATH, else
pyenv's. Without one it is skipped on a developer's machine and fails in CI (``CI=true``).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Optional

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CORE = "ansible-core>=2.17,<2.18"


def python310() -> Optional[str]:
    candidates = [os.environ.get("DEVIN_OUTPOSTS_PYTHON310"), shutil.which("python3.10")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.10*/bin/python3.10")))
    for candidate in candidates:
        if candidate and subprocess.run([candidate, "-c", "import venv"], capture_output=True, check=False).returncode == 0:
            return candidate
    return None


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Path:
    interpreter = python310()
    if interpreter is None:
        message = "no Python 3.10 interpreter (set DEVIN_OUTPOSTS_PYTHON310)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    venv = tmp_path_factory.mktemp("py310") / "venv"
    subprocess.run([interpreter, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "--disable-pip-version-check", "-q", CORE],
        check=True, timeout=600,
    )  # fmt: skip
    return venv


def test_the_role_builds_and_reads_the_worker_wheel_on_python_3_10(controller: Path, tmp_path: Path) -> None:
    python = controller / "bin/python"
    version = subprocess.run([str(python), "-c", "import sys; print(sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout
    assert version.strip() == "(3, 10)"
    cache = tmp_path / "cache"
    collections = tmp_path / "collections" / "ansible_collections" / "devin"
    collections.mkdir(parents=True)
    (collections / "outposts").symlink_to(ROOT)
    play = [{
        "name": "The worker role's controller side", "hosts": "localhost", "connection": "local",
        "gather_facts": False,
        "tasks": [
            {"name": "Find the package", "ansible.builtin.include_role": {"name": "devin.outposts._common",
                                                                          "tasks_from": "package", "public": True},
             "vars": {"_devin_outposts_common_role": "worker", "_devin_outposts_common_package_source": "bundled"}},
            {"name": "Build its wheel", "ansible.builtin.include_role": {"name": "devin.outposts._common",
                                                                         "tasks_from": "wheel", "public": True},
             "vars": {"_devin_outposts_common_controller_cache_dir": str(cache)}},
            {"name": "Resolve instances with the role's filter",
             "ansible.builtin.set_fact": {"resolved": "{{ [{'name': 'w', 'outpost': 'o'}] | devin.outposts.worker_instances("
                                          "{'data_dir': '/d', 'workdir_root': '/w', 'has_token': true}) }}"}},
            {"name": "Show what the role found", "ansible.builtin.copy": {
                "dest": str(tmp_path / "found.yml"), "mode": "0600",
                "content": "{{ {'version': _devin_outposts_common_bundled_version, 'name': _devin_outposts_common_wheel_name,"
                           " 'resolved': resolved} | to_nice_yaml }}"}},
        ],
    }]  # fmt: skip
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = {
        "PATH": f"{controller / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "ANSIBLE_COLLECTIONS_PATH": str(tmp_path / "collections"),
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
        "ANSIBLE_NOCOLOR": "1",
    }
    run = subprocess.run(
        # As in a git checkout without a built wheel (extra vars: the role's own vars would win over play vars).
        [str(controller / "bin/ansible-playbook"), "-i", "localhost,", "-e", f"ansible_python_interpreter={python}",
         "-e", f"_devin_outposts_common_prebuilt_wheels={tmp_path / 'no-wheels-here'}", str(tmp_path / "play.yml")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    found = yaml.safe_load((tmp_path / "found.yml").read_text())
    sys.path.insert(0, str(ROOT / "python/devin-outposts/src"))
    try:
        import devin_outposts
    finally:
        sys.path.pop(0)
    assert found["version"] == devin_outposts.__version__
    assert found["resolved"][0]["data_dir"] == "/d/w"
    wheel = cache / "wheels" / found["name"]
    assert wheel.is_file(), sorted(p.name for p in (cache / "wheels").glob("*"))
    assert f"devin_outposts-{devin_outposts.__version__}.dist-info/METADATA" in zipfile.ZipFile(wheel).namelist()
    target = tmp_path / "installed"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-deps", "--target",
         str(target), str(wheel)],
        check=True,
    )  # fmt: skip
    assert (target / "devin_outposts" / "worker" / "runner.py").is_file()
