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
    defaults = _load(role / "defaults" / "main.yml") or {}
    options = _load(role / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
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
