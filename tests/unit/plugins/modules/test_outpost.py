# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

import pytest

from ansible_collections.devin.outposts.plugins.modules import outpost as module
from ansible_collections.devin.outposts.tests.unit.plugins.fleet_fakes import (
    API,
    TOKEN,
    outpost,
    outpost_page,
    run_module,
)

LIST = "/opbeta/outposts/outposts?first=100"
OUTPOSTS = "/opbeta/outposts/outposts"


def run(monkeypatch, check_mode=False, **args):
    args.setdefault("api_url", API)
    args.setdefault("token", TOKEN)
    if check_mode:
        args["_ansible_check_mode"] = True
    result, failed = run_module(module.main, args, monkeypatch)
    assert TOKEN not in json.dumps(result)
    return result, failed


@pytest.mark.parametrize("args, body", [
    (dict(platform="linux", description="H200s"), {"name": "gpu-h200", "platform": "linux", "description": "H200s"}),
    (dict(platform="windows"), {"name": "gpu-h200", "platform": "windows"}),
    (dict(), {"name": "gpu-h200", "platform": None}),
])
def test_creates_when_absent(api, monkeypatch, args, body):
    created = outpost("gpu-h200", "outpost_env-new", platform=body["platform"], description=body.get("description"))
    api.expect("GET", LIST, json=outpost_page([outpost("other")]))
    api.expect("POST", OUTPOSTS, json=created)
    result, failed = run(monkeypatch, name="gpu-h200", **args)
    assert not failed
    assert result["changed"] is True
    assert result["outpost"] == created
    assert result["outpost_id"] == "outpost_env-new"
    assert api.calls[1].body == body
    assert api.calls[1].headers["Authorization"] == "Bearer " + TOKEN
    assert result["diff"] == dict(before={}, after=dict(name="gpu-h200", platform=body["platform"],
                                                        description=body.get("description")))


@pytest.mark.parametrize("args", [
    dict(platform="linux", description="H200s"),
    dict(platform="linux"),
    dict(description="H200s"),
    dict(),
])
def test_ok_when_present_and_matching(api, monkeypatch, args):
    current = outpost("gpu-h200", "outpost_env-1", platform="linux", description="H200s")
    api.expect("GET", LIST, json=outpost_page([current]))
    result, failed = run(monkeypatch, name="gpu-h200", **args)
    assert (failed, result["changed"], result["outpost_id"], result["outpost"]) == (False, False, "outpost_env-1", current)


def test_check_mode_creates_nothing(api, monkeypatch):
    api.expect("GET", LIST, json=outpost_page([]))
    result, failed = run(monkeypatch, check_mode=True, name="gpu-h200", platform="linux")
    assert not failed
    assert result["changed"] is True
    assert (result["outpost"], result["outpost_id"]) == (None, None)
    assert result["diff"]["after"] == dict(name="gpu-h200", platform="linux", description=None)
    assert [c.method for c in api.calls] == ["GET"]


def test_absent_deletes(api, monkeypatch):
    current = outpost("gpu-h200", "outpost_env-1")
    api.expect("GET", LIST, json=outpost_page([current]))
    api.expect("DELETE", OUTPOSTS + "/outpost_env-1", status=204)
    result, failed = run(monkeypatch, name="gpu-h200", state="absent")
    assert (failed, result["changed"], result["outpost"], result["outpost_id"]) == (False, True, None, "outpost_env-1")
    assert result["diff"] == dict(before=dict(name="gpu-h200", platform="linux", description=None), after={})


def test_absent_when_already_gone_is_ok(api, monkeypatch):
    api.expect("GET", LIST, json=outpost_page([outpost("other")]))
    result, failed = run(monkeypatch, name="gpu-h200", state="absent")
    assert (failed, result["changed"], result["outpost_id"]) == (False, False, None)


def test_absent_tolerates_a_delete_race(api, monkeypatch):
    api.expect("GET", LIST, json=outpost_page([outpost("gpu-h200", "outpost_env-1")]))
    api.expect("DELETE", OUTPOSTS + "/outpost_env-1", status=404, json={"detail": "Outpost not found"})
    result, failed = run(monkeypatch, name="gpu-h200", state="absent")
    assert not failed
    assert result["changed"] is True


def test_absent_in_check_mode_deletes_nothing(api, monkeypatch):
    api.expect("GET", LIST, json=outpost_page([outpost("gpu-h200", "outpost_env-1")]))
    result, failed = run(monkeypatch, check_mode=True, name="gpu-h200", state="absent")
    assert (failed, result["changed"]) == (False, True)


@pytest.mark.parametrize("args, message", [
    (dict(platform="macos"),
     "Outpost gpu-h200 exists with different settings: platform is 'linux' (wanted 'macos'). The fleet API "
     "cannot update an outpost; set recreate: true to delete it and create it again (sessions queued on it are "
     "lost and it gets a new id)."),
    (dict(platform="windows", description="new"),
     "Outpost gpu-h200 exists with different settings: description is 'old' (wanted 'new'); platform is 'linux' "
     "(wanted 'windows'). The fleet API cannot update an outpost; set recreate: true to delete it and create it "
     "again (sessions queued on it are lost and it gets a new id)."),
])
def test_drift_fails_without_recreate(api, monkeypatch, args, message):
    api.expect("GET", LIST, json=outpost_page([outpost("gpu-h200", "outpost_env-1", description="old")]))
    result, failed = run(monkeypatch, name="gpu-h200", **args)
    assert failed
    assert result["msg"] == message
    assert result["outpost_id"] == "outpost_env-1"
    assert [c.method for c in api.calls] == ["GET"]


def test_drift_with_recreate_deletes_and_creates(api, monkeypatch):
    api.expect("GET", LIST, json=outpost_page([outpost("gpu-h200", "outpost_env-1", description="keep me")]))
    api.expect("DELETE", OUTPOSTS + "/outpost_env-1", status=204)
    api.expect("POST", OUTPOSTS, json=outpost("gpu-h200", "outpost_env-2", platform="macos", description="keep me"))
    result, failed = run(monkeypatch, name="gpu-h200", platform="macos", recreate=True)
    assert not failed
    assert (result["changed"], result["outpost_id"]) == (True, "outpost_env-2")
    assert api.calls[2].body == {"name": "gpu-h200", "platform": "macos", "description": "keep me"}
    assert len(result["warnings"]) == 1
    assert "sessions queued on it are lost" in result["warnings"][0]
    assert result["diff"]["before"]["platform"] == "linux"
    assert result["diff"]["after"]["platform"] == "macos"


def test_recreate_in_check_mode_changes_nothing(api, monkeypatch):
    api.expect("GET", LIST, json=outpost_page([outpost("gpu-h200", "outpost_env-1")]))
    result, failed = run(monkeypatch, check_mode=True, name="gpu-h200", platform="windows", recreate=True)
    assert (failed, result["changed"]) == (False, True)
    assert [c.method for c in api.calls] == ["GET"]


def test_recreate_without_drift_is_a_no_op(api, monkeypatch):
    api.expect("GET", LIST, json=outpost_page([outpost("gpu-h200", "outpost_env-1")]))
    result, failed = run(monkeypatch, name="gpu-h200", platform="linux", recreate=True)
    assert (failed, result["changed"]) == (False, False)


def test_machine_token_gets_a_clear_403(api, monkeypatch):
    api.expect("GET", LIST, json=outpost_page([]))
    api.expect("POST", OUTPOSTS, status=403, json={"detail": "token lacks scope account.outposts.orchestrator"})
    result, failed = run(monkeypatch, name="gpu-h200", platform="linux")
    assert failed
    assert result["msg"] == "Could not create outpost gpu-h200: 403 token lacks scope account.outposts.orchestrator"
    assert result["http_status"] == 403


def test_bad_token(api, monkeypatch):
    api.expect("GET", LIST, status=401, json={"detail": "Invalid token"})
    result, failed = run(monkeypatch, name="gpu-h200")
    assert failed
    assert result["msg"] == "Could not list outposts: 401 Invalid token"


def test_token_from_the_environment(api, monkeypatch):
    monkeypatch.setenv("DEVIN_OUTPOSTS_TOKEN", "cog_from_env")
    monkeypatch.setenv("DEVIN_API_URL", "https://env.example/")
    api.expect("GET", "https://env.example" + LIST, json=outpost_page([outpost("gpu-h200")]))
    result, failed = run_module(module.main, dict(name="gpu-h200"), monkeypatch)
    assert not failed
    assert api.calls[0].headers["Authorization"] == "Bearer cog_from_env"


def test_no_token_at_all(api, monkeypatch):
    result, failed = run_module(module.main, dict(name="gpu-h200"), monkeypatch)
    assert failed
    assert "no API token: set the token option or the DEVIN_OUTPOSTS_TOKEN environment variable" in result["msg"]
    assert api.calls == []


# --- outpost names: checked before any request, one line naming the option ----------------------------

NAME_RULE = "an outpost name is 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit"


@pytest.mark.parametrize("name, shown", [
    ([1, 2], "'[1, 2]' (a list? give one name)"),  # Ansible turns a list given to a str option into text
    (["gpu-h200"], "\"['gpu-h200']\" (a list? give one name)"),
    ({"name": "gpu"}, "\"{'name': 'gpu'}\" (a dict? give one name)"),
    ("", "''"),
    ("gpu h200", "'gpu h200'"),
    ("-gpu", "'-gpu'"),
    ("gpu/h200", "'gpu/h200'"),
    ("gpu-h200\n", "'gpu-h200\\n'"),
    ("g" * 64, "'{0}...'".format("g" * 60)),  # a long value is shortened in the message
], ids=["list", "list-of-one", "dict", "empty", "space", "leading-dash", "slash", "trailing-newline", "64-chars"])
def test_invalid_names_fail_before_any_request(api, monkeypatch, name, shown):
    result, failed = run(monkeypatch, name=name, platform="linux")
    assert failed
    assert result["msg"] == "name: {0} is not a valid outpost name: {1}".format(shown, NAME_RULE)
    assert "\n" not in result["msg"]
    assert api.calls == []


@pytest.mark.parametrize("name", ["g" * 63, "7", "a.b_c-D9", 123], ids=["63-chars", "one-digit", "punctuation", "int"])
def test_valid_names_at_the_limits_are_used(api, monkeypatch, name):
    api.expect("GET", LIST, json=outpost_page([outpost(str(name))]))
    result, failed = run(monkeypatch, name=name)
    assert (failed, result["changed"], result["outpost_id"]) == (False, False, "outpost_env-" + str(name))
