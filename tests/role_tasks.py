"""A role's own tasks, read from its task files, for tests that run a role's expressions outside the role
(tests/roles/test_windows_templates.py, tests/windows/role_render.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def find_task(path: Path, name: str) -> dict[str, Any]:
    """The task called ``name`` in ``path`` (blocks searched too)."""
    stack: list[Any] = [yaml.safe_load(path.read_text(encoding="utf-8"))]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            if item.get("name") == name:
                return item
            stack.extend(item.get(key) or [] for key in ("block", "rescue", "always"))
    raise LookupError(f"{path.name}: no task {name!r}")


def module_args(task: dict[str, Any]) -> dict[str, Any]:
    """The arguments of the task's module (its ``ansible.*`` or ``devin.*`` key)."""
    return next(value for key, value in task.items() if key.startswith(("ansible.", "devin.")))
