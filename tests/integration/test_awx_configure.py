# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""The AWX configuration-as-code playbook (docs/examples/awx/configure.yml), without an AWX.

* ``ansible-playbook --syntax-check`` passes with awx.awx on the collections path (bootstrap unpacks it into
  .cache/collections), and so does every playbook a job template names;
* the job templates, as Ansible templates them (the playbook's own vars, rendered by a real run of a generated
  play), name playbooks that exist, carry surveys AWX accepts, and ask only for variables that their playbook
  or the role it runs reads;
* the credential type it creates is read from credential_types/devin_outposts/, the shipped definition;
* ``awx_machine_credential``: docs/awx.md's command line gives Ansible the credential's name whole, and the play,
  run against a stand-in for AWX's API, stops before any change when AWX has no Machine credential of the name it
  got (the shell-split ``Fleet`` of ``-e awx_machine_credential="Fleet SSH key"``).

The ansible-lint stage lints the playbook itself (production profile).
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from prerequisites import cannot_run, tool

ROOT = Path(__file__).resolve().parents[2]
CONFIGURE = ROOT / "docs" / "examples" / "awx" / "configure.yml"
AWX_COLLECTIONS = ROOT / ".cache" / "collections"
SURVEY_TYPES = {"text", "textarea", "password", "integer", "float", "multiplechoice", "multiselect"}
#: Where a survey variable may be read, per playbook: the playbook, and the role it runs.
ROLE_OF = {
    "playbooks/deploy_workers.yml": "worker",
    "playbooks/rolling_upgrade.yml": "worker",
    "playbooks/decommission.yml": "worker",
    "playbooks/deploy_orchestrator.yml": "orchestrator",
}


@pytest.fixture(scope="module")
def ansible_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if not (AWX_COLLECTIONS / "ansible_collections" / "awx" / "awx").is_dir():
        cannot_run("awx.awx is not in .cache/collections (run scripts/bootstrap.sh)")
    base = tmp_path_factory.mktemp("collections")
    (base / "ansible_collections" / "devin").mkdir(parents=True)
    (base / "ansible_collections" / "devin" / "outposts").symlink_to(ROOT, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "DEVIN_", "CONTROLLER_"))}
    env.update(
        ANSIBLE_COLLECTIONS_PATH=os.pathsep.join([str(base), str(AWX_COLLECTIONS)]),
        ANSIBLE_HOME=str(base / "ansible-home"),
        ANSIBLE_LOCAL_TEMP=str(base / "tmp"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_RETRY_FILES_ENABLED="0",
        ANSIBLE_DEPRECATION_WARNINGS="0",
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    )
    return env


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def play_vars() -> dict[str, Any]:
    plays = yaml.safe_load(CONFIGURE.read_text())
    assert len(plays) == 1
    return dict(plays[0]["vars"])


@pytest.fixture(scope="module")
def job_templates(
    ansible_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    """awx_job_templates as Ansible renders it from configure.yml's own vars."""
    work = tmp_path_factory.mktemp("render")
    out = work / "job_templates.json"
    play = {
        "name": "Render the job templates of configure.yml",
        "hosts": "localhost",
        "gather_facts": False,
        "vars": play_vars(),
        "tasks": [
            {"ansible.builtin.copy": {"content": "{{ awx_job_templates | to_json }}", "dest": str(out)}}
        ],
    }
    (work / "render.yml").write_text(yaml.safe_dump([play], sort_keys=False))
    proc = run([tool("ansible-playbook"), "-i", "localhost,", "-c", "local", "render.yml"], ansible_env, work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rendered: list[dict[str, Any]] = json.loads(out.read_text())
    return rendered


def test_syntax_check(ansible_env: dict[str, str]) -> None:
    proc = run([tool("ansible-playbook"), "--syntax-check", str(CONFIGURE)], ansible_env, ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_syntax_check_catches_an_unknown_module(ansible_env: dict[str, str], tmp_path: Path) -> None:
    # The check above means something: a misspelt awx.awx module fails it.
    broken = tmp_path / "configure.yml"
    broken.write_text(CONFIGURE.read_text().replace("awx.awx.job_template:", "awx.awx.job_templat:"))
    proc = run([tool("ansible-playbook"), "--syntax-check", str(broken)], ansible_env, ROOT)
    assert proc.returncode != 0
    assert "awx.awx.job_templat" in proc.stdout + proc.stderr


def test_the_job_templates_playbooks_pass_syntax_check(
    job_templates: list[dict[str, Any]], ansible_env: dict[str, str]
) -> None:
    playbooks = sorted({jt["playbook"] for jt in job_templates})
    assert playbooks == [
        "playbooks/decommission.yml",
        "playbooks/deploy_orchestrator.yml",
        "playbooks/deploy_workers.yml",
        "playbooks/outpost_status.yml",
        "playbooks/register_outpost.yml",
        "playbooks/rolling_upgrade.yml",
    ]
    proc = run([tool("ansible-playbook"), "--syntax-check", *playbooks], ansible_env, ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def check_question(question: dict[str, Any]) -> list[str]:
    """What AWX would refuse in one survey question (or what would surprise a user)."""
    errors = []
    name = question.get("variable", "?")
    for key in ("question_name", "variable", "type", "required"):
        if key not in question:
            errors.append(f"{name}: needs {key}")
    kind = question.get("type")
    if kind not in SURVEY_TYPES:
        errors.append(f"{name}: unknown type {kind!r}")
    if kind in ("multiplechoice", "multiselect"):
        choices = question.get("choices", [])
        if not choices or question.get("default", choices[0] if choices else None) not in choices:
            errors.append(f"{name}: the default must be one of the choices")
    if (
        kind == "integer"
        and not question["min"] <= int(question.get("default", question["min"])) <= question["max"]
    ):
        errors.append(f"{name}: the default is out of range")
    if not question.get("required") and "default" in question and kind == "text":
        # An optional text question with a default always sends it, overriding the inventory's value.
        errors.append(f"{name}: an optional text question must have no default")
    return errors


def test_the_surveys(job_templates: list[dict[str, Any]]) -> None:
    assert len(job_templates) == 6
    for jt in job_templates:
        playbook = (ROOT / jt["playbook"]).read_text()
        role = ROLE_OF.get(jt["playbook"])
        readers = playbook + ((ROOT / "roles" / role / "defaults" / "main.yml").read_text() if role else "")
        variables = [question["variable"] for question in jt["survey"]]
        assert len(set(variables)) == len(variables), jt["name"]
        for question in jt["survey"]:
            assert check_question(question) == [], jt["name"]
            assert question["variable"] in readers, f"{jt['name']}: nothing reads {question['variable']}"
        # The instance list comes from the inventory, never from a survey.
        assert "devin_outposts_worker_instances" not in variables
        assert jt["name"].startswith("Devin Outposts: ")


def test_the_token_scopes(job_templates: list[dict[str, Any]]) -> None:
    # What creates or deletes outposts, or claims for machines, needs the orchestrator scope; the rest gets
    # the machine-scoped credential when there is one, so that worker hosts never hold the orchestrator token.
    scopes = {jt["playbook"]: jt["scope"] for jt in job_templates}
    assert scopes == {
        "playbooks/register_outpost.yml": "orchestrator",
        "playbooks/outpost_status.yml": "machine",
        "playbooks/deploy_workers.yml": "machine",
        "playbooks/rolling_upgrade.yml": "machine",
        "playbooks/decommission.yml": "orchestrator",
        "playbooks/deploy_orchestrator.yml": "orchestrator",
    }


def test_the_survey_check_can_fail() -> None:
    assert check_question({"question_name": "x", "variable": "v", "type": "radio", "required": True})
    assert check_question(
        {
            "question_name": "x",
            "variable": "v",
            "type": "integer",
            "min": 1,
            "max": 9,
            "default": 0,
            "required": True,
        }
    )
    assert check_question(
        {
            "question_name": "x",
            "variable": "v",
            "type": "multiplechoice",
            "choices": ["a"],
            "default": "b",
            "required": True,
        }
    )
    assert check_question(
        {"question_name": "x", "variable": "v", "type": "text", "required": False, "default": ""}
    )


def test_the_credential_type_comes_from_the_shipped_files() -> None:
    variables = play_vars()
    assert (
        variables["awx_credential_type_dir"] == "{{ playbook_dir }}/../../../credential_types/devin_outposts"
    )
    type_dir = (CONFIGURE.parent / "../../../credential_types/devin_outposts").resolve()
    assert type_dir == ROOT / "credential_types" / "devin_outposts"
    assert (type_dir / "input.yml").is_file() and (type_dir / "injectors.yml").is_file()
    text = CONFIGURE.read_text()
    assert "awx_credential_type_dir ~ '/input.yml'" in text
    assert "awx_credential_type_dir ~ '/injectors.yml'" in text


# --- awx_machine_credential: how it reaches Ansible, and the check that AWX has it ----------------------------

#: The Machine credentials the stand-in AWX has, by name.
AWX_MACHINE_CREDENTIALS = {"Fleet SSH key": 7}


class FakeAwx:
    """A stand-in for AWX's API on 127.0.0.1: answers GETs (the Machine credentials by name, empty lists for
    anything else), refuses every write with 503, and records each request (method, path, query)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, list[str]]]] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query)
                fake.requests.append(("GET", url.path, query))
                results: list[dict[str, Any]] = []
                if url.path == "/api/v2/credentials/" and query.get("credential_type__kind") == ["ssh"]:
                    name = query.get("name", [""])[0]
                    if name in AWX_MACHINE_CREDENTIALS:
                        results = [{"id": AWX_MACHINE_CREDENTIALS[name], "name": name, "kind": "ssh"}]
                self._answer(200, {"count": len(results), "next": None, "previous": None, "results": results})

            def _write(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                fake.requests.append((self.command, url.path, urllib.parse.parse_qs(url.query)))
                self._answer(503, {"detail": "the stand-in AWX changes nothing"})

            do_POST = do_PUT = do_PATCH = do_DELETE = _write  # noqa: N815 - http.server's names

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def credential_names_asked(self) -> list[str]:
        return [q.get("name", [""])[0] for method, path, q in self.requests if path == "/api/v2/credentials/"]

    def writes(self) -> list[tuple[str, str]]:
        return [(method, path) for method, path, dummy in self.requests if method != "GET"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_awx() -> Any:
    fake = FakeAwx()
    yield fake
    fake.close()


def run_configure(
    extra: list[str], fake: FakeAwx, ansible_env: dict[str, str], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    env = {
        **ansible_env, "CONTROLLER_HOST": fake.url, "CONTROLLER_OAUTH_TOKEN": "awx-test-token",
        "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1",
    }  # fmt: skip
    return run([tool("ansible-playbook"), "-i", "localhost,", "-c", "local", str(CONFIGURE), *extra], env, tmp_path)


def documented_extra_vars() -> list[str]:
    """The ``-e`` arguments of the configure.yml command line in docs/awx.md, as the shell passes them."""
    text = (ROOT / "docs" / "awx.md").read_text()
    block = re.search(r"```sh\n(.*?)```", text, re.DOTALL)
    assert block, "docs/awx.md has no sh block"
    line = block.group(1).replace("\\\n", " ")
    command = next(c for c in line.splitlines() if "configure.yml" in c)
    argv = shlex.split(command)
    extra = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-e"]
    assert any("awx_machine_credential" in arg for arg in extra), command
    return extra


def test_the_documented_command_line_names_the_credential_whole(
    fake_awx: FakeAwx, ansible_env: dict[str, str], tmp_path: Path
) -> None:
    """docs/awx.md's command, split as bash splits it, runs the check: the name reaches AWX's API whole."""
    proc = run_configure([*sum((["-e", arg] for arg in documented_extra_vars()), []), "--tags", "awx_checks"],
                         fake_awx, ansible_env, tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert fake_awx.credential_names_asked() == ["Fleet SSH key"]
    assert fake_awx.writes() == []


@pytest.mark.parametrize(
    "argument", ['{"awx_machine_credential": "Fleet SSH key"}', 'awx_machine_credential="Fleet SSH key"'],
    ids=["json", "inner-quotes"],
)
def test_the_two_documented_forms_reach_ansible_whole(
    argument: str, fake_awx: FakeAwx, ansible_env: dict[str, str], tmp_path: Path
) -> None:
    proc = run_configure(["-e", argument, "--tags", "awx_checks"], fake_awx, ansible_env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert fake_awx.credential_names_asked() == ["Fleet SSH key"]


def test_a_name_split_by_the_shell_stops_the_play_before_any_change(
    fake_awx: FakeAwx, ansible_env: dict[str, str], tmp_path: Path
) -> None:
    """What bash passes for ``-e awx_machine_credential="Fleet SSH key"`` (the old docs): one argument with spaces,
    which Ansible reads as ``awx_machine_credential=Fleet``. The whole play runs (no tags): it must stop at the
    check, naming what it got, before any request that would change AWX."""
    proc = run_configure(["-e", "awx_machine_credential=Fleet SSH key"], fake_awx, ansible_env, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert 'awx_machine_credential is "Fleet", and AWX has 0 Machine credentials of that name' in out, out
    assert fake_awx.credential_names_asked() == ["Fleet"]
    assert fake_awx.writes() == []
