# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""What the Windows branch of the devin.outposts.worker role computes, in Python rather than in Jinja.

* ``worker_windows_instances``: each resolved instance with its Windows service name, directories, files, service
  account, preshutdown timeout, and the problems that make its name unusable on Windows;
* ``worker_windows_image_path``: the service's ImagePath, the quoted base interpreter and service_host.py;
* ``worker_windows_account_problems``: why the service account settings cannot work;
* ``worker_windows_installed``: the instances installed on a host, from their instance.json;
* ``worker_windows_acl_rows``: the access rules on the instances' directories;
* ``worker_windows_abspath``: whether a path is an absolute Windows path (drive letter, nothing to escape);
* ``worker_windows_env_lines``: worker.env's ``KEY=VALUE`` lines.

Jinja string literals in the Windows task files never hold a backslash: with ansible-core 2.19, ``'\\\\'`` in a
task's ``{{ }}`` stays two characters, but one in a conditional or a template file, so paths are joined and
checked here.

The layout is the one devin_outposts.worker.windows.service expects (docs/windows.md, "On the host"):
``<root>\\<instance>\\`` with ``venv\\``, ``state\\``, ``logs\\``, ``worker.env`` and ``service_host.py``.
Unit tests: tests/unit/plugins/filter/test_worker_windows.py.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json
import re

from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.text.converters import to_text

SERVICE_PREFIX = "devin-outposts-worker-"
# Device names that Windows reserves in every directory, with or without an extension (CON, CON.txt, ...).
_RESERVED = frozenset(
    ["CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"]
    + ["COM{0}".format(n) for n in range(1, 10)] + ["LPT{0}".format(n) for n in range(1, 10)]
    + ["COM\u00b9", "COM\u00b2", "COM\u00b3", "LPT\u00b9", "LPT\u00b2", "LPT\u00b3"]
)
# The Linux role's rule for instance names: a name is also a directory, a service name and part of an account name.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_ACCOUNT_TYPES = ("virtual", "gmsa", "user")
_GMSA = re.compile(r"^[^\\/\"\[\]:;|=,+*?<>@ ]+\\[^\\/\"\[\]:;|=,+*?<>@ ]{1,15}\$$")
_DRIVE_PATH = re.compile(r"^[A-Za-z]:\\")


def name_problems(name):
    """Why ``name`` cannot name an instance on Windows; empty when it can."""
    name = to_text(name)
    problems = []
    if not _NAME.match(name):
        problems.append("must match {0} (letters, digits, _ . -, at most 64)".format(_NAME.pattern))
    if name.endswith("."):
        problems.append("must not end with a dot (Windows drops it from directory names)")
    if name.split(".", 1)[0].upper() in _RESERVED:
        problems.append("is a device name Windows reserves ({0})".format(name.split(".", 1)[0].upper()))
    return problems


def is_abspath(path):
    """Whether ``path`` is an absolute Windows path with a drive letter (``C:\\...``) that can be quoted."""
    path = to_text(path)
    return bool(_DRIVE_PATH.match(path)) and not any(c in path for c in '"\r\n\x00')


def _join(*parts):
    return "\\".join(part.rstrip("\\") for part in parts)


def _account(service, account_type, account):
    if account_type == "virtual":
        return "NT SERVICE\\" + service
    return account


def worker_windows_instances(instances, root, account_type="virtual", account="", stop_grace=10):
    """Add the Windows fields to instances resolved by ``worker_instances``.

    ``root`` is the Windows root (``C:\\ProgramData\\devin-outposts``); ``account_type`` is ``virtual`` (each
    instance runs as ``NT SERVICE\\<service name>``), ``gmsa`` or ``user`` (all instances run as ``account``).
    ``preshutdown_ms`` covers the drain, the remotes' stop grace and a margin, like the Linux TimeoutStopSec.
    """
    root = to_text(root)
    if not _DRIVE_PATH.match(root) or '"' in root:
        raise AnsibleFilterError("the Windows root must be an absolute path with a drive letter, got {0}".format(root))
    account_type = to_text(account_type)
    if account_type not in _ACCOUNT_TYPES:
        raise AnsibleFilterError(
            "devin_outposts_worker_windows_account_type must be one of {0}, got {1}".format(", ".join(_ACCOUNT_TYPES), account_type)
        )
    try:
        grace = int(stop_grace)
    except (TypeError, ValueError):
        raise AnsibleFilterError("stop_grace must be an integer, got {0!r}".format(stop_grace))
    rows = []
    for instance in instances or []:
        name = to_text(instance.get("name"))
        service = SERVICE_PREFIX + name
        instance_dir = _join(root, name)
        venv = _join(instance_dir, "venv")
        site_packages = _join(venv, "Lib", "site-packages")
        row = dict(instance)
        row.update({
            "service": service,
            "display_name": "Devin Outposts worker ({0})".format(name),
            "instance_dir": instance_dir,
            "state_dir": _join(instance_dir, "state"),
            "cache_dir": _join(instance_dir, "state", "cache"),
            "logs_dir": _join(instance_dir, "logs"),
            "venv": venv,
            "venv_python": _join(venv, "Scripts", "python.exe"),
            "site_packages": site_packages,
            "pywin32_dlls": _join(site_packages, "pywin32_system32"),
            "env_file": _join(instance_dir, "worker.env"),
            "host_script": _join(instance_dir, "service_host.py"),
            "account": _account(service, account_type, to_text(account)),
            "preshutdown_ms": (int(instance.get("drain_timeout", 30)) + grace + 15) * 1000,
            "problems": name_problems(name) + (
                [] if is_abspath(instance.get("workdir")) else ["workdir must be an absolute path with a drive letter"]
            ),
        })
        rows.append(row)
    return rows


def worker_windows_image_path(python, script):
    """The ImagePath of an instance's service: the base interpreter and service_host.py, each in double quotes.

    Windows paths cannot contain a double quote, so quoting needs no escaping; a path with one is refused.
    No other argument: the instance and its env file are named inside service_host.py, and the token is only in
    worker.env.
    """
    python, script = to_text(python), to_text(script)
    for what, path in (("interpreter", python), ("service host script", script)):
        if not _DRIVE_PATH.match(path) or '"' in path or "\n" in path or "\r" in path:
            raise AnsibleFilterError("the {0} must be an absolute Windows path without quotes, got {1!r}".format(what, path))
    return '"{0}" "{1}"'.format(python, script)


def worker_windows_account_problems(account_type, account):
    """Why the service account settings cannot work; empty when they can (the password is checked elsewhere)."""
    account_type, account = to_text(account_type), to_text(account)
    if account_type not in _ACCOUNT_TYPES:
        return ["devin_outposts_worker_windows_account_type must be one of {0}".format(", ".join(_ACCOUNT_TYPES))]
    if account_type == "virtual":
        return [] if not account else ["devin_outposts_worker_windows_account must be empty for virtual accounts"]
    if account_type == "gmsa":
        if not _GMSA.match(account):
            return ["a gMSA is DOMAIN\\name$ (at most 15 characters before the $), got '{0}'".format(account)]
        return []
    if not account or "\\" not in account and "@" not in account:
        return ["a user account is DOMAIN\\user, .\\user (local) or user@domain, got '{0}'".format(account)]
    if account.endswith("$"):
        return ["'{0}' ends with $: that is a gMSA, set devin_outposts_worker_windows_account_type=gmsa".format(account)]
    return []


def worker_windows_installed(slurped):
    """``{"name", "workdir"}`` per instance found on a host: ``slurped`` is the registered result of a
    ``slurp`` loop over ``<root>\\<name>\\instance.json`` (``item`` is the name); ``workdir`` is empty when the
    file could not be read. Names that no role would have written are left out (they are not ours to delete)."""
    rows = []
    for result in slurped or []:
        name = to_text(result.get("item") or "")
        if name_problems(name):
            continue
        workdir = ""
        if result.get("content"):
            try:
                meta = json.loads(to_text(base64.b64decode(result["content"])))
            except ValueError:
                meta = {}
            if isinstance(meta, dict):
                workdir = to_text(meta.get("workdir") or "")
        rows.append({"name": name, "workdir": workdir})
    return rows


def worker_windows_acl_rows(instances, admins):
    """``{"path", "user", "rights"}``: the rules each instance's directories get (all inherited by their content).

    The instance directory (venv, worker.env, service_host.py) is read-only for the service account; its
    ``state`` and ``logs`` and its working directory are writable. ``admins`` (Administrators, SYSTEM) get full
    control of the working directory, which does not inherit the root's rules.
    """
    rows = []
    for instance in instances or []:
        account = instance["account"]
        rows.append({"path": instance["instance_dir"], "user": account, "rights": "ReadAndExecute"})
        for path in (instance["state_dir"], instance["logs_dir"], instance["workdir"]):
            rows.append({"path": path, "user": account, "rights": "Modify"})
        for admin in admins or []:
            rows.append({"path": instance["workdir"], "user": admin, "rights": "FullControl"})
    return rows


def worker_windows_env_lines(env):
    """``KEY=VALUE`` lines for worker.env: empty values left out, line breaks (and NULs) taken out of values so that
    no value can add a variable, and keys checked (a key is a name: letters, digits, underscores)."""
    if not isinstance(env, dict):
        raise AnsibleFilterError("worker_windows_env_lines needs a dict")
    lines = []
    for key, value in env.items():
        key = to_text(key)
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise AnsibleFilterError("environment variable names are letters, digits and _, got {0!r}".format(key))
        text = "" if value is None else to_text(value)
        text = text.replace("\r", "").replace("\n", "").replace("\x00", "")
        if text:
            lines.append("{0}={1}".format(key, text))
    return lines


class FilterModule(object):
    def filters(self):
        return {
            "worker_windows_instances": worker_windows_instances,
            "worker_windows_image_path": worker_windows_image_path,
            "worker_windows_account_problems": worker_windows_account_problems,
            "worker_windows_installed": worker_windows_installed,
            "worker_windows_acl_rows": worker_windows_acl_rows,
            "worker_windows_abspath": is_abspath,
            "worker_windows_env_lines": worker_windows_env_lines,
        }
