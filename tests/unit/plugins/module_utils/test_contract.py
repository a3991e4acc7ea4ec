# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""The modules' fleet client against the shared contract cases (python/contract/cases.yaml), and its copy of
the backoff against the backoff cases of python/contract/stream.yaml.

The worker's client runs the same cases in the worker package's tests/test_contract.py, the event source in
tests/eda/test_outpost_queue_contract.py. Each case scripts the server's answers (a stand-in for ``open_url``) and states
the result or error, the requests sent and the waits between retries; this runner turns the client's dicts
and exceptions into the case's terms.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import email.message
import email.utils
import io
import json
import os
import time
from urllib.error import HTTPError, URLError
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from ansible_collections.devin.outposts.plugins.module_utils import _fleet_api
from ansible_collections.devin.outposts.plugins.module_utils._fleet_api import (
    FleetAPIError,
    FleetClient,
    looks_like_outpost_id,
    normalize_api_url,
    outpost_id_of,
    outpost_name_error,
    session_id_of,
)


def _cases_file(name="cases.yaml"):
    here = os.path.dirname(os.path.abspath(__file__))
    while True:
        candidate = os.path.join(here, "python", "contract", name)
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(here)
        if parent == here:
            raise RuntimeError("python/contract/{0} not found above {1}".format(name, __file__))
        here = parent


with open(_cases_file(), encoding="utf-8") as handle:
    CASES = yaml.safe_load(handle)
with open(_cases_file("stream.yaml"), encoding="utf-8") as handle:
    BACKOFF_CASES = yaml.safe_load(handle)["backoff"]
API = "https://api.test.invalid"


def _for_module(case):
    return "module" in case.get("clients", ["module", "worker"])


def _header_value(value):
    text = str(value)
    if text.startswith("@+"):  # an HTTP date this many seconds from now
        return email.utils.formatdate(time.time() + float(text[2:]), usegmt=True)
    return text


class _Response:
    def __init__(self, payload, status):
        self._payload = payload
        self.status = status

    def read(self, size=-1):
        """What urllib's response gives: up to ``size`` bytes (all with -1), then b"" at the end."""
        taken = self._payload if size is None or size < 0 else self._payload[:size]
        self._payload = self._payload[len(taken):]
        return taken

    def getcode(self):
        return self.status


class ScriptedOpenURL:
    """Answers each ``open_url`` call with the case's next reply, as urllib would present it."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests = []

    def __call__(self, url, data=None, headers=None, method=None, **options):
        self.requests.append({"method": method, "url": url, "body": json.loads(data) if data else None})
        assert self.replies, "an unexpected request: {0} {1}".format(method, url)
        reply = self.replies.pop(0)
        if reply.get("connection") == "refused":
            raise URLError(ConnectionRefusedError(111, "Connection refused"))
        payload = reply["raw"].encode("utf-8") if "raw" in reply else json.dumps(reply["body"]).encode("utf-8")
        status = reply["status"]
        if status < 300:
            return _Response(payload, status)
        message = email.message.Message()
        for key, value in (reply.get("headers") or {}).items():
            message[key] = _header_value(value)
        raise HTTPError(url, status, "status {0}".format(status), message, io.BytesIO(payload))


def _call(client, name, args):
    """The operation ``name`` on the modules' client, its answer in the cases' terms."""
    if name == "defaults":
        fresh = FleetClient(token="cog_contract_token")
        return {"api_url": fresh.api_url, "timeout": fresh.timeout, "max_page_size": _fleet_api.MAX_PAGE_SIZE}
    if name == "phases":
        return list(_fleet_api.PHASES)
    if name == "normalize_api_url":
        return normalize_api_url(args["url"])
    if name == "outpost_names":
        return [outpost_name_error("name", value) is None for value in args["names"]]
    if name == "outpost_ids":
        return [looks_like_outpost_id(value) for value in args["values"]]
    if name == "list_outposts":
        return [outpost_id_of(o) for o in client.list_outposts(page_size=args.get("page_size", 100))]
    if name == "create_outpost":
        return outpost_id_of(client.create_outpost(args["name"], platform=args.get("platform"),
                                                   description=args.get("description")))
    if name == "delete_outpost":
        return client.delete_outpost(args["outpost_id"])
    if name == "get_outpost":
        found = client.get_outpost(args["outpost_id"])
        return None if found is None else outpost_id_of(found)
    if name == "list_sessions":
        entries, cursor = client.list_sessions(outpost_id=args.get("outpost"), phase=args.get("phase"),
                                               acceptor_id=args.get("acceptor_id"),
                                               page_size=args.get("page_size", 100), cursor=args.get("cursor"))
        return {
            "sessions": [session_id_of(e) for e in entries],
            "phases": [(e.get("status") or {}).get("phase") for e in entries],
            "cursor": cursor,
        }
    if name == "get_default_platform":
        value = client.get_default_platform(args["org_id"])
    elif name == "set_default_platform":
        value = client.set_default_platform(args["org_id"], platform=args.get("platform"),
                                            outpost_pool_id=args.get("outpost_pool_id"))
    else:
        raise AssertionError("the module runner does not know the operation {0!r}".format(name))
    return dict((k, value.get(k)) for k in ("platform", "outpost_pool_id", "outpost_pool_name"))


@pytest.mark.parametrize("case", [c for c in CASES if _for_module(c)], ids=lambda c: c["id"])
def test_contract_case(case, monkeypatch):
    server = ScriptedOpenURL(case.get("replies") or [])
    monkeypatch.setattr(_fleet_api, "open_url", server)
    sleeps = []
    client = FleetClient(api_url=API, token="cog_contract_token", sleep=sleeps.append)
    result, error = None, None
    try:
        result = _call(client, case["call"], case.get("args") or {})
    except FleetAPIError as exc:
        error = {"status": exc.status, "message": str(exc)}
    expect = case["expect"]
    if "error" in expect:
        assert error is not None, "expected an error, got the result {0!r}".format(result)
        assert error["status"] == expect["error"]["status"], error
        assert expect["error"]["message"] in error["message"], error["message"]
        assert "\n" not in error["message"], "an error is one line"
    else:
        assert error is None, "expected {0!r}, got the error {1}".format(expect.get("result"), error)
        assert result == expect["result"]
    assert not server.replies, "{0} scripted answer(s) were never asked for".format(len(server.replies))
    if "requests" in expect:
        assert len(server.requests) == len(expect["requests"]), [r["url"] for r in server.requests]
        for sent, wanted in zip(server.requests, expect["requests"]):
            parts = urlsplit(sent["url"])
            assert sent["method"] == wanted["method"]
            assert parts.path == wanted["path"]
            query = parse_qs(parts.query)
            for key, value in (wanted.get("query") or {}).items():
                assert query.get(key) == [str(value)], (key, sent["url"])
            if "body" in wanted:
                assert sent["body"] == wanted["body"]
    if "sleeps" in expect:
        assert len(sleeps) == len(expect["sleeps"]), sleeps
        for slept, wanted in zip(sleeps, expect["sleeps"]):
            low, high = (wanted, wanted) if not isinstance(wanted, list) else wanted
            assert low - 0.01 <= slept <= high + 0.01, (slept, wanted)


@pytest.mark.parametrize("case", BACKOFF_CASES, ids=lambda c: c["id"])
def test_backoff_case(case, monkeypatch):
    """The modules' own copy of the one backoff: the lowest and the highest wait of each attempt."""
    client = FleetClient(api_url=API, token="cog_contract_token", backoff_base=case["base"], backoff_max=case["cap"])
    first = case.get("from", 0)
    for side in (0, 1):
        monkeypatch.setattr(_fleet_api.random, "uniform", lambda low, high, side=side: (low, high)[side])
        waits = [client._backoff(first + offset) for offset in range(len(case["waits"]))]
        assert waits == pytest.approx([bounds[side] for bounds in case["waits"]]), waits
