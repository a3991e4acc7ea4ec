# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.devin.outposts.plugins.filter.worker import worker_instances, worker_outposts_to_create
from ansible_collections.devin.outposts.plugins.filter.worker_windows import (
    FilterModule,
    is_abspath,
    name_problems,
    worker_windows_account_problems,
    worker_windows_acl_rows,
    worker_windows_env_lines,
    worker_windows_image_path,
    worker_windows_installed,
    worker_windows_instances,
)

ROOT = "C:\\ProgramData\\devin-outposts"
DEFAULTS = {"workdir_root": "C:\\devin-outposts", "data_dir": ROOT, "sep": "\\", "drain_timeout": "30",
            "has_token": True}


def resolve(items, **kwargs):
    return worker_windows_instances(worker_instances(items, DEFAULTS), ROOT, **kwargs)


def test_the_layout_of_an_instance():
    row = resolve([{"name": "main", "outpost": "o", "drain_timeout": 40}], stop_grace=10)[0]
    assert row["service"] == "devin-outposts-worker-main"
    assert row["display_name"] == "Devin Outposts worker (main)"
    assert row["instance_dir"] == ROOT + "\\main"
    assert row["venv_python"] == ROOT + "\\main\\venv\\Scripts\\python.exe"
    assert row["site_packages"] == ROOT + "\\main\\venv\\Lib\\site-packages"
    assert row["pywin32_dlls"] == ROOT + "\\main\\venv\\Lib\\site-packages\\pywin32_system32"
    assert row["env_file"] == ROOT + "\\main\\worker.env"
    assert row["host_script"] == ROOT + "\\main\\service_host.py"
    assert row["cache_dir"] == ROOT + "\\main\\state\\cache"
    assert row["workdir"] == "C:\\devin-outposts\\main"
    assert row["account"] == "NT SERVICE\\devin-outposts-worker-main"
    assert row["preshutdown_ms"] == (40 + 10 + 15) * 1000
    assert row["problems"] == []


def test_the_linux_join_is_unchanged_without_sep():
    row = worker_instances([{"name": "main", "outpost": "o"}], {"workdir_root": "/srv/x", "data_dir": "/var/lib/x"})[0]
    assert row["workdir"] == "/srv/x/main"
    assert row["data_dir"] == "/var/lib/x/main"


def test_a_gmsa_or_user_account_is_shared():
    rows = resolve([{"name": "a", "outpost": "o"}, {"name": "b", "outpost": "o"}], account_type="gmsa", account="CORP\\gm$")
    assert [row["account"] for row in rows] == ["CORP\\gm$", "CORP\\gm$"]


@pytest.mark.parametrize(
    ("name", "problem"),
    [("con", "reserves (CON)"), ("Nul.txt", "reserves (NUL)"), ("com1", "reserves (COM1)"), ("a.", "end with a dot"),
     ("a b", "must match"), ("a\\b", "must match"), ("", "must match"), ("x" * 65, "must match")],
)
def test_names_windows_cannot_use(name, problem):
    assert any(problem in text for text in name_problems(name))


@pytest.mark.parametrize("name", ["main", "gpu.2", "console", "com10", "a-b_c"])
def test_names_windows_can_use(name):
    assert name_problems(name) == []


def test_a_relative_or_posix_workdir_is_a_problem():
    rows = resolve([{"name": "a", "outpost": "o", "workdir": "/srv/a"}, {"name": "b", "outpost": "o", "workdir": "D:\\w"}])
    assert rows[0]["problems"] == ["workdir must be an absolute path with a drive letter"]
    assert rows[1]["problems"] == []


def test_the_root_and_account_type_are_checked():
    with pytest.raises(AnsibleFilterError, match="drive letter"):
        worker_windows_instances([], "/opt/x")
    with pytest.raises(AnsibleFilterError, match="account_type"):
        worker_windows_instances([], ROOT, account_type="local")


def test_the_image_path_quotes_both_paths_and_refuses_a_quote():
    assert worker_windows_image_path("C:\\Program Files\\Python312\\python.exe", ROOT + "\\a b\\service_host.py") == (
        '"C:\\Program Files\\Python312\\python.exe" "C:\\ProgramData\\devin-outposts\\a b\\service_host.py"'
    )
    for bad in ('C:\\a"b\\python.exe', "python.exe", "C:\\a\nb\\python.exe"):
        with pytest.raises(AnsibleFilterError, match="absolute Windows path without quotes"):
            worker_windows_image_path(bad, ROOT + "\\a\\service_host.py")


@pytest.mark.parametrize(
    ("account_type", "account", "problem"),
    [("virtual", "", None), ("virtual", "x", "must be empty"), ("gmsa", "CORP\\gm$", None), ("gmsa", "CORP\\gm", "gMSA"),
     ("gmsa", "CORP\\this-is-too-long-a$", "gMSA"), ("user", ".\\worker", None), ("user", "worker@corp.example", None),
     ("user", "worker", "DOMAIN\\user"), ("user", "CORP\\gm$", "that is a gMSA"), ("local", "", "must be one of")],
)
def test_account_problems(account_type, account, problem):
    problems = worker_windows_account_problems(account_type, account)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in text for text in problems), problems


def test_acl_rows_give_the_account_read_here_and_modify_there():
    row = resolve([{"name": "main", "outpost": "o"}])[0]
    rows = worker_windows_acl_rows([row], ["BUILTIN\\Administrators"])
    assert {"path": row["instance_dir"], "user": row["account"], "rights": "ReadAndExecute"} in rows
    for path in (row["state_dir"], row["logs_dir"], row["workdir"]):
        assert {"path": path, "user": row["account"], "rights": "Modify"} in rows
    assert {"path": row["workdir"], "user": "BUILTIN\\Administrators", "rights": "FullControl"} in rows
    assert not [r for r in rows if r["path"] == row["instance_dir"] and r["rights"] != "ReadAndExecute"]


def test_env_lines_drop_empty_values_and_line_breaks():
    lines = worker_windows_env_lines({"A": "C:\\x y", "B": "", "C": "1\r\nD=2", "E": 5, "F": None})
    assert lines == ["A=C:\\x y", "C=1D=2", "E=5"]
    with pytest.raises(AnsibleFilterError, match="letters, digits"):
        worker_windows_env_lines({"A=B": "x"})


def test_installed_instances_from_instance_json():
    def slurp(name, meta):
        content = base64.b64encode(json.dumps(meta).encode()).decode() if meta is not None else None
        return {"item": name, **({"content": content} if content else {"failed": True})}

    rows = worker_windows_installed([slurp("main", {"workdir": "D:\\w"}), slurp("old", None), slurp("con", {})])
    assert rows == [{"name": "main", "workdir": "D:\\w"}, {"name": "old", "workdir": ""}]


def test_is_abspath():
    assert is_abspath("C:\\x") and is_abspath("d:\\")
    assert not is_abspath("C:x") and not is_abspath("\\\\server\\share") and not is_abspath('C:\\a"b')


def test_outposts_to_create_carry_their_hosts_platform():
    hosts = [
        {"ansible_facts": {"os_family": "Debian"}, "_devin_outposts_worker_present": [{"outpost": "lin"}]},
        {"ansible_facts": {"os_family": "Windows"}, "_devin_outposts_worker_present": [{"outpost": "win"},
                                                                                       {"outpost": "outpost_env-1"}]},
        {"ansible_facts": {}},
    ]
    assert worker_outposts_to_create(hosts) == [{"name": "lin", "platform": "linux"}, {"name": "win", "platform": "windows"}]
    hosts[1]["_devin_outposts_worker_present"].append({"outpost": "lin"})
    with pytest.raises(AnsibleFilterError, match="one platform"):
        worker_outposts_to_create(hosts)


def test_filter_module_lists_every_filter():
    assert set(FilterModule().filters()) == {
        "worker_windows_instances", "worker_windows_image_path", "worker_windows_account_problems",
        "worker_windows_installed", "worker_windows_acl_rows", "worker_windows_abspath", "worker_windows_env_lines",
    }
