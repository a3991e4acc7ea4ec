"""The Windows branches of the worker and cli roles, checked without Windows (docs/windows.md, "What has run").

* ``ansible-playbook --syntax-check`` of a playbook that applies both roles to a host of a Windows inventory group,
  and imports every Windows task file statically (the roles' main.yml includes them at run time, which a syntax
  check does not follow);
* the Windows preflight, run for real on this machine with Windows facts (the test-only ``pretend_os`` module):
  the branch is picked by the facts, and wrong settings are refused before any module runs on the host;
* the Linux branch is still what a Linux host gets (the same facts with os_family Debian reach the Linux checks).

The templates and command lines are checked in test_windows_templates.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = Path(__file__).resolve().parent / "library"
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
WINDOWS_2022 = {
    "system": "Win32NT", "os_family": "Windows", "distribution": "Microsoft Windows Server 2022 Datacenter",
    "distribution_version": "10.0.20348.0", "distribution_major_version": "10", "architecture": "64-bit",
    "architecture2": "x86_64",
}  # fmt: skip
TOKEN = "tok-windows-preflight-never-shown"  # noqa: S105 - a test value


def ansible_env(**extra: str) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if k not in ("DEVIN_OUTPOSTS_TOKEN", "DEVIN_API_URL")},
        "ANSIBLE_LIBRARY": str(LIBRARY),
        "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".cache" / "collections"),
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
        "ANSIBLE_NOCOLOR": "1",
        **extra,
    }


@pytest.fixture(autouse=True)
def _collection_link() -> None:
    if not (ROOT / ".cache/collections/ansible_collections/devin/outposts").exists():
        pytest.fail("run through scripts/test.sh (scripts/lib.sh links the checkout into .cache/collections)")
    if not (ROOT / ".cache/collections/ansible_collections/ansible/windows").exists():
        pytest.fail("ansible.windows is missing from .cache/collections: run scripts/bootstrap.sh")


# --- Syntax check -------------------------------------------------------------------------------------------------

SYNTAX_PLAYBOOK = [
    {
        "name": "Both roles on the Windows hosts, as a user applies them", "hosts": "windows", "gather_facts": True,
        "roles": [
            {"role": "devin.outposts.cli", "vars": {"devin_outposts_cli_version": "1.2.3"}},
            {"role": "devin.outposts.worker",
             "vars": {"devin_outposts_worker_instances": [{"name": "main", "outpost": "win"}]}},
        ],
    },
    {
        "name": "Every Windows task file, imported statically so that the syntax check reads it", "hosts": "windows",
        "gather_facts": False,
        "tasks": [
            {"name": f"{role} {entry}",
             "ansible.builtin.import_role": {"name": f"devin.outposts.{role}", "tasks_from": entry}}
            for role, entry in [("cli", "windows"), ("cli", "windows_handlers"), ("cli", "windows_ca_absent"),
                                ("worker", "windows"), ("worker", "windows_handlers"),
                                ("worker", "windows_installed")]
        ],
    },
]  # fmt: skip


def syntax_check(tmp_path: Path, playbook: Any) -> subprocess.CompletedProcess[str]:
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"windows": {"hosts": {"win2022": {
        "ansible_host": "192.0.2.10", "ansible_connection": "psrp", "ansible_user": "Administrator",
    }}}}))  # fmt: skip
    (tmp_path / "site.yml").write_text(yaml.safe_dump(playbook, sort_keys=False))
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "--syntax-check", "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "site.yml")],
        env=ansible_env(), cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )


def test_a_playbook_applying_both_roles_to_windows_hosts_passes_the_syntax_check(tmp_path: Path) -> None:
    done = syntax_check(tmp_path, SYNTAX_PLAYBOOK)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "playbook: " in done.stdout


def test_the_syntax_check_fails_on_a_broken_windows_task_file(tmp_path: Path) -> None:
    """A copy of the roles with one Windows task file damaged fails the same check (it reads those files)."""
    collection = tmp_path / "collections" / "ansible_collections" / "devin" / "outposts"
    shutil.copytree(ROOT / "roles", collection / "roles")
    shutil.copytree(ROOT / "plugins", collection / "plugins")
    shutil.copy(ROOT / "galaxy.yml", collection / "galaxy.yml")
    shutil.copytree(ROOT / "meta", collection / "meta")
    broken = collection / "roles" / "worker" / "tasks" / "windows_service.yml"
    broken.write_text(broken.read_text() + "\n- name: Broken\n  ansible.windows.win_service:\n    name: x\n  loop: [\n")
    (tmp_path / "site.yml").write_text(yaml.safe_dump(SYNTAX_PLAYBOOK[1:], sort_keys=False))
    done = subprocess.run(
        [ANSIBLE_PLAYBOOK, "--syntax-check", "-i", "localhost,", str(tmp_path / "site.yml")],
        env=ansible_env(ANSIBLE_COLLECTIONS_PATH=f"{tmp_path / 'collections'}:{ROOT / '.cache' / 'collections'}"),
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode != 0, done.stdout
    assert "windows_service.yml" in done.stdout + done.stderr


# --- Module arguments against the modules' own documentation -----------------------------------------------

WINDOWS_COLLECTION = ROOT / ".cache" / "collections" / "ansible_collections" / "ansible" / "windows" / "plugins"
WINDOWS_TASK_FILES = sorted([*ROOT.glob("roles/*/tasks/windows*.yml"), *ROOT.glob("extensions/molecule/windows/*.yml")])


def _documentation(source: str) -> Any:
    found = re.search(r"DOCUMENTATION\s*=\s*r?(?P<q>'{3}|\"{3})(?P<body>.*?)(?P=q)", source, re.S)
    assert found, "no DOCUMENTATION string"
    return yaml.safe_load(found.group("body"))


def _module_options(module: str) -> dict[str, Any]:
    """The documented options of ``ansible.windows.<module>`` (with its doc fragment), aliases included."""
    path = WINDOWS_COLLECTION / "modules"
    if (path / f"{module}.py").is_file():
        source = (path / f"{module}.py").read_text(encoding="utf-8")
        doc = _documentation(source)
    else:
        doc = yaml.safe_load((path / f"{module}.yml").read_text(encoding="utf-8"))["DOCUMENTATION"]
    options = dict(doc.get("options") or {})
    for fragment in doc.get("extends_documentation_fragment") or []:
        if fragment.startswith("ansible.windows."):
            text = (WINDOWS_COLLECTION / "doc_fragments" / f"{fragment.split('.')[-1]}.py").read_text(encoding="utf-8")
            options.update(_documentation(text)["options"])
    for option in list(options.values()):
        for alias in option.get("aliases") or []:
            options[alias] = option
    return options


def _windows_module_tasks() -> list[tuple[str, str, dict[str, Any]]]:
    found = []
    stack: list[tuple[Path, Any]] = [(path, yaml.safe_load(path.read_text(encoding="utf-8"))) for path in WINDOWS_TASK_FILES]
    while stack:
        path, item = stack.pop()
        if isinstance(item, list):
            stack.extend((path, entry) for entry in item)
        elif isinstance(item, dict):
            for key in ("tasks", "block", "rescue", "always"):
                stack.extend((path, entry) for entry in item.get(key) or [])
            for key, args in item.items():
                if key.startswith("ansible.windows.") and isinstance(args, dict):
                    found.append((f"{path.relative_to(ROOT)}: {item.get('name')}", key.split(".")[-1], args))
    return found


def test_windows_module_arguments_are_documented_options() -> None:
    """Every argument a Windows task gives an ansible.windows module is one of its options, and a literal value of
    an option with choices is one of them (ansible-lint does not check these modules' arguments)."""
    tasks = _windows_module_tasks()
    assert len(tasks) > 40, len(tasks)
    problems = []
    for label, module, args in tasks:
        options = _module_options(module)
        for name, value in args.items():
            if name not in options:
                problems.append(f"{label}: {module} has no option {name}")
            elif "choices" in options[name] and isinstance(value, str) and "{{" not in value:
                if value not in [str(choice) for choice in options[name]["choices"]]:
                    problems.append(f"{label}: {module} {name}={value} not in {options[name]['choices']}")
    assert problems == []


def test_the_argument_check_finds_an_unknown_option() -> None:
    assert "excludes" not in _module_options("win_find")
    assert "pre_shutdown_timeout_ms" in _module_options("win_service")
    assert "proxy_url" in _module_options("win_get_url")


# --- The Windows preflight, for real on this machine ----------------------------------------------------------

WORKER_VARS = {
    "devin_outposts_worker_check_outpost": False,
    "devin_outposts_worker_token": TOKEN,
    "devin_outposts_worker_instances": [{"name": "main", "outpost": "win"}],
    "devin_outposts_worker_windows_python": r"C:\Python312\python.exe",
}


DEBIAN_SYSVINIT = {**WINDOWS_2022, "system": "Linux", "os_family": "Debian", "distribution": "Debian",
                   "distribution_version": "12.8", "service_mgr": "sysvinit", "architecture": "x86_64"}  # fmt: skip
PASSWORD = "pw-never-shown"  # noqa: S105 - a test value
# One inventory host per case, all in one ansible-playbook run (one run per case would cost ~4 s each): the host's
# own variables, and what its failure says (None: it must pass every check).
PREFLIGHT_CASES: dict[str, tuple[dict[str, Any], Optional[str]]] = {
    "con": ({"devin_outposts_worker_instances": [{"name": "con", "outpost": "win"}]},
            "is a device name Windows reserves (CON)"),
    "lpt1-ext": ({"devin_outposts_worker_instances": [{"name": "LPT1.main", "outpost": "win"}]},
                 "is a device name Windows reserves (LPT1)"),
    "trailing-dot": ({"devin_outposts_worker_instances": [{"name": "main.", "outpost": "win"}]},
                     "must not end with a dot"),
    "space": ({"devin_outposts_worker_instances": [{"name": "two words", "outpost": "win"}]}, "must match"),
    "backslash": ({"devin_outposts_worker_instances": [{"name": "a\\b", "outpost": "win"}]}, "must match"),
    "devin-cli": ({"devin_outposts_worker_instances": [{"name": "main", "outpost": "win", "implementation": "devin_cli"}]},
                  "runs the bundled worker only"),
    "posix-workdir": ({"devin_outposts_worker_instances": [{"name": "main", "outpost": "win", "workdir": "/srv/work"}]},
                      "workdir must be an absolute path with a drive letter"),
    "extra-args": ({"devin_outposts_worker_instances": [{"name": "main", "outpost": "win", "extra_args": ["--watch"]}]},
                   "extra_args are Linux-only"),
    "gmsa-without-dollar": ({"devin_outposts_worker_windows_account_type": "gmsa",
                             "devin_outposts_worker_windows_account": "CORP\\svc"}, "a gMSA is DOMAIN"),
    "user-that-is-a-gmsa": ({"devin_outposts_worker_windows_account_type": "user",
                             "devin_outposts_worker_windows_account": "CORP\\gm$",
                             "devin_outposts_worker_windows_account_password": PASSWORD}, "that is a gMSA"),
    "user-without-password": ({"devin_outposts_worker_windows_account_type": "user",
                               "devin_outposts_worker_windows_account": ".\\worker"},
                              "devin_outposts_worker_windows_account_password must be set"),
    "install-without-checksum": ({"devin_outposts_worker_windows_python": ""},
                                 "devin_outposts_worker_windows_python_installer_checksum"),
    "one-session": ({"devin_outposts_worker_session_id": "devin-1"}, "one-session mode"),
    "no-token": ({"devin_outposts_worker_token": ""}, "no token"),
    # Good settings pass every check: each refusal above is its own case's doing.
    "good": ({"devin_outposts_worker_windows_account_type": "user",
              "devin_outposts_worker_windows_account": ".\\devin-worker",
              "devin_outposts_worker_windows_account_password": PASSWORD,
              "devin_outposts_worker_instances": [{"name": "main", "outpost": "win"},
                                                  {"name": "gpu.2", "outpost": "win", "state": "stopped"}]}, None),
    # The same role on a Debian host without systemd: the Linux preflight's own refusal, not a Windows task.
    "debian": ({"os_facts": DEBIAN_SYSVINIT}, "devin.outposts.worker supports Linux hosts"),
}  # fmt: skip


def run_cases(tmp_path: Path, role: str, common: dict[str, Any], cases: dict[str, dict[str, Any]]) -> str:
    """Run ``role`` in check mode, only its preflight tag, on one local inventory host per case; each host's facts
    are its ``os_facts`` (Windows Server 2022 unless the case says otherwise). Returns the output."""
    play = [{
        "name": "Preflight cases", "hosts": "all", "connection": "local", "gather_facts": False,
        "tasks": [
            {"name": "Pretend", "pretend_os": {"facts": "{{ os_facts }}"}, "tags": ["always"]},
            {"name": "Run the role", "ansible.builtin.include_role": {"name": role}, "tags": ["always"]},
        ],
    }]  # fmt: skip
    inventory = {"all": {"vars": {"os_facts": WINDOWS_2022, "ansible_python_interpreter": sys.executable, **common},
                         "hosts": cases}}  # fmt: skip
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    done = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.yml"), "--check", "--forks", "4",
         "--tags", "devin_outposts_worker_preflight,devin_outposts_cli_preflight", str(tmp_path / "play.yml")],
        env=ansible_env(), cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    return done.stdout + done.stderr


def recap(out: str, host: str) -> str:
    return next(line for line in out.splitlines() if re.match(rf"^{re.escape(host)}\s+:\s+ok=", line))


@pytest.fixture(scope="module")
def preflight_output(tmp_path_factory: pytest.TempPathFactory) -> str:
    return run_cases(tmp_path_factory.mktemp("preflight"), "devin.outposts.worker", WORKER_VARS,
                     {host: host_vars for host, (host_vars, dummy) in PREFLIGHT_CASES.items()})


@pytest.mark.parametrize("case", list(PREFLIGHT_CASES))
def test_the_windows_preflight(preflight_output: str, case: str) -> None:
    """Each case's host fails with its own message, or (``good``) passes every check."""
    expected = PREFLIGHT_CASES[case][1]
    lines = [line for line in preflight_output.splitlines() if f"[{case}]" in line and "FAILED" in line or
             f"failed: [{case}]" in line]  # fmt: skip
    if expected is None:
        assert lines == [], preflight_output
        assert "failed=0" in recap(preflight_output, case), preflight_output
    else:
        assert any(expected in line for line in lines), (expected, lines, preflight_output[-4000:])
        assert "failed=1" in recap(preflight_output, case)


def test_no_secret_in_the_preflight_output(preflight_output: str) -> None:
    assert PASSWORD not in preflight_output
    assert TOKEN not in preflight_output


def test_the_cli_role_takes_the_windows_branch(tmp_path: Path) -> None:
    out = run_cases(tmp_path, "devin.outposts.cli", {"devin_outposts_cli_version": "1.2.3"}, {
        "arm64": {"os_facts": {**WINDOWS_2022, "architecture2": "arm64"}},
        "latest": {"devin_outposts_cli_version": "latest"},
        "good": {},
    })  # fmt: skip
    assert "arm64 is arm64; devin_outposts_cli_arch_map names an artifact only for x86_64, aarch64" in out, out
    assert "failed=1" in recap(out, "arm64")
    assert "must be a pinned version" in out and "failed=1" in recap(out, "latest"), out
    assert "failed=0" in recap(out, "good"), out
    assert "Check the download settings (Windows)" in out


def test_outposts_to_create_take_the_platform_of_their_hosts(tmp_path: Path) -> None:
    """The expression of controller.yml's create task, over real hostvars of a Linux and a Windows host (a play
    may mix them): each outpost gets its hosts' platform."""
    controller = yaml.safe_load((ROOT / "roles/worker/tasks/controller.yml").read_text(encoding="utf-8"))
    create = next(task for task in controller if task["name"].startswith("Create the outposts"))
    play = [{
        "name": "Mixed hosts", "hosts": "all", "connection": "local", "gather_facts": False,
        "tasks": [
            {"name": "Pretend", "pretend_os": {"facts": {"os_family": "{{ os_family }}"}}},
            {"name": "Instances", "ansible.builtin.set_fact": {"_devin_outposts_worker_present": "{{ present }}"}},
            {"name": "Evaluate", "ansible.builtin.copy": {"content": "{{ rows | to_json }}", "dest": str(tmp_path / "rows.json"),
                                                          "mode": "0600"},
             "vars": {"rows": create["loop"]}, "run_once": True},
        ],
    }]  # fmt: skip
    inventory = {"all": {"hosts": {
        "lin": {"os_family": "Debian", "present": [{"outpost": "lin-o"}, {"outpost": "outpost_env-9"}]},
        "win": {"os_family": "Windows", "present": [{"outpost": "win-o"}]},
    }}}  # fmt: skip
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    done = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.yml"), "-e", f"ansible_python_interpreter={sys.executable}",
         str(tmp_path / "play.yml")],
        env=ansible_env(), cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((tmp_path / "rows.json").read_text()) == [
        {"name": "lin-o", "platform": "linux"}, {"name": "win-o", "platform": "windows"},
    ]
