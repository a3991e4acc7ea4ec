"""The private role devin.outposts._common stays one place, with an interface that cannot drift.

Issue 25: "The role tasks shared by the worker and orchestrator roles live in one place, as prometheus.prometheus
does with ``_common``." The worker and orchestrator roles import its entry points (``import_role`` with
``tasks_from``) and pass every variable explicitly; it has no defaults, so a variable an import forgets is an
undefined-variable error at run time, and one it misspells is silently ignored. These checks read the files:

* each entry point's options in ``meta/argument_specs.yml`` are exactly the ``_devin_outposts_common_*``
  variables its task files read (less the role's own constants and the facts it sets), and each entry point has
  its task file;
* every import of ``devin.outposts._common`` in the roles names an entry point and passes exactly its options, with
  ``rolespec_validate: false``: Ansible would tag the validation task ``always``, so a run with ``--tags`` of one
  phase would validate, and fail on, the variables of the phases it skips. This check stands in for it;
* no task of the worker or orchestrator role has the name and the module of a task of ``_common``: a copy put
  back would (the worker's Windows tasks do the same things with ``ansible.windows`` modules: not copies).

Run: ``.venv/bin/python -m pytest tests/roles/test_common_role.py``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMMON = ROOT / "roles" / "_common"
CALLERS = [ROOT / "roles" / "worker", ROOT / "roles" / "orchestrator"]
VARIABLE = re.compile(r"(?<![\w])_devin_outposts_common_\w+")


def _load(path: Path) -> Any:
    with path.open(encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _tasks(node: Any) -> Iterator[dict[str, Any]]:
    """Every task of a task list, blocks opened."""
    for task in node or []:
        yield task
        for key in ("block", "rescue", "always"):
            yield from _tasks(task.get(key))


def entry_point_files(entry_point: str, tasks_dir: Path = COMMON / "tasks") -> list[Path]:
    """The entry point's task file and the files it imports from the same role."""
    files = [tasks_dir / f"{entry_point}.yml"]
    for task in _tasks(_load(files[0])):
        imported = task.get("ansible.builtin.import_tasks")
        if imported:
            files += entry_point_files(Path(imported).stem, tasks_dir)
    return files


def set_by_the_role(role: Path) -> set[str]:
    """The role's constants (vars/main.yml) and the facts its tasks set: not options."""
    names = set(_load(role / "vars" / "main.yml"))
    for path in (role / "tasks").glob("*.yml"):
        for task in _tasks(_load(path)):
            names |= set(task.get("ansible.builtin.set_fact") or {})
    return names


def option_problems(role: Path) -> list[str]:
    specs = _load(role / "meta" / "argument_specs.yml")["argument_specs"]
    own = set_by_the_role(role)
    problems = []
    entry_files = {p.stem for p in (role / "tasks").glob("*.yml")}
    if entry_files != set(specs):
        problems.append(f"task files {sorted(entry_files)} != entry points {sorted(specs)}")
    for entry_point, spec in specs.items():
        if entry_point not in entry_files:
            continue
        read = {name for path in entry_point_files(entry_point, role / "tasks")
                for name in VARIABLE.findall(path.read_text(encoding="utf-8"))} - own  # fmt: skip
        declared = set(spec.get("options") or {})
        if read != declared:
            problems.append(f"{entry_point}: read but not declared {sorted(read - declared)}, "
                            f"declared but not read {sorted(declared - read)}")  # fmt: skip
    return problems


def imports_of_common(role: Path, base: Path = ROOT) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, task) for every import or include of devin.outposts._common in the role's task files."""
    for path in sorted((role / "tasks").glob("*.yml")):
        for task in _tasks(_load(path)):
            for action in ("ansible.builtin.import_role", "ansible.builtin.include_role"):
                args = task.get(action)
                if isinstance(args, dict) and args.get("name") == "devin.outposts._common":
                    yield f"{path.relative_to(base)} ({task.get('name')})", task


def import_problems(role: Path, specs: dict[str, Any], base: Path = ROOT) -> list[str]:
    problems = []
    for where, task in imports_of_common(role, base):
        args = task.get("ansible.builtin.import_role") or task.get("ansible.builtin.include_role")
        entry_point = args.get("tasks_from")
        if entry_point not in specs:
            problems.append(f"{where}: tasks_from {entry_point!r} is not an entry point of _common "
                            "(give its name without .yml, or the argument spec is not applied)")  # fmt: skip
            continue
        if args.get("rolespec_validate") is not False:
            problems.append(f"{where}: rolespec_validate must be false (the validation task would run under any --tags)")
        passed = set(task.get("vars") or {})
        declared = set(specs[entry_point].get("options") or {})
        if passed != declared:
            problems.append(f"{where}: missing {sorted(declared - passed)}, unknown {sorted(passed - declared)}")
    return problems


def test_each_entry_point_declares_exactly_what_its_tasks_read() -> None:
    assert option_problems(COMMON) == []


def test_every_option_is_required_and_described() -> None:
    for entry_point, spec in _load(COMMON / "meta" / "argument_specs.yml")["argument_specs"].items():
        assert spec.get("short_description"), entry_point
        for name, option in (spec.get("options") or {}).items():
            assert option.get("required") is True and "default" not in option, f"{entry_point}: {name}"
            assert option.get("description"), f"{entry_point}: {name}"


@pytest.mark.parametrize("role", CALLERS, ids=[p.name for p in CALLERS])
def test_every_import_passes_exactly_the_options(role: Path) -> None:
    specs = _load(COMMON / "meta" / "argument_specs.yml")["argument_specs"]
    assert list(imports_of_common(role)), f"{role.name} imports nothing of _common"
    assert import_problems(role, specs) == []


@pytest.mark.parametrize("role", CALLERS, ids=[p.name for p in CALLERS])
def test_no_copy_of_a_shared_task_is_left_in_the_roles(role: Path) -> None:
    shared = {_signature(task) for path in (COMMON / "tasks").glob("*.yml") for task in _tasks(_load(path))}
    copies = sorted(f"{path.relative_to(ROOT)}: {task['name']}"
                    for path in (role / "tasks").glob("*.yml") for task in _tasks(_load(path))
                    if _signature(task) in shared)  # fmt: skip
    assert copies == []


def _signature(task: dict[str, Any]) -> tuple[str, str]:
    """A task's name and module (the first key that names an action)."""
    module = next((key for key in task if key.startswith("ansible.")), "")
    return task.get("name", ""), module


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """A variable read but not declared, an option no task reads, an import that forgets one, names a file, or
    leaves the validation on are found."""
    role = tmp_path / "_common"
    (role / "tasks").mkdir(parents=True)
    (role / "meta").mkdir()
    (role / "vars").mkdir()
    (role / "vars" / "main.yml").write_text("_devin_outposts_common_constant: 1\n")
    (role / "tasks" / "one.yml").write_text(
        "- name: Use\n  ansible.builtin.debug:\n"
        "    msg: '{{ _devin_outposts_common_a }} {{ _devin_outposts_common_b }} {{ _devin_outposts_common_constant }}'\n"
    )
    (role / "meta" / "argument_specs.yml").write_text(
        "argument_specs: {one: {options: {_devin_outposts_common_a: {}, _devin_outposts_common_c: {}}}}\n"
    )
    assert option_problems(role) == [
        "one: read but not declared ['_devin_outposts_common_b'], declared but not read ['_devin_outposts_common_c']"
    ]
    caller = tmp_path / "caller"
    (caller / "tasks").mkdir(parents=True)
    (caller / "tasks" / "main.yml").write_text(
        "- name: Shared\n  ansible.builtin.import_role: {name: devin.outposts._common, tasks_from: one, rolespec_validate: false}\n"
        "  vars: {_devin_outposts_common_a: x}\n"
        "- name: Shared, by file name\n  ansible.builtin.import_role: {name: devin.outposts._common, tasks_from: one.yml}\n"
        "- name: Shared, validated\n  ansible.builtin.import_role: {name: devin.outposts._common, tasks_from: one}\n"
        "  vars: {_devin_outposts_common_a: x, _devin_outposts_common_b: y}\n"
    )
    specs = {"one": {"options": {"_devin_outposts_common_a": {}, "_devin_outposts_common_b": {}}}}
    problems = import_problems(caller, specs, base=tmp_path)
    assert len(problems) == 3, problems
    assert "missing ['_devin_outposts_common_b'], unknown []" in problems[0]
    assert "'one.yml' is not an entry point" in problems[1]
    assert "(Shared, validated): rolespec_validate must be false" in problems[2]
