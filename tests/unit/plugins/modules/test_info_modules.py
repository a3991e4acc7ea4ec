# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""outpost_info and session_info: the requests they send and what they return."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

import pytest

from ansible_collections.devin.outposts.plugins.modules import outpost_info, session_info
from ansible_collections.devin.outposts.tests.unit.plugins.fleet_fakes import (
    API,
    TOKEN,
    outpost,
    outpost_page,
    run_module,
    session,
    session_page,
)

LIST = "/opbeta/outposts/outposts?first=100"
QUEUE = "/opbeta/outposts/devins"
ALL = [outpost("gpu-h200", "outpost_env-1"), outpost("rhel", "outpost_env-2")]


def run(main, monkeypatch, **args):
    args.setdefault("api_url", API)
    args.setdefault("token", TOKEN)
    result, failed = run_module(main, args, monkeypatch)
    assert TOKEN not in json.dumps(result)
    return result, failed


# --- outpost_info ---------------------------------------------------------------------------------


@pytest.mark.parametrize("args, expected", [
    (dict(), ALL),
    (dict(name="rhel"), [ALL[1]]),
    (dict(id="outpost_env-1"), [ALL[0]]),
    (dict(outpost_id="outpost_env-2"), [ALL[1]]),
    (dict(name="missing"), []),
    (dict(id="outpost_env-missing"), []),
])
def test_outpost_info(api, monkeypatch, args, expected):
    api.expect("GET", LIST, json=outpost_page(ALL))
    result, failed = run(outpost_info.main, monkeypatch, **args)
    assert (failed, result["changed"], result["outposts"]) == (False, False, expected)


def test_outpost_info_all_pages(api, monkeypatch):
    api.expect("GET", LIST, json=outpost_page(ALL[:1], "c1", True))
    api.expect("GET", "/opbeta/outposts/outposts?after=c1&first=100", json=outpost_page(ALL[1:]))
    result, failed = run(outpost_info.main, monkeypatch)
    assert result["outposts"] == ALL


def test_outpost_info_name_and_id_are_exclusive(api, monkeypatch):
    result, failed = run(outpost_info.main, monkeypatch, name="rhel", id="outpost_env-2")
    assert failed
    assert "mutually exclusive: name|id" in result["msg"]


def test_outpost_info_bad_token(api, monkeypatch):
    api.expect("GET", LIST, status=401, json={"detail": "Invalid token"})
    result, failed = run(outpost_info.main, monkeypatch)
    assert failed
    assert result["msg"] == "Could not list outposts: 401 Invalid token"


# --- session_info ---------------------------------------------------------------------------------


def test_session_info_resolves_an_outpost_name(api, monkeypatch):
    api.expect("GET", LIST, json=outpost_page(ALL))
    api.expect("GET", QUEUE + "?first=100&outpost=outpost_env-2&phase=pending",
               json=session_page([session("devin-1", "outpost_env-2")], "cur-9"))
    result, failed = run(session_info.main, monkeypatch, outpost="rhel", phase="pending")
    assert not failed
    assert [s["metadata"]["session_id"] for s in result["sessions"]] == ["devin-1"]
    assert (result["cursor"], result["outpost_id"], result["changed"]) == ("cur-9", "outpost_env-2", False)


def test_session_info_takes_an_id_without_listing_outposts(api, monkeypatch):
    api.expect("GET", QUEUE + "?acceptor_id=orch-1&first=100&outpost=outpost_env-7&phase=claimed",
               json=session_page([], "cur-0"))
    result, failed = run(session_info.main, monkeypatch, outpost="outpost_env-7", phase="claimed",
                         acceptor_id="orch-1")
    assert (failed, result["sessions"], result["cursor"]) == (False, [], "cur-0")


def test_session_info_unknown_outpost_name_fails(api, monkeypatch):
    api.expect("GET", LIST, json=outpost_page(ALL))
    result, failed = run(session_info.main, monkeypatch, outpost="nope")
    assert failed
    assert result["msg"] == "Could not find outpost nope: no outpost with this name exists in the account"


def test_session_info_paginates_and_deduplicates(api, monkeypatch):
    rows = [session("devin-%03d" % i) for i in range(250)]
    api.expect("GET", QUEUE + "?first=100", json=session_page(rows[0:100], "c1", True))
    api.expect("GET", QUEUE + "?cursor=c1&first=100", json=session_page(rows[99:199], "c2", True))
    api.expect("GET", QUEUE + "?cursor=c2&first=100", json=session_page(rows[198:250], "c3", False))
    result, failed = run(session_info.main, monkeypatch)
    assert not failed
    ids = [s["metadata"]["session_id"] for s in result["sessions"]]
    assert ids == ["devin-%03d" % i for i in range(250)]
    assert result["cursor"] == "c3"


def test_session_info_starts_at_a_cursor(api, monkeypatch):
    api.expect("GET", QUEUE + "?cursor=from-watch&first=50", json=session_page([], None))
    result, failed = run(session_info.main, monkeypatch, cursor="from-watch", page_size=50)
    assert result["cursor"] == "from-watch"


@pytest.mark.parametrize("size", [0, 201])
def test_session_info_page_size_is_bounded(api, monkeypatch, size):
    result, failed = run(session_info.main, monkeypatch, page_size=size)
    assert failed
    assert result["msg"] == "page_size must be between 1 and 200, got {0}".format(size)


def test_session_info_rejects_unknown_phase(api, monkeypatch):
    result, failed = run(session_info.main, monkeypatch, phase="frozen")
    assert failed
    assert "phase" in result["msg"]


# --- outpost names are checked before any request ---------------------------------------------------

NAME_RULE = "an outpost name is 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit"


@pytest.mark.parametrize("main, option", [(outpost_info.main, "name"), (session_info.main, "outpost")])
@pytest.mark.parametrize("value, shown", [
    ([1, 2], "'[1, 2]' (a list? give one name)"),
    ("gpu h200", "'gpu h200'"),
])
def test_invalid_outpost_names_fail_before_any_request(api, monkeypatch, main, option, value, shown):
    result, failed = run(main, monkeypatch, **{option: value})
    assert failed
    assert result["msg"] == "{0}: {1} is not a valid outpost name: {2}".format(option, shown, NAME_RULE)
    assert api.calls == []


def test_session_info_takes_any_outpost_id_unchecked(api, monkeypatch):
    # Ids are the server's to define: only names are held to the name rule.
    api.expect("GET", QUEUE + "?first=100&outpost=outpost_env-a%2Fb+c", json=session_page([], "cur-0"))
    result, failed = run(session_info.main, monkeypatch, outpost="outpost_env-a/b c")
    assert (failed, result["outpost_id"]) == (False, "outpost_env-a/b c")
