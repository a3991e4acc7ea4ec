# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible.errors import AnsibleError
from ansible.plugins.loader import lookup_loader

from ansible_collections.devin.outposts.plugins.lookup import outpost_id as lookup_module
from ansible_collections.devin.outposts.tests.unit.plugins.fleet_fakes import (
    API,
    TOKEN,
    outpost,
    outpost_page,
)

LIST = "/opbeta/outposts/outposts?first=100"
ALL = outpost_page([outpost("gpu-h200", "outpost_env-1"), outpost("rhel", "outpost_env-2")])


@pytest.fixture
def lookup():
    return lookup_loader.get("devin.outposts.outpost_id")


def test_name_to_id(api, lookup):
    api.expect("GET", LIST, json=ALL)
    assert lookup.run(["gpu-h200"], {}, api_url=API, token=TOKEN) == ["outpost_env-1"]
    assert api.calls[0].headers["Authorization"] == "Bearer " + TOKEN


def test_many_terms_one_request(api, lookup):
    api.expect("GET", LIST, json=ALL)
    assert lookup.run(["rhel", "gpu-h200", "outpost_env-2"], {}, api_url=API, token=TOKEN) == [
        "outpost_env-2", "outpost_env-1", "outpost_env-2"]


def test_unknown_name_is_a_clear_error(api, lookup):
    api.expect("GET", LIST, json=ALL)
    with pytest.raises(AnsibleError) as info:
        lookup.run(["nope"], {}, api_url=API, token=TOKEN)
    assert str(info.value) == ("Could not find outpost nope: no outpost with this name exists in the account "
                               "at https://api.test.invalid")


def test_on_missing_skip_and_warn(api, lookup, monkeypatch):
    warnings = []
    monkeypatch.setattr(lookup_module.display, "warning", warnings.append)
    api.expect("GET", LIST, json=ALL)
    api.expect("GET", LIST, json=ALL)
    assert lookup.run(["nope", "rhel"], {}, api_url=API, token=TOKEN, on_missing="skip") == ["outpost_env-2"]
    assert warnings == []
    assert lookup.run(["nope", "rhel"], {}, api_url=API, token=TOKEN, on_missing="warn") == ["outpost_env-2"]
    assert warnings == ["No outpost named nope exists in the account at https://api.test.invalid"]


def test_environment_and_transport_options(api, lookup, monkeypatch):
    monkeypatch.setenv("DEVIN_OUTPOSTS_TOKEN", "cog_from_env")
    monkeypatch.setenv("DEVIN_API_URL", "http://127.0.0.1:9/opbeta/outposts")
    api.expect("GET", "http://127.0.0.1:9" + LIST, json=ALL)
    assert lookup.run(["rhel"], {}, validate_certs=False, timeout=5) == ["outpost_env-2"]
    call = api.calls[0]
    assert call.headers["Authorization"] == "Bearer cog_from_env"
    assert (call.options["validate_certs"], call.options["timeout"]) == (False, 5.0)


def test_api_errors_become_one_line(api, lookup):
    api.expect("GET", LIST, status=401, json={"detail": "Invalid token"})
    with pytest.raises(AnsibleError) as info:
        lookup.run(["rhel"], {}, api_url=API, token=TOKEN)
    assert str(info.value) == "Could not list outposts: 401 Invalid token"
    assert TOKEN not in str(info.value)


def test_no_token(api, lookup):
    with pytest.raises(AnsibleError, match="no API token"):
        lookup.run(["rhel"], {}, api_url=API)


@pytest.mark.parametrize("term, shown", [
    ([1, 2], "[1, 2] (a list, not a string)"),
    (7, "7 (an int, not a string)"),
    ("gpu h200", "'gpu h200'"),
    ("", "''"),
])
def test_invalid_terms_fail_before_any_request(api, lookup, term, shown):
    with pytest.raises(AnsibleError) as info:
        lookup.run(["rhel", term], {}, api_url=API, token=TOKEN)
    assert str(info.value) == ("outpost_id: {0} is not a valid outpost name: an outpost name is 1 to 63 letters, "
                               "digits, '.', '_' or '-', starting with a letter or digit".format(shown))
    assert api.calls == []
