# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

import pytest

from ansible_collections.devin.outposts.plugins.modules import default_platform, default_platform_info
from ansible_collections.devin.outposts.tests.unit.plugins.fleet_fakes import (
    API,
    TOKEN,
    outpost,
    outpost_page,
    run_module,
)

PATH = "/v3beta1/organizations/org-abc/default-platform"
LIST = "/opbeta/outposts/outposts?first=100"
UNSET = {"platform": None, "outpost_pool_id": None, "outpost_pool_name": None}
LINUX = {"platform": "linux", "outpost_pool_id": None, "outpost_pool_name": None}
GPU = {"platform": None, "outpost_pool_id": "outpost_env-1", "outpost_pool_name": "gpu-h200"}


def run(main, monkeypatch, check_mode=False, **args):
    args.setdefault("api_url", API)
    args.setdefault("token", TOKEN)
    args.setdefault("org_id", "org-abc")
    if check_mode:
        args["_ansible_check_mode"] = True
    result, failed = run_module(main, args, monkeypatch)
    assert TOKEN not in json.dumps(result)
    return result, failed


@pytest.mark.parametrize("answer", [UNSET, LINUX, GPU])
def test_info(api, monkeypatch, answer):
    api.expect("GET", PATH, json=answer)
    result, failed = run(default_platform_info.main, monkeypatch)
    assert (failed, result["changed"], result["default_platform"]) == (False, False, answer)


def test_info_requires_org_id(api, monkeypatch):
    result, failed = run_module(default_platform_info.main, dict(token=TOKEN), monkeypatch)
    assert failed
    assert "org_id" in result["msg"]


@pytest.mark.parametrize("current", [UNSET, GPU])
def test_sets_a_platform(api, monkeypatch, current):
    api.expect("GET", PATH, json=current)
    api.expect("PUT", PATH, json=LINUX)
    result, failed = run(default_platform.main, monkeypatch, platform="linux")
    assert (failed, result["changed"], result["default_platform"]) == (False, True, LINUX)
    assert api.calls[-1].body == {"platform": "linux", "outpost_pool_id": None}
    assert result["diff"] == dict(before=current, after=LINUX)


def test_platform_is_idempotent(api, monkeypatch):
    api.expect("GET", PATH, json=LINUX)
    result, failed = run(default_platform.main, monkeypatch, platform="linux")
    assert (failed, result["changed"]) == (False, False)


@pytest.mark.parametrize("outpost_arg", ["gpu-h200", "outpost_env-1"])
def test_sets_an_outpost_by_name_or_id(api, monkeypatch, outpost_arg):
    api.expect("GET", LIST, json=outpost_page([outpost("gpu-h200", "outpost_env-1")]))
    api.expect("GET", PATH, json=UNSET)
    api.expect("PUT", PATH, json=GPU)
    result, failed = run(default_platform.main, monkeypatch, outpost=outpost_arg)
    assert (failed, result["changed"], result["default_platform"]) == (False, True, GPU)
    assert api.calls[-1].body == {"platform": None, "outpost_pool_id": "outpost_env-1"}


def test_outpost_is_idempotent(api, monkeypatch):
    api.expect("GET", LIST, json=outpost_page([outpost("gpu-h200", "outpost_env-1")]))
    api.expect("GET", PATH, json=GPU)
    result, failed = run(default_platform.main, monkeypatch, outpost="gpu-h200")
    assert (failed, result["changed"]) == (False, False)


def test_unknown_outpost_fails_before_any_change(api, monkeypatch):
    api.expect("GET", LIST, json=outpost_page([]))
    result, failed = run(default_platform.main, monkeypatch, outpost="nope")
    assert failed
    assert result["msg"] == "Could not find outpost nope: no outpost with this name exists in the account"


def test_check_mode_sends_no_put(api, monkeypatch):
    api.expect("GET", LIST, json=outpost_page([outpost("gpu-h200", "outpost_env-1")]))
    api.expect("GET", PATH, json=UNSET)
    result, failed = run(default_platform.main, monkeypatch, check_mode=True, outpost="gpu-h200")
    assert (failed, result["changed"], result["default_platform"]) == (False, True, GPU)


@pytest.mark.parametrize("current, changed", [(GPU, True), (LINUX, True), (UNSET, False)])
def test_absent_clears(api, monkeypatch, current, changed):
    api.expect("GET", PATH, json=current)
    if changed:
        api.expect("PUT", PATH, json=UNSET)
    result, failed = run(default_platform.main, monkeypatch, state="absent")
    assert (failed, result["changed"], result["default_platform"]) == (False, changed, UNSET)
    if changed:
        assert api.calls[-1].body == {"platform": None, "outpost_pool_id": None}


def test_a_put_without_an_echo_is_read_back(api, monkeypatch):
    api.expect("GET", PATH, json=UNSET)
    api.expect("PUT", PATH, status=204)
    api.expect("GET", PATH, json=LINUX)
    result, failed = run(default_platform.main, monkeypatch, platform="linux")
    assert result["default_platform"] == LINUX


@pytest.mark.parametrize("args, message", [
    (dict(platform="linux", outpost="gpu-h200"), "parameters are mutually exclusive: platform|outpost"),
    (dict(), "state is present but any of the following are missing: platform, outpost"),
])
def test_argument_errors(api, monkeypatch, args, message):
    result, failed = run(default_platform.main, monkeypatch, **args)
    assert failed
    assert message in result["msg"]
    assert api.calls == []


def test_permission_error_names_the_organization(api, monkeypatch):
    api.expect("GET", PATH, json=UNSET)
    api.expect("PUT", PATH, status=403, json={"detail": "Missing permission ManageOrgSettings"})
    result, failed = run(default_platform.main, monkeypatch, platform="linux")
    assert failed
    assert result["msg"] == ("Could not set the default platform of organization org-abc: 403 "
                             "Missing permission ManageOrgSettings")


@pytest.mark.parametrize("value, shown", [([1, 2], "'[1, 2]' (a list? give one name)"), ("gpu h200", "'gpu h200'")])
def test_an_invalid_outpost_name_fails_before_any_request(api, monkeypatch, value, shown):
    result, failed = run(default_platform.main, monkeypatch, outpost=value)
    assert failed
    assert result["msg"] == ("outpost: {0} is not a valid outpost name: an outpost name is 1 to 63 letters, digits, "
                             "'.', '_' or '-', starting with a letter or digit".format(shown))
    assert api.calls == []
