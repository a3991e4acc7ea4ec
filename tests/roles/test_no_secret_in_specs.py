"""No secret, and no lookup that can return one, in a role's argument spec, defaults or vars, or in a playbook's vars.

The issue: a typo in a role's arguments (``outpst:`` for ``outpost:``) failed the argument validation, and the
failure printed the whole spec, ``"devin_outposts_worker_token": {"default": "cog_..."}`` included, at normal
verbosity, although the option is ``no_log``: the spec's default was an env lookup of the token, and the failure
result templates it. The roles now resolve the token (the public variable, else the controller's
``DEVIN_OUTPOSTS_TOKEN``) in a ``no_log`` task into a private fact, and their public defaults are empty.

* ``test_a_misspelt_role_argument_shows_no_token``: real ``ansible-playbook`` runs (the development venv's core,
  and the oldest and the newest supported core, ``core_venvs.py``) of the worker role, the orchestrator role and
  the orchestrator's ``kubernetes`` entry point, each with a misspelt argument, with ``DEVIN_OUTPOSTS_TOKEN`` set
  to a marker on the controller: each fails its argument validation, and the marker appears nowhere in stdout or
  stderr, at the default verbosity, at ``-v`` and at ``-vvv``.
* The scans: every argument spec default is literal (the one exception, the API URL's env lookup, is listed
  here with its exact text), a ``no_log`` option defaults to nothing or an empty string, and no
  ``vars:`` of a playbook or a role (defaults, vars files, plays, tasks) looks up a secret outside a ``no_log``
  task. ``test_the_scans_can_fail`` feeds them what the roles had before.

Run: ``.venv/bin/python -m pytest tests/roles/test_no_secret_in_specs.py``.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from core_venvs import NEWEST, OLDEST, core_venv

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
PLAYBOOKS = ROOT / "playbooks"
PLAYBOOK_TIMEOUT = 300

#: The only templated defaults an argument spec may have, with their exact text: the API URL is no secret.
TEMPLATED_DEFAULTS = {
    ("worker", "devin_outposts_worker_api_url"): "{{ lookup('ansible.builtin.env', 'DEVIN_API_URL') or 'https://api.devin.ai' }}",
    ("orchestrator", "devin_outposts_orchestrator_api_url"): "{{ lookup('ansible.builtin.env', 'DEVIN_API_URL') or 'https://api.devin.ai' }}",
}  # fmt: skip
#: A lookup whose arguments mention one of these finds a secret (``DEVIN_OUTPOSTS_TOKEN``, a token file).
SECRET = re.compile(r"token|passw|secret|credential|private_key|api_key", re.IGNORECASE)
LOOKUP = re.compile(r"\b(?:lookup|query|q)\s*\(([^)]*)\)")


def _load(path: Path) -> Any:
    with path.open(encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _templated(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def secret_lookups(value: Any) -> list[str]:
    """The lookups in ``value`` (any nesting) whose arguments name a secret."""
    return [match.group(0) for text in _strings(value) for match in LOOKUP.finditer(text) if SECRET.search(match.group(1))]


def _options(options: dict[str, Any], where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, option in (options or {}).items():
        yield f"{where}{name}", option
        yield from _options(option.get("options") or {}, f"{where}{name}.")


def spec_problems(role: str, argument_specs: dict[str, Any]) -> list[str]:
    """What an argument spec must not hold: a templated default (but the listed ones), a no_log option whose
    default is not empty, a lookup of a secret anywhere."""
    problems = []
    for entry_point, spec in argument_specs["argument_specs"].items():
        for name, option in _options(spec.get("options") or {}, ""):
            where = f"{role} ({entry_point}): {name}"
            default = option.get("default")
            if _templated(default) and TEMPLATED_DEFAULTS.get((role, name)) != default:
                problems.append(f"{where}: templated default {default!r}")
            if option.get("no_log") and default not in (None, ""):
                problems.append(f"{where}: a secret's default must be empty, not {default!r}")
            problems += [f"{where}: looks up a secret: {found}" for found in secret_lookups(option)]
    return problems


def vars_problems(where: str, variables: dict[str, Any]) -> list[str]:
    """What a defaults or vars file, or a ``vars:`` section, must not hold: a lookup of a secret."""
    return [f"{where}: {name} looks up a secret: {found}"
            for name, value in (variables or {}).items() for found in secret_lookups(value)]  # fmt: skip


def play_problems(where: str, node: Any) -> list[str]:
    """Every ``vars:`` section in a playbook or a task file (plays, role entries, blocks, tasks), except those
    of a ``no_log`` task: there a lookup's value is never shown."""
    problems: list[str] = []
    if isinstance(node, list):
        for item in node:
            problems += play_problems(where, item)
    elif isinstance(node, dict):
        if isinstance(node.get("vars"), dict) and node.get("no_log") is not True:
            problems += vars_problems(f"{where} ({node.get('name', 'unnamed')})", node["vars"])
        for key, value in node.items():
            if key != "vars":
                problems += play_problems(where, value)
    return problems


ROLE_DIRS = sorted(p for p in ROLES.iterdir() if (p / "meta" / "argument_specs.yml").is_file())


@pytest.mark.parametrize("role", ROLE_DIRS, ids=[p.name for p in ROLE_DIRS])
def test_no_secret_in_the_argument_specs(role: Path) -> None:
    assert spec_problems(role.name, _load(role / "meta" / "argument_specs.yml")) == []


@pytest.mark.parametrize("role", ROLE_DIRS, ids=[p.name for p in ROLE_DIRS])
def test_no_lookup_of_a_secret_in_the_roles_variables_or_tasks(role: Path) -> None:
    problems = []
    for path in sorted([*role.glob("defaults/*.yml"), *role.glob("vars/*.yml")]):
        problems += vars_problems(str(path.relative_to(ROOT)), _load(path))
    for path in sorted([*role.glob("tasks/*.yml"), *role.glob("handlers/*.yml")]):
        problems += play_problems(str(path.relative_to(ROOT)), _load(path))
    assert problems == []


#: The collection's playbooks, and the AWX configuration-as-code playbook (it reads two tokens).
PLAYBOOK_FILES = [*sorted(PLAYBOOKS.glob("*.yml")), ROOT / "docs" / "examples" / "awx" / "configure.yml"]


@pytest.mark.parametrize("playbook", PLAYBOOK_FILES, ids=lambda p: p.name)
def test_no_lookup_of_a_secret_in_the_playbooks_vars(playbook: Path) -> None:
    assert play_problems(str(playbook.relative_to(ROOT)), _load(playbook)) == []


def test_the_scans_can_fail() -> None:
    """What the roles and a playbook had before: each is found."""
    env_token = "{{ lookup('ansible.builtin.env', 'DEVIN_OUTPOSTS_TOKEN') }}"
    spec = {"argument_specs": {"main": {"options": {
        "devin_outposts_worker_token": {"type": "str", "no_log": True, "default": env_token},
        "devin_outposts_worker_api_url": {"type": "str", "default": "{{ lookup('ansible.builtin.env', 'X') }}"},
        "devin_outposts_worker_instances": {"type": "list", "options": {
            "token": {"type": "str", "no_log": True, "default": "t"}}},
    }}}}  # fmt: skip
    problems = spec_problems("worker", spec)
    assert any("devin_outposts_worker_token: templated default" in p for p in problems), problems
    assert any("devin_outposts_worker_token: a secret's default must be empty" in p for p in problems), problems
    assert any("devin_outposts_worker_token: looks up a secret" in p for p in problems), problems
    assert any("devin_outposts_worker_api_url: templated default" in p for p in problems), problems
    assert any("devin_outposts_worker_instances.token: a secret's default" in p for p in problems), problems
    assert vars_problems("defaults", {"devin_outposts_worker_token": env_token}) != []
    assert vars_problems("defaults", {"x": {"y": [env_token]}}) != []
    file_lookup = "{{ lookup('ansible.builtin.file', devin_outposts_orchestrator_token_file) }}"
    play = [{"hosts": "all", "vars": {"devin_outposts_worker_session_token": file_lookup}, "roles": ["r"]}]
    assert play_problems("play.yml", play) != []
    task = [{"name": "t", "block": [{"name": "u", "debug": {"msg": "x"}, "vars": {"v": file_lookup}}]}]
    assert play_problems("tasks.yml", task) != []
    assert play_problems("tasks.yml", [{**task[0]["block"][0], "no_log": True}]) == []
    # What is allowed stays allowed.
    assert vars_problems("defaults", {"devin_outposts_worker_api_url": TEMPLATED_DEFAULTS[
        ("worker", "devin_outposts_worker_api_url")], "x": "{{ lookup('ansible.builtin.env', 'HOME') }}"}) == []


# --- A misspelt argument, for real ----------------------------------------------------------------------------

#: Three plays, each with one misspelt argument. A play whose hosts all fail ends the run, so each play has a
#: second host, ``bystander``, for which the role is skipped (and with it its argument validation); the hosts are
#: all this machine. One run then shows the three validation failures.
MISSPELT = [
    {
        "name": "The worker role, an instance with outpst: for outpost:",
        "hosts": "worker:bystander", "connection": "local", "gather_facts": False,
        "vars": {"devin_outposts_worker_instances": [{"name": "main", "outpst": "gpu-h200"}]},
        "roles": [{"role": "devin.outposts.worker", "when": "inventory_hostname == 'worker'"}],
    },
    {
        "name": "The orchestrator role, driver podmn",
        "hosts": "orchestrator:bystander", "connection": "local", "gather_facts": False,
        "vars": {"devin_outposts_orchestrator_outpost": "o", "devin_outposts_orchestrator_driver": "podmn"},
        "roles": [{"role": "devin.outposts.orchestrator", "when": "inventory_hostname == 'orchestrator'"}],
    },
    {
        "name": "The orchestrator's kubernetes entry point, resume policy snapshott",
        "hosts": "kubernetes:bystander", "connection": "local", "gather_facts": False,
        "tasks": [{
            "name": "Render the manifests",
            "ansible.builtin.include_role": {"name": "devin.outposts.orchestrator", "tasks_from": "kubernetes"},
            "vars": {"devin_outposts_orchestrator_outpost": "o", "devin_outposts_orchestrator_resume_policy": "snapshott",
                     "devin_outposts_orchestrator_k8s_image": "example.invalid/orchestrator:1"},
            "when": "inventory_hostname == 'kubernetes'",
        }],
    },
]  # fmt: skip
INVENTORY = "worker\norchestrator\nkubernetes\nbystander\n"
VALIDATION_FAILED = "Validation of arguments failed"
RECAP = re.compile(r"^(\w+)\s+:\s+ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)


def _ansible_playbook(core: str) -> Path:
    if core == "dev":
        return Path(sys.executable).with_name("ansible-playbook")
    return core_venv(core) / "bin" / "ansible-playbook"


@pytest.mark.timeout(600 + 3 * PLAYBOOK_TIMEOUT)
@pytest.mark.parametrize("core", ["dev", OLDEST, NEWEST], ids=["core-dev", f"core-{OLDEST}", f"core-{NEWEST}"])
def test_a_misspelt_role_argument_shows_no_token(core: str, tmp_path: Path) -> None:
    playbook = _ansible_playbook(core)
    python = playbook.with_name("python")
    (tmp_path / "play.yml").write_text(yaml.safe_dump(MISSPELT, sort_keys=False))
    (tmp_path / "inventory").write_text(INVENTORY)
    collections = tmp_path / "collections"
    (collections / "ansible_collections" / "devin").mkdir(parents=True)
    (collections / "ansible_collections" / "devin" / "outposts").symlink_to(ROOT, target_is_directory=True)
    marker = "cog_" + secrets.token_hex(20)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "DEVIN_", "VIRTUAL_ENV"))}
    env.update(
        PATH=os.pathsep.join([str(playbook.parent), env.get("PATH", "")]),
        DEVIN_OUTPOSTS_TOKEN=marker,
        ANSIBLE_COLLECTIONS_PATH=str(collections),
        ANSIBLE_HOME=str(tmp_path / "ansible-home"),
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_STDOUT_CALLBACK="default",
        ANSIBLE_RETRY_FILES_ENABLED="0",
        ANSIBLE_LOCALHOST_WARNING="False",
    )
    for verbosity in ([], ["-v"], ["-vvv"]):
        done = subprocess.run(
            [str(playbook), "-i", str(tmp_path / "inventory"), *verbosity,
             "-e", f"ansible_python_interpreter={python}", str(tmp_path / "play.yml")],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=PLAYBOOK_TIMEOUT, check=False,
        )  # fmt: skip
        out = done.stdout + done.stderr
        # Each play failed in its argument validation, for its misspelt argument, and nothing else failed.
        assert done.returncode == 2, out[-3000:]
        recap = {host: tuple(int(n) for n in counts) for host, *counts in RECAP.findall(out)}
        assert recap == {"worker": (0, 0, 1), "orchestrator": (0, 0, 1), "kubernetes": (0, 0, 1),
                         "bystander": (0, 0, 0)}, out[-3000:]  # fmt: skip
        assert "devin_outposts_worker_instances.outpst" in out, out[-3000:]
        assert "got: podmn" in out, out[-3000:]
        assert '"argument_spec_name": "kubernetes"' in out and "got: snapshott" in out, out[-3000:]
        # The spec was printed (the failure shows it), and the marker nowhere.
        assert out.count(VALIDATION_FAILED) >= 3 and "argument_spec_data" in out, out[-3000:]
        assert marker not in out, f"the token is in the output at {verbosity or 'default verbosity'}"
        assert marker[len("cog_"):] not in out
