# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""AWX's rules for a custom credential type, checked offline (AWX publishes no schema file for them).

The rules, as AWX documents them (docs/credentials/custom_credential_types.md in ansible/awx) and as its
API enforces them when a credential type is saved:

* ``inputs`` holds only ``fields`` and ``required``. Each field is a mapping with an ``id`` (a variable
  name, not ``tower``, unique) and a ``label`` (unique), and may hold only ``type`` (``string`` or
  ``boolean``, default ``string``), ``format`` (``ssh_private_key`` or ``url``), ``choices`` (distinct
  strings), ``help_text``, ``multiline``, ``secret``, ``ask_at_runtime`` and ``default`` (of the field's
  type). ``choices``, ``multiline``, ``format`` and ``secret`` apply to strings only. ``required`` names
  defined fields.
* ``injectors`` holds only ``file``, ``env`` and ``extra_vars``. File keys are ``template`` or
  ``template.<name>`` (not both forms); env and extra-var names are variable names, and no env name starts
  with ``ANSIBLE_`` (reserved: they would reconfigure Ansible). Env values are ASCII.
* Every injector value is a Jinja template that may name only the defined fields, and ``tower.filename``
  (or ``tower.filename.<name>``) only for a file the type injects.
"""

from __future__ import annotations

import re
from typing import Any

from jinja2 import StrictUndefined, TemplateSyntaxError, UndefinedError
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FILE_KEY = re.compile(r"^template(\.[A-Za-z_][A-Za-z0-9_]*)?$")
INPUT_KEYS = frozenset({"fields", "required"})
INJECTOR_KEYS = frozenset({"file", "env", "extra_vars"})
FIELD_KEYS = frozenset(
    {
        "id",
        "label",
        "type",
        "format",
        "choices",
        "help_text",
        "multiline",
        "secret",
        "ask_at_runtime",
        "default",
    }
)
FIELD_TYPES = {"string": str, "boolean": bool}
STRING_ONLY_KEYS = ("choices", "multiline", "format", "secret")
FORMATS = frozenset({"ssh_private_key", "url"})
BOOLEAN_KEYS = ("multiline", "secret", "ask_at_runtime")


def check_credential_type(inputs: Any, injectors: Any) -> list[str]:
    """Every way ``inputs`` and ``injectors`` break AWX's rules; empty when AWX would accept them."""
    errors = check_inputs(inputs)
    field_ids = [field["id"] for field in _fields(inputs) if isinstance(field.get("id"), str)]
    return errors + check_injectors(injectors, field_ids)


def _fields(inputs: Any) -> list[dict[str, Any]]:
    fields = inputs.get("fields", []) if isinstance(inputs, dict) else []
    return [field for field in fields if isinstance(field, dict)] if isinstance(fields, list) else []


def check_inputs(inputs: Any) -> list[str]:
    if not isinstance(inputs, dict):
        return ["inputs: must be a mapping"]
    errors = [
        f"inputs: unknown key {key!r} (only fields and required)" for key in sorted(set(inputs) - INPUT_KEYS)
    ]
    fields = inputs.get("fields", [])
    if not isinstance(fields, list):
        return [*errors, "inputs.fields: must be a list"]
    seen_ids: set[str] = set()
    seen_labels: set[str] = set()
    for index, field in enumerate(fields):
        where = f"inputs.fields[{index}]"
        if not isinstance(field, dict):
            errors.append(f"{where}: must be a mapping")
            continue
        errors.extend(_check_field(where, field))
        field_id, label = field.get("id"), field.get("label")
        if isinstance(field_id, str):
            if field_id in seen_ids:
                errors.append(f"{where}: field ids must be unique ({field_id})")
            seen_ids.add(field_id)
        if isinstance(label, str):
            if label in seen_labels:
                errors.append(f"{where}: labels must be unique ({label})")
            seen_labels.add(label)
    required = inputs.get("required", [])
    if not isinstance(required, list) or not all(isinstance(item, str) for item in required):
        errors.append("inputs.required: must be a list of field ids")
    else:
        errors.extend(
            f"inputs.required: {item!r} is not a defined field" for item in required if item not in seen_ids
        )
    return errors


def _check_field(where: str, field: dict[str, Any]) -> list[str]:
    errors = [f"{where}: unknown key {key!r}" for key in sorted(set(field) - FIELD_KEYS)]
    for key in ("id", "label"):
        if key not in field:
            errors.append(f"{where}: needs {key!r}")
        elif not isinstance(field[key], str):
            errors.append(f"{where}.{key}: must be a string")
    field_id = field.get("id")
    if isinstance(field_id, str):
        if not VARIABLE_NAME.match(field_id):
            errors.append(f"{where}.id: {field_id!r} is an invalid variable name")
        if field_id == "tower":
            errors.append(f"{where}.id: 'tower' is a reserved field name")
    field_type = field.get("type", "string")
    if field_type not in FIELD_TYPES:
        return [*errors, f"{where}.type: {field_type!r} is not string or boolean"]
    if "default" in field and not isinstance(field["default"], FIELD_TYPES[field_type]):
        errors.append(f"{where}.default: {field['default']!r} is not a {field_type}")
    if field_type != "string":
        errors.extend(
            f"{where}: {key} not allowed for {field_type} type" for key in STRING_ONLY_KEYS if key in field
        )
    if "format" in field and field["format"] not in FORMATS:
        errors.append(f"{where}.format: {field['format']!r} is not one of {sorted(FORMATS)}")
    choices = field.get("choices")
    if choices is not None and (
        not isinstance(choices, list)
        or not choices
        or not all(isinstance(choice, str) for choice in choices)
        or len(set(choices)) != len(choices)
    ):
        errors.append(f"{where}.choices: must be a non-empty list of distinct strings")
    errors.extend(
        f"{where}.{key}: must be true or false"
        for key in BOOLEAN_KEYS
        if not isinstance(field.get(key, False), bool)
    )
    if not isinstance(field.get("help_text", ""), str):
        errors.append(f"{where}.help_text: must be a string")
    return errors


class _FileNames:
    """What `tower.filename` offers: one attribute per `template.<name>`; str() for a lone `template`."""

    def __init__(self, names: list[str], single: bool) -> None:
        for name in names:
            setattr(self, name, f"/runner/env/{name}")
        self.single = single

    def __str__(self) -> str:
        if not self.single:
            raise UndefinedError(
                "tower.filename is defined only with an unnamed file injector (file.template)"
            )
        return "/runner/env/tmpfile"


class _Tower:
    def __init__(self, filename: _FileNames) -> None:
        self.filename = filename

    def __str__(self) -> str:
        raise UndefinedError("the reserved tower namespace cannot be used on its own")


def check_injectors(injectors: Any, field_ids: list[str]) -> list[str]:
    if not isinstance(injectors, dict):
        return ["injectors: must be a mapping"]
    errors = [
        f"injectors: unknown key {key!r} (only file, env and extra_vars)"
        for key in sorted(set(injectors) - INJECTOR_KEYS)
    ]
    sections = {key: value for key, value in injectors.items() if key in INJECTOR_KEYS}
    for key, section in sections.items():
        if not isinstance(section, dict):
            errors.append(f"injectors.{key}: must be a mapping")
    sections = {key: value for key, value in sections.items() if isinstance(value, dict)}
    files = list(sections.get("file", {}))
    errors.extend(
        f"injectors.file: {name!r} is not template or template.<name>"
        for name in files
        if not FILE_KEY.match(name)
    )
    if "template" in files and len(files) > 1:
        errors.append("injectors.file: use either template or template.<name>, not both")
    for key in ("env", "extra_vars"):
        for name in sections.get(key, {}):
            if not VARIABLE_NAME.match(str(name)):
                errors.append(f"injectors.{key}: {name!r} is an invalid variable name")
    for name, value in sections.get("env", {}).items():
        if str(name).startswith("ANSIBLE_"):
            errors.append(f"injectors.env: {name} may affect Ansible's configuration (ANSIBLE_ is reserved)")
        if isinstance(value, str) and not value.isascii():
            errors.append(f"injectors.env.{name}: the value must be ASCII")
    namespace: dict[str, Any] = {field_id: "EXAMPLE" for field_id in field_ids}
    named = [name.split(".", 1)[1] for name in files if name.startswith("template.")]
    namespace["tower"] = _Tower(_FileNames(named, single="template" in files))
    environment = ImmutableSandboxedEnvironment(undefined=StrictUndefined)
    for key, section in sections.items():
        for name, template in section.items():
            where = f"injectors.{key}.{name}"
            if not isinstance(template, str):
                errors.append(f"{where}: must be a string")
                continue
            try:
                environment.from_string(template).render(namespace)
            except UndefinedError as exc:
                errors.append(f"{where}: uses an undefined field ({exc})")
            except TemplateSyntaxError as exc:
                errors.append(f"{where}: template syntax error ({exc})")
            except SecurityError as exc:
                errors.append(f"{where}: unsafe template ({exc})")
    return errors
