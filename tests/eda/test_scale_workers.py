# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""playbooks/scale_workers.yml's arithmetic, with a target group that has no host: the count file it reads and
writes, the bounds, and its refusals. (test_autoscale_nspawn.py runs it against a real host.)"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def run_scale(tmp_path: Path, state: Optional[int], **extra: object) -> subprocess.CompletedProcess[str]:
    state_file = tmp_path / "state" / "out.yml"
    if state is not None:
        state_file.parent.mkdir(exist_ok=True)
        state_file.write_text(f"count: {state}\n")
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "hosts": {
                        "localhost": {
                            "ansible_connection": "local",
                            "ansible_python_interpreter": sys.executable,
                        }
                    }
                },
                "nobody": {"hosts": {}},
            }
        )
    )
    variables = {
        "scale_workers_outpost": "eda-scale",
        "scale_workers_target": "nobody",
        "scale_workers_state_file": str(state_file),
        **extra,
    }
    vars_file = tmp_path / "vars.yml"
    vars_file.write_text(yaml.safe_dump(variables))
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "collections"),
        ANSIBLE_HOME=str(tmp_path / "ansible-home"),
        ANSIBLE_NOCOLOR="1",
    )
    playbook = str(Path(sys.executable).parent / "ansible-playbook")
    return subprocess.run(  # noqa: S603 - a fixed command
        [playbook, "-i", str(inventory), "-e", f"@{vars_file}", "devin.outposts.scale_workers"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize(
    ("state", "extra", "expected"),
    [
        (None, {"scale_workers_delta": 1}, 1),  # no file yet: from scale_workers_min (0)
        (None, {"scale_workers_delta": 1, "scale_workers_min": 2}, 3),
        (2, {"scale_workers_delta": 1, "scale_workers_max": 2}, 2),  # at the ceiling
        (0, {"scale_workers_delta": -1}, 0),  # at the floor
        (3, {"scale_workers_delta": -1}, 2),
    ],
)
def test_the_count_moves_by_the_step_within_the_bounds(
    tmp_path: Path, state: Optional[int], extra: dict[str, object], expected: int
) -> None:
    link = ROOT / ".cache" / "collections" / "ansible_collections" / "devin" / "outposts"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(ROOT)
    result = run_scale(tmp_path, state, **extra)
    assert result.returncode == 0, result.stdout + result.stderr
    state_file = tmp_path / "state" / "out.yml"
    assert yaml.safe_load(state_file.read_text()) == {"count": expected}
    assert stat.S_IMODE(state_file.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    "extra",
    [
        {"scale_workers_delta": "one"},
        {"scale_workers_delta": 1, "scale_workers_min": 3, "scale_workers_max": 2},
        {"scale_workers_delta": 1, "scale_workers_prefix": "bad prefix"},
    ],
)
def test_bad_scaling_variables_are_refused_and_change_nothing(
    tmp_path: Path, extra: dict[str, object]
) -> None:
    result = run_scale(tmp_path, 1, **extra)
    assert result.returncode != 0
    assert "scale_workers needs scale_workers_outpost" in result.stdout
    assert (tmp_path / "state" / "out.yml").read_text() == "count: 1\n"
