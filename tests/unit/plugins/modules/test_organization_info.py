# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""organization_info: the requests it sends (GET /v3/enterprise/organizations, paged) and what it returns."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

import pytest

from ansible_collections.devin.outposts.plugins.modules import organization_info
from ansible_collections.devin.outposts.tests.unit.plugins.fleet_fakes import API, TOKEN, outpost_page, run_module

PATH = "/v3/enterprise/organizations"
LIST = PATH + "?first=100"
ORGS = [
    {"org_id": "org-0123abcd", "name": "Research"},
    {"org_id": "org-4567ef01", "name": "Platform"},
    {"org_id": "org-89ab2345", "name": "Research"},
]


def run(monkeypatch, check_mode=False, **args):
    args.setdefault("api_url", API)
    args.setdefault("token", TOKEN)
    if check_mode:
        args["_ansible_check_mode"] = True
    result, failed = run_module(organization_info.main, args, monkeypatch)
    assert TOKEN not in json.dumps(result)
    return result, failed


@pytest.mark.parametrize("args, expected", [
    (dict(), ORGS),
    (dict(name="Platform"), [ORGS[1]]),
    (dict(name="Research"), [ORGS[0], ORGS[2]]),
    (dict(name="research"), []),
    (dict(name="Nobody"), []),
])
def test_lists_and_filters_by_name(api, monkeypatch, args, expected):
    api.expect("GET", LIST, json=outpost_page(ORGS))
    result, failed = run(monkeypatch, **args)
    assert (failed, result["changed"], result["organizations"]) == (False, False, expected)


def test_sends_the_token_as_a_bearer_token(api, monkeypatch):
    api.expect("GET", LIST, json=outpost_page(ORGS[:1]))
    run(monkeypatch)
    assert api.calls[0].headers["Authorization"] == "Bearer " + TOKEN


def test_follows_end_cursor_across_pages(api, monkeypatch):
    api.expect("GET", LIST, json=outpost_page(ORGS[:2], "c1", True))
    api.expect("GET", PATH + "?after=c1&first=100", json=outpost_page(ORGS[2:], "c2", False))
    result, failed = run(monkeypatch)
    assert (failed, result["organizations"]) == (False, ORGS)


def test_a_row_repeated_on_the_next_page_is_listed_once(api, monkeypatch):
    fresher = {"org_id": "org-4567ef01", "name": "Platform team"}
    api.expect("GET", LIST, json=outpost_page(ORGS[:2], "c1", True))
    api.expect("GET", PATH + "?after=c1&first=100", json=outpost_page([fresher, ORGS[2]]))
    result, failed = run(monkeypatch)
    assert result["organizations"] == [ORGS[0], fresher, ORGS[2]]


def test_a_cursor_that_does_not_advance_fails(api, monkeypatch):
    api.expect("GET", LIST, json=outpost_page(ORGS[:1], "c1", True))
    api.expect("GET", PATH + "?after=c1&first=100", json=outpost_page(ORGS[1:2], "c1", True))
    result, failed = run(monkeypatch)
    assert failed
    assert result["msg"] == ("Could not list organizations: the API reported another page but did not advance "
                             "end_cursor")


def test_check_mode_reads_the_same_way(api, monkeypatch):
    api.expect("GET", LIST, json=outpost_page(ORGS))
    result, failed = run(monkeypatch, check_mode=True)
    assert (failed, result["changed"], result["organizations"]) == (False, False, ORGS)


@pytest.mark.parametrize("status, body, msg", [
    (401, {"detail": "Invalid token"}, "Could not list organizations: 401 Invalid token"),
    (403, {"detail": "Missing permission"}, "Could not list organizations: 403 Missing permission"),
])
def test_api_errors_name_the_operation(api, monkeypatch, status, body, msg):
    api.expect("GET", LIST, status=status, json=body)
    result, failed = run(monkeypatch)
    assert failed
    assert (result["msg"], result["http_status"]) == (msg, status)


def test_a_page_that_is_not_an_envelope_fails(api, monkeypatch):
    api.expect("GET", LIST, json=["org-0123abcd"])
    result, failed = run(monkeypatch)
    assert failed
    assert result["msg"].startswith("Could not list organizations: 200 unexpected response")


def test_without_a_token_nothing_is_sent(api, monkeypatch):
    result, failed = run(monkeypatch, token=None)
    assert failed
    assert "no API token" in result["msg"]
    assert api.calls == []


def test_token_from_the_environment(api, monkeypatch):
    monkeypatch.setenv("DEVIN_OUTPOSTS_TOKEN", TOKEN)
    monkeypatch.setenv("DEVIN_API_URL", API)
    api.expect("GET", LIST, json=outpost_page([]))
    result, failed = run_module(organization_info.main, {}, monkeypatch)
    assert (failed, result["organizations"]) == (False, [])
