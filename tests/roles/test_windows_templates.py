"""What the Windows branch of the worker role would write and run, rendered by Ansible itself on this machine.

One ``ansible-playbook`` run (module fixture) takes, from the role's own task files, the expressions of the fields
that matter (the instances' resolution, the service's ``path`` = ImagePath, every ``argv``), evaluates them with
the role's defaults, vars and filters for sample instances, and renders the templates (service_host.py and
worker.env) with ``ansible.builtin.template``. The tests then check the results:

* the token is on no command line and not in the ImagePath, only in worker.env;
* the ImagePath is the venv's base interpreter and service_host.py, quoted, never the venv's launcher;
* service_host.py compiles for any instance name (spaces, backslashes, quotes, newlines: preflight refuses those
  names, and the template must not depend on it), and when run with a stand-in service host it puts the venv's
  site-packages on sys.path, adds pywin32's DLL directory (pywin32 #1450) and calls ``main`` with the instance and
  its env file;
* worker.env is one ``KEY=VALUE`` per line with Windows paths intact, and a newline in a value cannot add a line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from role_tasks import find_task, module_args  # type: ignore[import-not-found]
from test_windows_roles import ANSIBLE_PLAYBOOK, ROOT, ansible_env  # type: ignore[import-not-found]

WORKER = ROOT / "roles" / "worker"
TOKEN = "tok-SECRET-windows-7f3a"  # noqa: S105 - a test value
PASSWORD = "pw-SECRET-windows-91c2"  # noqa: S105 - a test value
BASE_PYTHON = r"C:\Program Files\Python312\python.exe"
ROOT_DIR = r"D:\Data\devin outposts"
# Names preflight accepts, and names it refuses that the template must survive anyway.
NAMES = ["main", "gpu.2", "with space", "back\\slash\\", 'quo"te', "new\nline", "ünïcode"]
# A quote or a line break cannot be in a Windows path: worker_windows_image_path refuses them (and preflight the
# names), so the command lines are rendered for the other names.
COMMAND_NAMES = [name for name in NAMES if '"' not in name and "\n" not in name]


def _render_playbook(out: Path) -> list[dict[str, Any]]:
    tasks_dir = WORKER / "tasks"
    token = find_task(tasks_dir / "main.yml", "Resolve the token (devin_outposts_worker_token, else the controller's DEVIN_OUTPOSTS_TOKEN)")
    resolve = find_task(tasks_dir / "windows_preflight.yml", "Resolve the instances (Windows)")
    service = module_args(find_task(tasks_dir / "windows_configure.yml", "Define each instance's Windows service"))
    venv = module_args(find_task(tasks_dir / "windows_install.yml", "Create each instance's virtual environment"))
    read = module_args(find_task(tasks_dir / "windows_install.yml", "Read each venv's installed package version and base interpreter"))
    pip_task = find_task(tasks_dir / "windows_install.yml", "Install or upgrade the package in each virtual environment")
    python = module_args(find_task(tasks_dir / "windows_python.yml", "Read the version of the interpreter"))
    render = [
        ("image_path", {"value": service["path"]}, "_devin_outposts_worker_present", {}),
        ("service_user", {"value": service["username"]}, "_devin_outposts_worker_present", {}),
        ("service_password", {"value": service["password"]}, "_devin_outposts_worker_present", {}),
        ("venv_argv", {"value": venv["argv"]}, "_devin_outposts_worker_present", {}),
        ("read_argv", {"value": read["argv"]}, "_devin_outposts_worker_present", {}),
        ("python_argv", {"value": python["argv"]}, "[1]", {}),
        ("pip_argv", {"value": module_args(pip_task)["argv"]}, "wrapped", pip_task["vars"]),
    ]  # fmt: skip
    tasks: list[dict[str, Any]] = [
        {"name": "Known facts of the install", "ansible.builtin.set_fact": {
            "_devin_outposts_common_bundled_version": "9.8.7",
            "_devin_outposts_worker_windows_python_exe": BASE_PYTHON,
            "_devin_outposts_worker_windows_base_python": {"gpu.2": r"C:\Python311\python.exe"},
        }},
        {"name": token["name"], "ansible.builtin.set_fact": token["ansible.builtin.set_fact"], "no_log": True},
        {"name": resolve["name"], "ansible.builtin.set_fact": resolve["ansible.builtin.set_fact"], "vars": resolve["vars"]},
        {"name": "Present", "ansible.builtin.set_fact": {"_devin_outposts_worker_present": "{{ _devin_outposts_worker_resolved }}"}},
    ]  # fmt: skip
    for key, fact, loop, task_vars in render:
        commands = "_devin_outposts_worker_present | selectattr('name', 'in', command_names)"
        loop_expr: Any = [1] if loop == "[1]" else "{{ " + commands + " | list }}"
        if loop == "wrapped":  # the pip task loops over the registered venv reads: {item: instance, stdout: ...}
            loop_expr = "{{ " + commands + " | map('worker_windows_test_wrap') | list }}"
        tasks.append({"name": f"Render {key}", "ansible.builtin.set_fact": {"rendered": fact["value"]},
                      "vars": task_vars, "loop": loop_expr, "register": f"r_{key}", "no_log": False})
    for template, suffix in (("windows-service_host.py.j2", "py"), ("windows-worker.env.j2", "env")):
        tasks.append({
            "name": f"Template {template}", "ansible.builtin.template": {
                "src": str(WORKER / "templates" / template), "dest": str(out) + "/{{ idx }}." + suffix, "mode": "0600"},
            "loop": "{{ _devin_outposts_worker_present }}", "loop_control": {"index_var": "idx"},
        })  # fmt: skip
    results = {key: f"{{{{ r_{key}.results | map(attribute='ansible_facts.rendered') | list }}}}" for key in [entry[0] for entry in render]}
    results["instances"] = "{{ _devin_outposts_worker_present }}"
    tasks.append({"name": "Write the results", "ansible.builtin.copy": {
        "content": "{{ results | to_nice_json }}", "dest": str(out / "results.json"), "mode": "0600"},
        "vars": {"results": results}})  # fmt: skip
    return [{
        "name": "Render the Windows branch", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "tasks": tasks,
        # The role's defaults and vars, then the sample settings (a later vars file wins).
        "vars_files": [str(WORKER / "defaults" / "main.yml"), str(WORKER / "vars" / "main.yml"), "sample.yml"],
    }]  # fmt: skip


def _sample_vars() -> dict[str, Any]:
    return {
        "role_path": str(WORKER),
        # A variable, not a literal in the expression: Jinja string literals and backslashes do not mix.
        "command_names": COMMAND_NAMES,
        "devin_outposts_worker_token": TOKEN,
        "devin_outposts_worker_api_url": "https://api.example.test",
        "devin_outposts_worker_windows_root": ROOT_DIR,
        "devin_outposts_worker_windows_account_type": "user",
        "devin_outposts_worker_windows_account": r".\devin-worker",
        "devin_outposts_worker_windows_account_password": PASSWORD,
        "devin_outposts_worker_ca_certificate": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        "devin_outposts_worker_https_proxy": "http://proxy.example.test:3128",
        "devin_outposts_worker_fleet_size": 40,
        "devin_outposts_worker_instances": [
            {"name": name, "outpost": "win", **({"env": {"INJECT": "a\nDEVIN_OUTPOSTS_TOKEN=stolen"}} if i == 0 else {}),
             **({"fleet_size": 1} if name == "gpu.2" else {})}
            for i, name in enumerate(NAMES)
        ],
    }  # fmt: skip


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("windows-render")
    (out / "render.yml").write_text(yaml.safe_dump(_render_playbook(out), sort_keys=False))
    (out / "sample.yml").write_text(yaml.safe_dump(_sample_vars()))
    # A test-only filter: wraps an instance as the registered result the pip task loops over.
    plugins = out / "filter_plugins"
    plugins.mkdir()
    (plugins / "wrap.py").write_text(
        "class FilterModule(object):\n"
        "    def filters(self):\n"
        "        return {'worker_windows_test_wrap': lambda row: {'item': row, 'stdout': ''}}\n"
    )
    done = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}", str(out / "render.yml")],
        env=ansible_env(ANSIBLE_FILTER_PLUGINS=str(plugins)), cwd=out, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((out / "results.json").read_text())
    results["dir"] = out
    return results


def _row(rendered: dict[str, Any], name: str) -> tuple[int, dict[str, Any]]:
    """The index of instance ``name`` among the rendered templates, and its resolved row."""
    return next((i, row) for i, row in enumerate(rendered["instances"]) if row["name"] == name)


def _command_index(name: str) -> int:
    """The index of instance ``name`` among the rendered command lines."""
    return COMMAND_NAMES.index(name)


def test_every_instance_was_rendered(rendered: dict[str, Any]) -> None:
    assert [row["name"] for row in rendered["instances"]] == NAMES
    for key in ("image_path", "venv_argv", "read_argv", "pip_argv", "service_user", "service_password"):
        assert len(rendered[key]) == len(COMMAND_NAMES), key


def test_the_token_is_on_no_command_line_and_not_in_the_image_path(rendered: dict[str, Any]) -> None:
    command_lines = [*rendered["image_path"], *rendered["venv_argv"], *rendered["read_argv"], *rendered["pip_argv"],
                     *rendered["python_argv"], *rendered["service_user"]]  # fmt: skip
    assert command_lines
    for line in command_lines:
        assert TOKEN not in json.dumps(line)
        assert PASSWORD not in json.dumps(line)


def test_the_token_is_in_worker_env_only(rendered: dict[str, Any]) -> None:
    for index, dummy in enumerate(NAMES):
        assert TOKEN in (rendered["dir"] / f"{index}.env").read_text()
        assert TOKEN not in (rendered["dir"] / f"{index}.py").read_text()


@pytest.mark.parametrize("name", COMMAND_NAMES)
def test_the_image_path_runs_the_base_interpreter_with_service_host_py(rendered: dict[str, Any], name: str) -> None:
    dummy, row = _row(rendered, name)
    image_path = rendered["image_path"][_command_index(name)]
    base = r"C:\Python311\python.exe" if name == "gpu.2" else BASE_PYTHON  # gpu.2's venv has another base
    script = row["host_script"]
    assert image_path == f'"{base}" "{script}"'
    assert row["host_script"] == row["instance_dir"] + "\\service_host.py"
    assert row["instance_dir"].startswith(ROOT_DIR + "\\")
    assert "Scripts" not in image_path
    assert row["service"] == f"devin-outposts-worker-{name}"


def test_the_image_path_of_main(rendered: dict[str, Any]) -> None:
    assert rendered["image_path"][_command_index("main")] == (
        r'"C:\Program Files\Python312\python.exe" "D:\Data\devin outposts\main\service_host.py"'
    )


def test_the_user_account_and_its_password_go_to_the_service_only(rendered: dict[str, Any]) -> None:
    assert set(rendered["service_user"]) == {r".\devin-worker"}
    assert set(rendered["service_password"]) == {PASSWORD}
    task = find_task(WORKER / "tasks" / "windows_configure.yml", "Define each instance's Windows service")
    assert task["no_log"] == "{{ devin_outposts_worker_windows_account_type == 'user' }}"


def test_pip_runs_from_the_venv_with_the_wheel_and_the_ca_bundle(rendered: dict[str, Any]) -> None:
    index = _command_index("main")
    argv = rendered["pip_argv"][index]
    assert argv[:4] == [f"{ROOT_DIR}\\main\\venv\\Scripts\\python.exe", "-m", "pip", "install"]
    assert argv[argv.index("--cert") + 1] == f"{ROOT_DIR}\\ca-bundle.pem"
    assert argv[-1] == f"{ROOT_DIR}\\wheels\\devin_outposts-9.8.7-py3-none-any.whl"
    assert rendered["venv_argv"][index] == [BASE_PYTHON, "-m", "venv", f"{ROOT_DIR}\\main\\venv"]
    assert rendered["python_argv"][0][0] == BASE_PYTHON


@pytest.mark.parametrize("name", NAMES)
def test_service_host_py_compiles_and_starts_the_service_host(
    rendered: dict[str, Any], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    index, row = _row(rendered, name)
    source = (rendered["dir"] / f"{index}.py").read_text(encoding="utf-8")
    code = compile(source, f"service_host-{index}.py", "exec")
    calls: dict[str, Any] = {}
    fake = types.ModuleType("devin_outposts.worker.windows.service")

    def fake_main(argv: list[str]) -> int:
        calls["argv"] = argv
        return 0

    fake.main = fake_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "devin_outposts.worker.windows.service", fake)
    monkeypatch.setattr(os, "add_dll_directory", lambda path: calls.setdefault("dll", path), raising=False)
    real_isdir = os.path.isdir
    monkeypatch.setattr(os.path, "isdir", lambda path: path == row["pywin32_dlls"] or real_isdir(path))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PATH", "/usr/bin")
    with pytest.raises(SystemExit) as stopped:
        exec(code, {"__name__": "__main__"})  # noqa: S102 - the rendered script, run with a stand-in service host
    assert stopped.value.code == 0
    assert calls["argv"] == ["--instance", name, "--env-file", row["instance_dir"] + "\\worker.env"]
    assert calls["dll"] == row["instance_dir"] + "\\venv\\Lib\\site-packages\\pywin32_system32"
    assert os.environ["PATH"].startswith(calls["dll"] + os.pathsep)
    # site.addsitedir makes the path absolute: on this (POSIX) machine a Windows path gets the current directory first.
    assert any(path.endswith(row["instance_dir"] + "\\venv\\Lib\\site-packages") for path in sys.path)


def test_worker_env_is_one_plain_line_per_variable(rendered: dict[str, Any]) -> None:
    index, row = _row(rendered, "main")
    lines = (rendered["dir"] / f"{index}.env").read_text(encoding="utf-8").splitlines()
    env = dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))
    assert env["DEVIN_OUTPOSTS_TOKEN"] == TOKEN
    assert env["DEVIN_WORKER_WORKDIR"] == r"C:\devin-outposts\main"
    assert env["DEVIN_WORKER_CACHE_DIR"] == f"{ROOT_DIR}\\main\\state\\cache"
    assert env["DEVIN_CA_BUNDLE"] == f"{ROOT_DIR}\\ca-bundle.pem"
    assert env["HTTPS_PROXY"] == env["https_proxy"] == "http://proxy.example.test:3128"
    assert env["DEVIN_OUTPOSTS_WORKER_OUTPOST"] == "win"
    # A newline in a value cannot add a variable: the value is one line, the token line is the role's.
    assert env["INJECT"] == "aDEVIN_OUTPOSTS_TOKEN=stolen"
    assert sum(1 for line in lines if line.startswith("DEVIN_OUTPOSTS_TOKEN=")) == 1
    assert env["DEVIN_WORKER_FLEET_SIZE"] == "40"  # devin_outposts_worker_fleet_size


def test_a_fleet_of_one_says_nothing_of_its_size(rendered: dict[str, Any]) -> None:
    index, row = _row(rendered, "gpu.2")
    assert row["fleet_size"] == 1
    text = (rendered["dir"] / f"{index}.env").read_text(encoding="utf-8")
    assert "DEVIN_WORKER_FLEET_SIZE" not in text, text


def test_the_secret_writing_tasks_are_no_log() -> None:
    """Every Windows task that templates the token or the password into a file or a service hides its output."""
    task = find_task(WORKER / "tasks" / "windows_configure.yml", "Write each instance's worker.env (the token lives only here)")
    assert task["no_log"] is True
