# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""A scripted stand-in for ``open_url`` that states, in order, the exact HTTP calls a test expects."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import email.message
import io
import json
from urllib.error import HTTPError

API = "https://api.test.invalid"
TOKEN = "cog_unitTESTtoken0123456789abcdefghijklmnopqrstuv"  # nosec - a fake token


class FakeResponse:
    def __init__(self, payload, status=200):
        self._payload = payload
        self.status = status

    def read(self, size=-1):
        """What urllib's response gives: up to ``size`` bytes (all with -1), then b"" at the end."""
        taken = self._payload if size is None or size < 0 else self._payload[:size]
        self._payload = self._payload[len(taken):]
        return taken

    def getcode(self):
        return self.status


class Expected:
    def __init__(self, method, url, status, payload, headers, exc):
        self.method = method
        self.url = url
        self.status = status
        self.payload = payload
        self.headers = headers or {}
        self.exc = exc


class Call:
    def __init__(self, method, url, headers, body, options):
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.options = options

    def __repr__(self):
        return "Call({0} {1} body={2!r})".format(self.method, self.url, self.body)


def _payload(json_body, raw):
    if raw is not None:
        return raw if isinstance(raw, bytes) else raw.encode("utf-8")
    if json_body is None:
        return b""
    return json.dumps(json_body).encode("utf-8")


class FakeAPI:
    """Replace ``open_url``: each request must match the next expectation (method and full URL)."""

    def __init__(self):
        self.expected = []
        self.calls = []

    def expect(self, method, path, status=200, json=None, raw=None, headers=None, exc=None):
        url = path if path.startswith("http") else API + path
        self.expected.append(Expected(method, url, status, _payload(json, raw), headers, exc))
        return self

    def __call__(self, url, data=None, headers=None, method=None, **options):
        body = json.loads(data.decode("utf-8")) if data else None
        self.calls.append(Call(method, url, dict(headers or {}), body, options))
        assert self.expected, "unexpected request {0} {1}".format(method, url)
        exp = self.expected.pop(0)
        assert (method, url) == (exp.method, exp.url), "expected {0} {1}, got {2} {3}".format(
            exp.method, exp.url, method, url)
        if exp.exc is not None:
            raise exp.exc
        if exp.status >= 300:
            hdrs = email.message.Message()
            for key, value in exp.headers.items():
                hdrs[key] = value
            raise HTTPError(url, exp.status, "HTTP {0}".format(exp.status), hdrs, io.BytesIO(exp.payload))
        return FakeResponse(exp.payload, exp.status)

    def assert_done(self):
        assert not self.expected, "requests not sent: {0}".format(
            ["{0} {1}".format(e.method, e.url) for e in self.expected])


def outpost(name, outpost_id=None, platform="linux", description=None, queue_depth=0):
    return {
        "metadata": {"outpost_id": outpost_id or "outpost_env-" + name, "account_id": "account-1",
                     "created_at": 1781050000},
        "spec": {"name": name, "platform": platform, "description": description},
        "status": {"queue_depth": queue_depth, "active_claims": 0},
    }


def outpost_page(items, end_cursor=None, has_next_page=False):
    return {"items": items, "end_cursor": end_cursor, "has_next_page": has_next_page, "total": len(items)}


def session(session_id, outpost_id="outpost_env-gpu", phase="pending", acceptor_id=None, updated_at=1781050000):
    return {
        "metadata": {"session_id": session_id, "outpost_id": outpost_id, "created_at": 1781050000,
                     "updated_at": updated_at},
        "spec": {"kind": "new", "platform": "linux", "remote_binary_sha": None},
        "status": {"phase": phase, "acceptor_id": acceptor_id, "claim_deadline": None, "session_status": "pending"},
    }


def session_page(items, cursor, has_next_page=False):
    return {"items": items, "cursor": cursor, "has_next_page": has_next_page}


class ModuleExit(Exception):
    def __init__(self, result, failed):
        super(ModuleExit, self).__init__(result.get("msg", ""))
        self.result = result
        self.failed = failed


@contextlib.contextmanager
def module_args(args):
    """Expose ``args`` to an AnsibleModule (ansible-core 2.19's helper, else the classic patch)."""
    try:
        from ansible.module_utils.testing import patch_module_args
    except ImportError:
        patch_module_args = None
    if patch_module_args is not None:
        with patch_module_args(args):
            yield
        return
    from unittest import mock

    from ansible.module_utils import basic
    from ansible.module_utils.common.text.converters import to_bytes

    with mock.patch.object(basic, "_ANSIBLE_ARGS", to_bytes(json.dumps({"ANSIBLE_MODULE_ARGS": args}))):
        yield


def run_module(main, args, monkeypatch):
    """Run a module's ``main`` with ``args``; return ``(result, failed)`` instead of exiting."""
    from ansible.module_utils import basic

    def exit_json(self, **kwargs):
        kwargs.setdefault("changed", False)
        kwargs["warnings"] = list(getattr(self, "_devin_warnings", []))
        raise ModuleExit(kwargs, False)

    def fail_json(self, msg, **kwargs):
        kwargs["msg"] = msg
        raise ModuleExit(kwargs, True)

    def warn(self, warning):
        self.__dict__.setdefault("_devin_warnings", []).append(warning)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)
    monkeypatch.setattr(basic.AnsibleModule, "warn", warn)
    with module_args(args):
        try:
            main()
        except ModuleExit as exc:
            return exc.result, exc.failed
    raise AssertionError("the module neither exited nor failed")
