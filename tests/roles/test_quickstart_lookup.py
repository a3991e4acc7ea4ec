"""The quickstart's command that finds the outpost's id prints no deprecation warning, on any supported core.

The issue: "the quickstart's ``ansible ... -o`` prints 2 deprecation warnings on 2.21 (the collection's own
``outpost_id`` lookup does the job)". ansible-core 2.21 deprecates ``-o`` and the oneline callback. This test
takes the line that sets ``OUTPOST`` from docs/quickstart.md's commands, as printed, and runs it in bash with
the ``ansible`` of the oldest, the development and the newest supported ansible-core, against the simulator
of the ``sim`` fixture: it must print no Ansible deprecation warning (``[DEPRECATION WARNING]``) and set
``OUTPOST`` to the outpost's id.
(``scripts/check-quickstart.sh`` runs the whole guide and also fails on a deprecation warning.)

Run: ``.venv/bin/python -m pytest tests/roles/test_quickstart_lookup.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from core_venvs import IN_CI, NEWEST, OLDEST, core_venv

try:
    from devin_outposts_sim.testing import SimHandle
except ImportError as exc:
    if IN_CI:
        raise
    pytest.skip(f"the simulator is not installed: {exc}", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "quickstart.md"


def outpost_line() -> str:
    """The quickstart's ``OUTPOST=$(...)`` line, as printed."""
    blocks = re.findall(r"^```sh\n(.*?)^```", QUICKSTART.read_text(), re.S | re.M)
    lines = [line for block in blocks for line in block.splitlines() if line.startswith("OUTPOST=")]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("core", ["dev", OLDEST, NEWEST], ids=["core-dev", f"core-{OLDEST}", f"core-{NEWEST}"])
def test_the_outpost_id_line_prints_no_deprecation(core: str, sim: SimHandle, tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent if core == "dev" else core_venv(core) / "bin"
    outpost = sim.admin.create_outpost("quickstart", "linux")
    collections = tmp_path / "collections"
    (collections / "ansible_collections" / "devin").mkdir(parents=True)
    (collections / "ansible_collections" / "devin" / "outposts").symlink_to(ROOT, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "DEVIN_", "VIRTUAL_ENV"))}
    env.update(
        PATH=os.pathsep.join([str(bin_dir), env.get("PATH", "")]),
        HOME=str(tmp_path / "home"),
        ANSIBLE_COLLECTIONS_PATH=str(collections),
        ANSIBLE_NOCOLOR="1",
        DEVIN_API_URL=sim.url,
        DEVIN_OUTPOSTS_TOKEN=sim.create_token("orchestrator"),
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    script = f'set -euo pipefail\n{outpost_line()}\nprintf "OUTPOST=%s\\n" "$OUTPOST"\n'
    done = subprocess.run(["bash", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert f"OUTPOST={outpost.outpost_id}\n" in done.stdout, out
    # Ansible's own deprecation warnings, as scripts/check-quickstart.sh looks for them. Not the Python
    # warnings of ansible-core's dependencies: cryptography 51 warns that DSA is deprecated when ansible-core
    # imports it (ansible/_internal/_ssh/_ssh_agent.py), on every ansible command: no line of the guide can
    # change that.
    assert "DEPRECATION WARNING" not in out, out
