"""Running a play on the controller alone, as the role-rendering tests do: the role's templates rendered by
Ansible itself (with its defaults and private vars), no host needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def run_local_play(tmp_path: Path, play: list[dict[str, Any]], extra_vars: dict[str, Any]) -> str:
    """Run ``play`` against localhost with ``extra_vars``, through this checkout's collection and without the
    controller's token or API URL in its environment; fail unless it succeeds. Its output, for the caller to
    search for what must not be there."""
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play), encoding="utf-8")
    (tmp_path / "vars.json").write_text(json.dumps(extra_vars), encoding="utf-8")
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DEVIN_OUTPOSTS_TOKEN", "DEVIN_API_URL")},
        "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".cache" / "collections"),
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
    }
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,",
         "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"@{tmp_path / 'vars.json'}",
         str(tmp_path / "play.yml")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr
