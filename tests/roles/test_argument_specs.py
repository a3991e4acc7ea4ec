"""Each role's meta/argument_specs.yml mirrors its defaults/main.yml exactly: same variables, same defaults.

Run with ``python -m pytest tests/roles`` (scripts/stages/molecule.sh runs it first).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"
ROLE_DIRS = sorted(p for p in ROLES.iterdir() if (p / "defaults" / "main.yml").is_file())
PYTHON_TYPES = {"str": str, "int": int, "bool": bool, "list": list, "dict": dict, "path": str}


def _load(path: Path) -> Any:
    with path.open(encoding="utf-8") as handle:
        return yaml.safe_load(handle)


@pytest.mark.parametrize("role", ROLE_DIRS, ids=[p.name for p in ROLE_DIRS])
def test_argument_specs_mirror_defaults(role: Path) -> None:
    """Every default is an option of at least one entry point (``main``, or another such as the orchestrator's
    ``kubernetes``), every option of every entry point is a default, and each states that default."""
    defaults = _load(role / "defaults" / "main.yml") or {}
    entry_points = _load(role / "meta" / "argument_specs.yml")["argument_specs"]
    assert "main" in entry_points, f"{role.name}: no main entry point"
    options: dict[str, Any] = {}
    for entry_point, spec in entry_points.items():
        for name, option in (spec.get("options") or {}).items():
            if name in options:
                assert option == options[name], f"{role.name}: {name} differs between entry points ({entry_point})"
            options[name] = option
    assert sorted(options) == sorted(defaults), (
        f"{role.name}: only in defaults: {sorted(set(defaults) - set(options))}; "
        f"only in argument_specs: {sorted(set(options) - set(defaults))}"
    )
    for name, value in defaults.items():
        spec = options[name]
        assert "default" in spec, f"{role.name}: {name} has no default in argument_specs"
        assert spec["default"] == value, f"{role.name}: {name}: default {spec['default']!r} != {value!r}"
        assert isinstance(value, PYTHON_TYPES[spec["type"]]), f"{role.name}: {name} is not a {spec['type']}"
        assert spec.get("description"), f"{role.name}: {name} has no description"
        if "choices" in spec:
            assert value in spec["choices"], f"{role.name}: {name}: {value!r} not in {spec['choices']}"


@pytest.mark.parametrize("role", ROLE_DIRS, ids=[p.name for p in ROLE_DIRS])
def test_public_variables_are_prefixed(role: Path) -> None:
    prefix = f"devin_outposts_{role.name}_"
    defaults = _load(role / "defaults" / "main.yml") or {}
    assert all(name.startswith(prefix) for name in defaults), [n for n in defaults if not n.startswith(prefix)]


def test_drift_is_detected(tmp_path: Path) -> None:
    """The check above can fail: a default changed in one file only is caught."""
    role = tmp_path / "worker"
    (role / "defaults").mkdir(parents=True)
    (role / "meta").mkdir()
    (role / "defaults" / "main.yml").write_text("devin_outposts_worker_x: 1\n", encoding="utf-8")
    (role / "meta" / "argument_specs.yml").write_text(
        "argument_specs: {main: {options: {devin_outposts_worker_x: {type: int, default: 2, description: x}}}}\n",
        encoding="utf-8",
    )
    with pytest.raises(AssertionError, match="default 2 != 1"):
        test_argument_specs_mirror_defaults(role)


def test_drift_in_another_entry_point_is_detected(tmp_path: Path) -> None:
    """A variable that only a second entry point (tasks_from) declares is checked as strictly as main's."""
    role = tmp_path / "orchestrator"
    (role / "defaults").mkdir(parents=True)
    (role / "meta").mkdir()
    (role / "defaults" / "main.yml").write_text(
        "devin_outposts_orchestrator_a: 1\ndevin_outposts_orchestrator_k: x\n", encoding="utf-8"
    )
    (role / "meta" / "argument_specs.yml").write_text(
        "argument_specs:\n"
        "  main: {options: {devin_outposts_orchestrator_a: {type: int, default: 1, description: a}}}\n"
        "  kubernetes: {options: {devin_outposts_orchestrator_k: {type: str, default: y, description: k}}}\n",
        encoding="utf-8",
    )
    with pytest.raises(AssertionError, match="default 'y' != 'x'"):
        test_argument_specs_mirror_defaults(role)
    (role / "meta" / "argument_specs.yml").write_text(
        "argument_specs: {main: {options: {devin_outposts_orchestrator_a: {type: int, default: 1, description: a}}}}\n",
        encoding="utf-8",
    )
    with pytest.raises(AssertionError, match="only in defaults"):
        test_argument_specs_mirror_defaults(role)
