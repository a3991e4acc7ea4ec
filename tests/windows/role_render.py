# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""What the worker role's Windows branch would compute and write for the windows stage's instances.

One ``ansible-playbook`` run on this machine: the role's defaults and vars, its own task expressions (taken from
the task files, so that the stage runs what the role runs: the instances' resolution, the service's ImagePath, the
venv and pip command lines, the venv read), its filters, and its two templates (``service_host.py`` and
``worker.env``, with CRLF line ends as ``win_template`` writes them). Wine then runs the results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from prerequisites import ROOT  # type: ignore[import-not-found]
from role_tasks import find_task, module_args  # type: ignore[import-not-found]

WORKER = ROOT / "roles" / "worker"
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))


def _playbook(out: Path) -> list[dict[str, Any]]:
    tasks_dir = WORKER / "tasks"
    token = find_task(
        tasks_dir / "main.yml",
        "Resolve the token (devin_outposts_worker_token, else the controller's DEVIN_OUTPOSTS_TOKEN)",
    )
    resolve = find_task(tasks_dir / "windows_preflight.yml", "Resolve the instances (Windows)")
    service = module_args(
        find_task(tasks_dir / "windows_configure.yml", "Define each instance's Windows service")
    )
    venv = module_args(
        find_task(tasks_dir / "windows_install.yml", "Create each instance's virtual environment")
    )
    read = module_args(
        find_task(
            tasks_dir / "windows_install.yml",
            "Read each venv's installed package version and base interpreter",
        )
    )
    pip_task = find_task(
        tasks_dir / "windows_install.yml", "Install or upgrade the package in each virtual environment"
    )
    present = "{{ _devin_outposts_worker_resolved | rejectattr('state', 'eq', 'absent') | list }}"
    tasks: list[dict[str, Any]] = [
        {"name": token["name"], "ansible.builtin.set_fact": token["ansible.builtin.set_fact"], "no_log": True},
        {"name": resolve["name"], "ansible.builtin.set_fact": resolve["ansible.builtin.set_fact"], "vars": resolve["vars"]},
        {"name": "Present", "ansible.builtin.set_fact": {"_devin_outposts_worker_present": present}},
        {"name": "ImagePath", "ansible.builtin.set_fact": {"rendered": service["path"]},
         "loop": "{{ _devin_outposts_worker_present }}", "register": "r_image_path"},
        {"name": "venv argv", "ansible.builtin.set_fact": {"rendered": venv["argv"]},
         "loop": "{{ _devin_outposts_worker_present }}", "register": "r_venv_argv"},
        {"name": "read argv", "ansible.builtin.set_fact": {"rendered": read["argv"]},
         "loop": "{{ _devin_outposts_worker_present }}", "register": "r_read_argv"},
        # The pip task loops over the registered venv reads ({item: instance, stdout: ...}); nothing installed yet.
        {"name": "pip argv", "ansible.builtin.set_fact": {"rendered": module_args(pip_task)["argv"]},
         "vars": pip_task["vars"], "register": "r_pip_argv",
         "loop": "{{ _devin_outposts_worker_present | map('windows_stage_as_venv_read') | list }}"},
    ]  # fmt: skip
    for template, suffix in (("windows-service_host.py.j2", "py"), ("windows-worker.env.j2", "env")):
        tasks.append({
            "name": f"Template {template}", "ansible.builtin.template": {
                "src": str(WORKER / "templates" / template), "dest": str(out) + "/{{ item.name }}." + suffix,
                "mode": "0600", "newline_sequence": "\r\n"},
            "loop": "{{ _devin_outposts_worker_present }}",
        })  # fmt: skip
    results = {key: f"{{{{ r_{key}.results | map(attribute='ansible_facts.rendered') | list }}}}"
               for key in ("image_path", "venv_argv", "read_argv", "pip_argv")}  # fmt: skip
    results["instances"] = "{{ _devin_outposts_worker_present }}"
    tasks.append({"name": "Write the results", "ansible.builtin.copy": {
        "content": "{{ results | to_nice_json }}", "dest": str(out / "results.json"), "mode": "0600"},
        "vars": {"results": results}})  # fmt: skip
    return [{
        "name": "Render the worker role's Windows branch", "hosts": "localhost", "connection": "local",
        "gather_facts": False, "tasks": tasks,
        "vars_files": [str(WORKER / "defaults" / "main.yml"), str(WORKER / "vars" / "main.yml"), "settings.yml"],
    }]  # fmt: skip


def render(out: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """Run the role's expressions and templates with ``settings`` (role variables); the results by instance name:
    the resolved row and ``image_path``, ``venv_argv``, ``read_argv``, ``pip_argv``, ``service_host_py`` and
    ``worker_env`` (the files' paths)."""
    out.mkdir(parents=True, exist_ok=True)
    # Ansible finds this checkout as devin.outposts (scripts/lib.sh's ensure_env makes the same link).
    link = ROOT / ".cache" / "collections" / "ansible_collections" / "devin" / "outposts"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(ROOT)
    (out / "render.yml").write_text(yaml.safe_dump(_playbook(out), sort_keys=False))
    (out / "settings.yml").write_text(yaml.safe_dump({"role_path": str(WORKER), **settings}))
    plugins = out / "filter_plugins"
    plugins.mkdir(exist_ok=True)
    (plugins / "venv_read.py").write_text(
        "class FilterModule(object):\n"
        "    def filters(self):\n"
        "        return {'windows_stage_as_venv_read': lambda row: {'item': row, 'stdout': ''}}\n"
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DEVIN_", "PIP_"))}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "collections"), ANSIBLE_FILTER_PLUGINS=str(plugins),
               ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_NOCOLOR="1")  # fmt: skip
    done = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}", str(out / "render.yml")],
        env=env, cwd=out, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    raw = json.loads((out / "results.json").read_text())
    rows: dict[str, Any] = {}
    for index, row in enumerate(raw["instances"]):
        rows[row["name"]] = {
            **row,
            **{key: raw[key][index] for key in ("image_path", "venv_argv", "read_argv", "pip_argv")},
            "service_host_py": out / f"{row['name']}.py",
            "worker_env": out / f"{row['name']}.env",
        }
    return rows
