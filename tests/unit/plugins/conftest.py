# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.devin.outposts.plugins.module_utils import _fleet_api
from ansible_collections.devin.outposts.tests.unit.plugins.fleet_fakes import FakeAPI


@pytest.fixture
def api(monkeypatch):
    """The scripted API; every expectation must have been requested by the end of the test."""
    fake = FakeAPI()
    monkeypatch.setattr(_fleet_api, "open_url", fake)
    yield fake
    fake.assert_done()


@pytest.fixture
def sleeps(monkeypatch):
    """Record backoff sleeps instead of sleeping; jitter always picks the upper bound."""
    recorded = []
    monkeypatch.setattr(_fleet_api.time, "sleep", recorded.append)
    monkeypatch.setattr(_fleet_api.random, "uniform", lambda low, high: high)
    return recorded


@pytest.fixture(autouse=True)
def _no_env_credentials(monkeypatch):
    for name in ("DEVIN_API_URL", "DEVIN_OUTPOSTS_TOKEN", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
