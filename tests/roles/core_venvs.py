"""The venvs of the oldest and the newest supported ansible-core, for the tests that run ``ansible-playbook``
with more than the development venv's core.

``core_venv`` of ``scripts/lib.sh`` makes them (the newest ansible-core of that minor from PyPI, with the Python
that core needs) and caches them under ``.cache/core-matrix/<core>/venv``, shared with ``scripts/core-matrix.sh``.
When a venv cannot be made the test is skipped on a developer's machine and fails in CI (``CI=true``).
"""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path


from prerequisites import IN_CI, ROOT, cannot_run

__all__ = ["IN_CI", "NEWEST", "OLDEST", "VENV_TIMEOUT", "core_venv", "lib_sh"]

LIB_SH = ROOT / "scripts" / "lib.sh"
#: Making a core's venv the first time (pip from PyPI); a cached one is found at once.
VENV_TIMEOUT = 600


def lib_sh(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``script`` in bash with scripts/lib.sh sourced (``$1``... are ``args``)."""
    return subprocess.run(
        ["bash", "-c", f'source "{LIB_SH}" && {script}', "lib.sh", *args],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def core_versions() -> tuple[str, str]:
    """The oldest and the newest core of CORE_VERSIONS in scripts/lib.sh."""
    found = lib_sh('echo "${CORE_VERSIONS[0]} ${CORE_VERSIONS[-1]}"').stdout.split()
    assert len(found) == 2, "cannot read CORE_VERSIONS from scripts/lib.sh"
    return found[0], found[1]


OLDEST, NEWEST = core_versions()


@cache
def core_venv(core: str) -> Path:
    """The venv of ``core`` (made by scripts/lib.sh's ``core_venv`` unless it is cached), or skip/fail."""
    try:
        done = lib_sh('core_venv "$1"', core, timeout=VENV_TIMEOUT)
    except subprocess.TimeoutExpired:
        cannot_run(f"making the venv of ansible-core {core} took more than {VENV_TIMEOUT} s")
    if done.returncode != 0 or not done.stdout.strip():
        cannot_run(f"cannot make the venv of ansible-core {core}: {done.stderr.strip()[-800:]}")
    venv = Path(done.stdout.strip().splitlines()[-1])
    if not (venv / "bin" / "ansible-playbook").is_file():
        cannot_run(f"{venv} has no ansible-playbook")
    return venv
