# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""The shipped AWX credential type (credential_types/devin_outposts/) against AWX's rules, offline.

The rules are in awx_credential_rules.py. The broken variants below show that each rule catches what it
should, so a passing check of the shipped type means something. The type must also inject exactly what the
modules and the roles read, with the modules' default API URL.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from awx_credential_rules import check_credential_type

ROOT = Path(__file__).resolve().parents[2]
TYPE_DIR = ROOT / "credential_types" / "devin_outposts"


def load(name: str) -> Any:
    return yaml.safe_load((TYPE_DIR / name).read_text())


@pytest.fixture
def shipped() -> tuple[dict[str, Any], dict[str, Any]]:
    return load("input.yml"), load("injectors.yml")


def test_the_shipped_type_passes(shipped: tuple[dict[str, Any], dict[str, Any]]) -> None:
    inputs, injectors = shipped
    assert check_credential_type(inputs, injectors) == []


def test_it_injects_what_the_modules_and_roles_read(shipped: tuple[dict[str, Any], dict[str, Any]]) -> None:
    inputs, injectors = shipped
    client = (ROOT / "plugins" / "module_utils" / "_fleet_api.py").read_text()
    fallbacks = set(re.findall(r'env_fallback, \["([A-Z_]+)"\]', client))
    assert set(injectors["env"]) == fallbacks == {"DEVIN_API_URL", "DEVIN_OUTPOSTS_TOKEN"}
    for role in ("worker", "orchestrator"):
        # The API URL falls back in the role's defaults; the token in a no_log task (never in a default or
        # an argument spec, whose failure messages would print it).
        role_dir = ROOT / "roles" / role
        read = "\n".join(p.read_text() for p in [role_dir / "defaults" / "main.yml", *role_dir.glob("tasks/*.yml")])
        for name in fallbacks:
            assert f"lookup('ansible.builtin.env', '{name}')" in read, (role, name)
    fields = {field["id"]: field for field in inputs["fields"]}
    default_url = re.search(r'^DEFAULT_API_URL = "([^"]+)"', client, re.MULTILINE)
    assert default_url is not None
    assert fields["api_url"]["default"] == default_url.group(1)
    assert fields["token"]["secret"] is True
    assert "secret" not in fields["api_url"]
    # Nothing as extra vars: they would land in the job's env/extravars file and outrank the inventory.
    assert set(injectors) == {"env"}


Breakage = Callable[[dict[str, Any], dict[str, Any]], None]


def set_in(section: str, key: str, value: Any) -> Breakage:
    def apply(inputs: dict[str, Any], injectors: dict[str, Any]) -> None:
        {"inputs": inputs, "injectors": injectors}[section][key] = value

    return apply


def set_field(index: int, key: str, value: Any) -> Breakage:
    def apply(inputs: dict[str, Any], injectors: dict[str, Any]) -> None:
        inputs["fields"][index][key] = value

    return apply


def drop_field_key(index: int, key: str) -> Breakage:
    def apply(inputs: dict[str, Any], injectors: dict[str, Any]) -> None:
        del inputs["fields"][index][key]

    return apply


def set_env(name: str, value: str) -> Breakage:
    def apply(inputs: dict[str, Any], injectors: dict[str, Any]) -> None:
        injectors["env"][name] = value

    return apply


BROKEN: dict[str, tuple[Breakage, str]] = {
    "inputs with an unknown key": (set_in("inputs", "metadata", []), "inputs: unknown key 'metadata'"),
    "a field without an id": (drop_field_key(0, "id"), "inputs.fields[0]: needs 'id'"),
    "a field without a label": (drop_field_key(1, "label"), "inputs.fields[1]: needs 'label'"),
    "a field with an unknown key": (set_field(0, "placeholder", "x"), "unknown key 'placeholder'"),
    "an id that is no variable name": (set_field(0, "id", "api-url"), "is an invalid variable name"),
    "the reserved id tower": (set_field(0, "id", "tower"), "'tower' is a reserved field name"),
    "two fields with one id": (set_field(1, "id", "api_url"), "field ids must be unique"),
    "two fields with one label": (set_field(1, "label", "Devin API URL"), "labels must be unique"),
    "an unknown field type": (set_field(0, "type", "integer"), "is not string or boolean"),
    "a default of the wrong type": (set_field(0, "default", 443), "is not a string"),
    "secret on a boolean": (set_field(1, "type", "boolean"), "secret not allowed for boolean type"),
    "an unknown format": (set_field(0, "format", "email"), "inputs.fields[0].format"),
    "repeated choices": (set_field(0, "choices", ["a", "a"]), "must be a non-empty list of distinct strings"),
    "required names an undefined field": (
        set_in("inputs", "required", ["api_url", "tok"]),
        "'tok' is not a defined",
    ),
    "injectors with an unknown key": (set_in("injectors", "args", {}), "injectors: unknown key 'args'"),
    "an env name under ANSIBLE_": (
        set_env("ANSIBLE_CALLBACKS_ENABLED", "{{ api_url }}"),
        "ANSIBLE_ is reserved",
    ),
    "an env name that is no variable name": (
        set_env("DEVIN-TOKEN", "{{ token }}"),
        "is an invalid variable name",
    ),
    "a template naming an undefined field": (
        set_env("DEVIN_OUTPOSTS_TOKEN", "{{ api_token }}"),
        "undefined field",
    ),
    "a broken template": (set_env("DEVIN_API_URL", "{{ api_url "), "template syntax error"),
    "tower.filename without a file": (set_env("DEVIN_CA", "{{ tower.filename }}"), "undefined field"),
    "an unnamed file beside a named one": (
        set_in("injectors", "file", {"template": "{{ token }}", "template.ca": "{{ api_url }}"}),
        "use either template or template.<name>",
    ),
    "a bad file key": (
        set_in("injectors", "file", {"tmpl.ca": "{{ api_url }}"}),
        "is not template or template.<name>",
    ),
    "extra_vars naming an undefined field": (
        set_in("injectors", "extra_vars", {"devin_outposts_worker_token": "{{ secret }}"}),
        "undefined field",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_type_fails(case: str, shipped: tuple[dict[str, Any], dict[str, Any]]) -> None:
    inputs, injectors = copy.deepcopy(shipped[0]), copy.deepcopy(shipped[1])
    breakage, expected = BROKEN[case]
    breakage(inputs, injectors)
    errors = check_credential_type(inputs, injectors)
    assert any(expected in error for error in errors), errors


def test_files_and_their_names_are_accepted(shipped: tuple[dict[str, Any], dict[str, Any]]) -> None:
    # The rules must not be stricter than AWX: a named file, its tower.filename.<name>, and extra vars that
    # name defined fields are all allowed.
    inputs, injectors = copy.deepcopy(shipped[0]), copy.deepcopy(shipped[1])
    injectors["file"] = {"template.ca": "{{ api_url }}"}
    injectors["env"]["DEVIN_CA_BUNDLE"] = "{{ tower.filename.ca }}"
    injectors["extra_vars"] = {"devin_api_url": "{{ api_url }}"}
    inputs["fields"].append({"id": "verify", "label": "Verify TLS", "type": "boolean", "default": True})
    assert check_credential_type(inputs, injectors) == []
    single = {"file": {"template": "{{ token }}"}, "env": {"DEVIN_TOKEN_FILE": "{{ tower.filename }}"}}
    assert check_credential_type(inputs, single) == []
