"""Spreading the claims: rendezvous ownership of rows among the workers of an outpost (queue.py).

Several feeds that see the same queue must agree on who claims which row first, without talking to each
other: each row has exactly one owner among the contenders, a lone worker claims strictly oldest first,
busy peers are not contenders, and a deferred row is claimed after a bounded wait.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import pytest

from devin_outposts.api.models import QueueEntry
from devin_outposts.core.feed import SPREAD_MAX_RANK, SPREAD_STEP, QueueFeed, rendezvous_score


def entry(sid: str, created: int, *, holder: Optional[str] = None, deadline: float = 0.0) -> QueueEntry:
    status: dict[str, Any] = {"phase": "pending", "session_status": "pending"}
    if holder:
        status = {"phase": "claimed", "acceptor_id": holder, "claim_deadline": deadline}
        status["session_status"] = "running"
    return QueueEntry.model_validate(
        {
            "metadata": {"session_id": sid, "outpost_id": "o", "created_at": created, "updated_at": created},
            "spec": {"kind": "new", "platform": "linux"},
            "status": status,
        }
    )


def feeds(names: list[str], *, spread: bool = True) -> list[QueueFeed]:
    return [QueueFeed(object(), "o", name, spread=spread) for name in names]  # type: ignore[arg-type]


def meet(all_feeds: list[QueueFeed], names: list[str]) -> None:
    """Every feed sees each of ``names`` claim something and give it back: they are idle peers now."""
    future = time.time() + 3600
    for number, name in enumerate(names):
        for feed in all_feeds:
            feed.upsert(entry(f"warmup-{number}", -1000 + number, holder=name, deadline=future))
            feed.remove(f"warmup-{number}")


def test_a_lone_worker_claims_strictly_oldest_first() -> None:
    (feed,) = feeds(["solo"])
    feed.replace_all([entry("c", 3), entry("a", 1), entry("b", 2)])
    taken = []
    while (choice := feed.next_claim(exclude=taken)) is not None:
        assert choice.wait == 0.0
        taken.append(choice.entry.session_id)
    assert taken == ["a", "b", "c"]
    assert feed.contenders() == ["solo"]


def test_each_row_has_exactly_one_owner_among_idle_peers() -> None:
    names = [f"worker-{n}" for n in range(6)]
    group = feeds(names)
    meet(group, names)
    rows = [entry(f"devin-{n:03d}", n) for n in range(12)]
    for feed in group:
        feed.replace_all(rows)
        assert sorted(feed.contenders()) == sorted(names)
    for row in rows:
        scores = {name: rendezvous_score(name, row.session_id) for name in names}
        owners = [name for name in names if scores[name] == max(scores.values())]
        assert len(owners) == 1
    # What each worker would claim right now: never the same row twice, and the oldest row is one of them.
    immediate = [c.entry.session_id for f in group if (c := f.next_claim()) is not None and c.wait == 0.0]
    assert len(immediate) == len(set(immediate))
    assert "devin-000" in immediate


def test_a_non_owner_waits_its_rank_then_claims() -> None:
    names = ["alpha", "beta"]
    group = feeds(names)
    meet(group, names)
    row = entry("devin-x", 1)
    for feed in group:
        feed.replace_all([row])
    choices = {feed.acceptor_id: feed.next_claim() for feed in group}
    waits = sorted(choice.wait for choice in choices.values() if choice is not None)
    assert waits[0] == 0.0
    assert SPREAD_STEP - 0.1 <= waits[1] <= SPREAD_STEP
    # The wait counts from when the row became claimable, not from each look at it.
    loser = next(f for f in group if (c := choices[f.acceptor_id]) is not None and c.wait > 0)
    time.sleep(SPREAD_STEP)
    later = loser.next_claim()
    assert later is not None and later.wait == 0.0


def test_the_longest_wait_is_bounded() -> None:
    names = [f"w{n:02d}" for n in range(20)]
    group = feeds(names)
    meet(group, names)
    row = entry("devin-y", 1)
    waits = []
    for feed in group:
        feed.replace_all([row])
        choice = feed.next_claim()
        assert choice is not None
        waits.append(choice.wait)
    assert waits.count(0.0) == 1
    assert max(waits) <= SPREAD_MAX_RANK * SPREAD_STEP


def test_busy_peers_are_not_contenders() -> None:
    names = ["me", "busy", "idle"]
    (feed,) = feeds(["me"])
    meet([feed], names[1:])
    assert sorted(feed.contenders()) == ["busy", "idle", "me"]
    feed.upsert(entry("held", 5, holder="busy", deadline=time.time() + 60))
    assert sorted(feed.contenders()) == ["idle", "me"]


@pytest.mark.parametrize("spread", [True, False])
def test_without_spreading_every_worker_goes_for_the_oldest(spread: bool) -> None:
    names = [f"w{n}" for n in range(8)]
    group = feeds(names, spread=spread)
    meet(group, names)
    rows = [entry(f"devin-{n}", n) for n in range(8)]
    first = set()
    for feed in group:
        feed.replace_all(rows)
        choice = feed.next_claim()
        assert choice is not None
        if choice.wait == 0.0:
            first.add(choice.entry.session_id)
    if spread:
        assert len(first) > 1
    else:
        assert first == {"devin-0"}


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_workers_falling_free_in_a_backlog_take_different_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every row has been claimable for a minute, longer than any rank's wait. Counted from the rows
    # alone, every worker falling free would go for the oldest at once (one claim wins, the rest 409).
    clock = FakeMonotonic()
    monkeypatch.setattr(time, "monotonic", clock)
    names = [f"worker-{n}" for n in range(6)]
    group = feeds(names)
    meet(group, names)
    for feed in group:
        feed.replace_all([entry(f"devin-{n:03d}", n) for n in range(40)])
    clock.now += 60.0
    choices = [feed.next_claim(looking_since=clock.now) for feed in group]
    immediate = [c.entry.session_id for c in choices if c is not None and c.wait == 0.0]
    assert len(immediate) == len(set(immediate))  # nobody sends a request that must lose
    assert len(immediate) >= len(names) - 1  # and (nearly) everyone claims at once
    assert "devin-000" in immediate  # the head's owner takes the head


def test_a_head_whose_owner_is_gone_is_claimed_by_the_next_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeMonotonic()
    monkeypatch.setattr(time, "monotonic", clock)
    names = [f"w{n:02d}" for n in range(8)]
    rows = [entry(f"devin-{n:03d}", n) for n in range(16)]
    head = rows[0].session_id
    ranked = sorted(names, key=lambda name: rendezvous_score(name, head), reverse=True)
    gone, runner_up = ranked[0], ranked[1]
    present = feeds([name for name in names if name != gone])
    meet(present, names)  # the gone owner is still remembered as an idle peer
    for feed in present:
        feed.replace_all(rows)
    clock.now += 60.0
    looking = clock.now
    first = {feed.acceptor_id: feed.next_claim(looking_since=looking) for feed in present}
    assert all(c is not None and c.entry.session_id != head for c in first.values() if c and c.wait == 0.0)
    clock.now += SPREAD_STEP
    then = {feed.acceptor_id: feed.next_claim(looking_since=looking) for feed in present}
    takers = [
        name for name, c in then.items() if c is not None and c.wait == 0.0 and c.entry.session_id == head
    ]
    assert takers == [runner_up]
    clock.now += SPREAD_MAX_RANK * SPREAD_STEP
    late = [feed.next_claim(looking_since=looking) for feed in present]
    assert all(c is not None and c.wait == 0.0 and c.entry.session_id == head for c in late)


def test_after_a_409_with_no_idle_peer_known_the_next_row_is_scattered() -> None:
    # A fleet that starts together: nobody has seen anybody claim, so every worker takes itself for alone.
    rows = [entry(f"devin-{n:03d}", n) for n in range(100)]
    (feed,) = feeds(["fresh"])
    (strict,) = feeds(["strict"], spread=False)
    for each in (feed, strict):
        each.replace_all(rows)
    first = feed.next_claim()
    assert first is not None and first.entry.session_id == "devin-000"  # no 409 yet: oldest first
    picks = {n: set() for n in (1, 2, 3, 6)}
    for conflicts, seen in picks.items():
        for _attempt in range(200):
            choice = feed.next_claim(exclude=["devin-000"], conflicts=conflicts)
            assert choice is not None and choice.wait == 0.0
            seen.add(int(choice.entry.session_id.split("-")[1]))
    assert max(picks[1]) <= 8 and len(picks[1]) > 4  # among the oldest 8 (devin-000 excluded)
    assert max(picks[2]) <= 16 and max(picks[3]) <= 32
    assert max(picks[6]) <= 64 and len(picks[6]) > 32  # never wider than SCATTER_MAX
    choice = strict.next_claim(exclude=["devin-000"], conflicts=3)
    assert choice is not None and choice.entry.session_id == "devin-001"  # the baseline stays strict
