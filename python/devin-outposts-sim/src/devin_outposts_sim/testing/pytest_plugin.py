"""pytest fixtures for tests against the fleet simulator: this repository's, and users' own.

pytest loads them by itself wherever ``devin-outposts-sim`` is installed (its ``pytest11`` entry point); a
project's own fixture of the same name wins, and ``-p no:devin_outposts_sim`` turns them all off.

* ``sim``: an in-process simulator (``:memory:``, ``FAST`` timings), empty at the start of each test
  (one server per session, reset through the admin API, so tests stay fast).
* ``make_sim(**config)``: start another one with custom settings (closed at the end of the test).
* ``orchestrator_token`` / ``machine_token``: API tokens of the default account on ``sim``.
* ``api(token)``: a sync httpx client on ``sim`` sending ``Authorization: Bearer <token>``.
* ``outpost``: an outpost (``linux``) created on ``sim``.
* ``watch(token, **params)``: open a watch stream (:class:`WatchStream`) as a context manager; it is read
  by the fleet API's one SSE reader (:mod:`devin_outposts.api.stream`), as the worker reads it.
* ``wait_until(predicate, timeout=10)``: bounded polling for a condition.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any, Callable, Optional

import httpx
import pytest

from devin_outposts.api.models import Outpost
from devin_outposts.api.stream import EVENT_STREAM, EventStreamReader, watch_params
from devin_outposts_sim import testing as sim_testing
from devin_outposts_sim.testing import SimHandle, run_sim

#: Timings for tests: short enough to expire and end streams quickly, long enough not to race.
FAST: dict[str, float] = {
    "claim_ttl": 30.0,
    "watch_max_duration": 10.0,
    "keepalive_interval": 5.0,
    "sweep_interval": 0.05,
}

__all__ = ["FAST", "_shared_sim", "api", "machine_token", "make_sim", "orchestrator_token", "outpost", "sim",
           "wait_until", "watch"]

MakeSim = Callable[..., SimHandle]
Api = Callable[..., httpx.Client]


@pytest.fixture
def make_sim() -> Iterator[MakeSim]:
    with ExitStack() as stack:

        def start(**config: Any) -> SimHandle:
            return stack.enter_context(run_sim(**{**FAST, **config}))

        yield start


@pytest.fixture(scope="session")
def _shared_sim() -> Iterator[SimHandle]:
    with run_sim(
        claim_ttl=FAST["claim_ttl"],
        watch_max_duration=FAST["watch_max_duration"],
        keepalive_interval=FAST["keepalive_interval"],
        sweep_interval=FAST["sweep_interval"],
    ) as handle:
        yield handle


@pytest.fixture
def sim(_shared_sim: SimHandle) -> SimHandle:
    """The shared simulator (``FAST`` timings), emptied by the admin reset before each test."""
    _shared_sim.admin.reset()
    return _shared_sim


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


# --- helpers shared by the simulator tests ---------------------------------------------------------


def _wait_until(predicate: Callable[[], Any], *, timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); fail after ``timeout``."""
    try:
        return sim_testing.wait_until(predicate, timeout=timeout, interval=interval)
    except TimeoutError as exc:
        pytest.fail(str(exc))


@pytest.fixture
def wait_until() -> Callable[..., Any]:
    """``wait_until(predicate, timeout=10)``: poll until truthy (returns it); fail after the timeout."""
    return _wait_until


class WatchStream:
    """An open ``?watch=true`` response, read as SSE events (``data:`` lines) and comments."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.comments: list[str] = []
        self._chunks = response.iter_bytes()
        self._reader = EventStreamReader(on_comment=lambda text: self.comments.append(text.strip()))
        self._ready: list[str] = []  # the data of events read but not returned yet
        self.ended = False

    def next_event(self) -> Optional[dict[str, Any]]:
        """The next data event (comments are counted, not returned), or None when the stream ended."""
        while not self._ready:
            chunk = next(self._chunks, None)
            if chunk is None:
                self.ended = True
                return None
            self._ready.extend(event.data for event in self._reader.feed(chunk))
        event: dict[str, Any] = json.loads(self._ready.pop(0))
        return event

    def until(self, predicate: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        """Events up to and including the first one matching ``predicate``; fails if the stream ends."""
        seen: list[dict[str, Any]] = []
        while True:
            event = self.next_event()
            if event is None:
                pytest.fail(f"the stream ended before the expected event; got {[e['type'] for e in seen]}")
            seen.append(event)
            if predicate(event):
                return seen

    def rest(self) -> list[dict[str, Any]]:
        """Every remaining event until the server ends the stream."""
        seen: list[dict[str, Any]] = []
        while (event := self.next_event()) is not None:
            seen.append(event)
        return seen


WatchFactory = Callable[..., AbstractContextManager[WatchStream]]


@pytest.fixture
def watch(sim: SimHandle) -> WatchFactory:
    """``with watch(token, outpost=..., cursor=..., handle=other_sim) as stream: ...``"""

    @contextmanager
    def open_watch(token: str, *, handle: Optional[SimHandle] = None, **params: Any) -> Iterator[WatchStream]:
        target = handle or sim
        outpost, cursor = params.pop("outpost", None), params.pop("cursor", None)
        query = {**watch_params(outpost, cursor), **{k: v for k, v in params.items() if v is not None}}
        headers = {"Authorization": f"Bearer {token}", "Accept": EVENT_STREAM}
        with ExitStack() as stack:  # one ``with`` per context: Python 3.9 has no parenthesised form
            client = stack.enter_context(httpx.Client(base_url=target.url, headers=headers, timeout=15.0))
            response = stack.enter_context(client.stream("GET", "/opbeta/outposts/devins", params=query))
            assert response.status_code == 200, response.read()
            yield WatchStream(response)

    return open_watch
