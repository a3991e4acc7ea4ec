"""Shared fixtures for tests against the fleet simulator.

* ``sim``: a fresh in-process simulator (``:memory:``) with short timings suitable for tests.
* ``make_sim(**config)``: start another one with custom settings (closed at the end of the test).
* ``orchestrator_token`` / ``machine_token``: API tokens of the default account on ``sim``.
* ``api(token)``: a sync httpx client on ``sim`` sending ``Authorization: Bearer <token>``.
* ``outpost``: an outpost (``linux``) created on ``sim``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any, Callable, Optional

import httpx
import pytest

from devin_outposts.models import Outpost
from devin_outposts.sim.testing import SimHandle, run_sim

#: Timings for tests: short enough to expire and end streams quickly, long enough not to race.
FAST: dict[str, float] = {
    "claim_ttl": 30.0,
    "watch_max_duration": 10.0,
    "keepalive_interval": 5.0,
    "sweep_interval": 0.05,
}

MakeSim = Callable[..., SimHandle]
Api = Callable[..., httpx.Client]


@pytest.fixture
def make_sim() -> Iterator[MakeSim]:
    with ExitStack() as stack:

        def start(**config: Any) -> SimHandle:
            return stack.enter_context(run_sim(**{**FAST, **config}))

        yield start


@pytest.fixture
def sim(make_sim: MakeSim) -> SimHandle:
    return make_sim()


@pytest.fixture
def orchestrator_token(sim: SimHandle) -> str:
    return sim.create_token("orchestrator")


@pytest.fixture
def machine_token(sim: SimHandle) -> str:
    return sim.create_token("machine")


@pytest.fixture
def api(sim: SimHandle) -> Iterator[Api]:
    with ExitStack() as stack:

        def client(token: Optional[str] = None, *, handle: Optional[SimHandle] = None) -> httpx.Client:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            target = handle or sim
            return stack.enter_context(httpx.Client(base_url=target.url, headers=headers, timeout=30.0))

        yield client


@pytest.fixture
def outpost(sim: SimHandle) -> Outpost:
    return sim.admin.create_outpost("rhel", "linux")
