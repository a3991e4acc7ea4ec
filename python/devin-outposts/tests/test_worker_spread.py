"""Spreading the claims: a matching of the oldest rows to the idle workers of an outpost (core/spread.py).

Several feeds that see the same queue must agree on who claims which row, without talking to each
other: the same view gives disjoint picks, a lone worker claims strictly oldest first, busy peers are not
contenders, the head is claimed within a bounded wait, and a crowd that lost a race scatters.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import pytest

from devin_outposts.api.models import QueueEntry
from devin_outposts.core.feed import QueueFeed
from devin_outposts.core.spread import (
    CROWD_MAX,
    CROWD_WINDOW_CAP,
    ECHO_WAIT,
    FIRST_CLAIM_JITTER,
    SPREAD_MAX_RANK,
    SPREAD_STEP,
    contender_order,
    crowd_window,
)


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
        # Having seen nobody, it may be one of a fleet that started together: its first claim waits a
        # random moment (once), but the order is exact.
        assert choice.wait <= FIRST_CLAIM_JITTER
        taken.append(choice.entry.session_id)
    assert taken == ["a", "b", "c"]
    assert feed.contenders() == ["solo"]
    feed.upsert(entry("a", 1, holder="solo", deadline=time.time() + 600))  # its claim, on the watch
    choice = feed.next_claim(exclude=["a"])
    assert choice is not None and choice.entry.session_id == "b" and choice.wait == 0.0


def immediate_picks(group: list[QueueFeed], **kwargs: Any) -> list[str]:
    """What each worker would claim right now (not what it would wait for)."""
    return [c.entry.session_id for f in group if (c := f.next_claim(**kwargs)) is not None and c.wait == 0.0]


def test_the_same_view_gives_disjoint_picks_of_the_oldest_rows() -> None:
    names = [f"worker-{n}" for n in range(6)]
    group = feeds(names)
    meet(group, names)
    rows = [entry(f"devin-{n:03d}", n) for n in range(12)]
    for feed in group:
        feed.replace_all(rows)
        assert sorted(feed.contenders()) == sorted(names)
    picks = immediate_picks(group)
    # Every idle worker claims at once, no two the same row, and together the oldest six: the matching.
    assert sorted(picks) == [f"devin-{n:03d}" for n in range(6)]


def test_more_workers_than_rows_one_claim_per_row() -> None:
    names = [f"w{n:02d}" for n in range(20)]
    group = feeds(names)
    meet(group, names)
    rows = [entry("devin-a", 1), entry("devin-b", 2), entry("devin-c", 3)]
    for feed in group:
        feed.replace_all(rows)
    assert sorted(immediate_picks(group)) == ["devin-a", "devin-b", "devin-c"]
    waits = [c.wait for f in group if (c := f.next_claim()) is not None]
    # The others wait for the head, bounded: the first places a step each, the rest in the crowd's window.
    assert max(waits) <= SPREAD_MAX_RANK * SPREAD_STEP + crowd_window(CROWD_MAX, 0, 1)


def test_a_matched_claim_leaves_the_other_pairs_alone() -> None:
    # Workers whose views lag by one event must still agree: a contender that claims its own row takes
    # itself and that row out of the matching together, so every other pair stays as it was.
    names = [f"worker-{n}" for n in range(5)]
    group = feeds(names)
    meet(group, names)
    rows = [entry(f"devin-{n:03d}", n) for n in range(8)]
    for feed in group:
        feed.replace_all(rows)
    before = {f.acceptor_id: f.next_claim() for f in group}
    first = next(name for name, c in before.items() if c is not None and c.entry.session_id == "devin-000")
    claimed = entry("devin-000", 0, holder=first, deadline=time.time() + 600)
    for feed in group:
        feed.upsert(claimed)
    for feed in group:
        if feed.acceptor_id != first:
            now, then = feed.next_claim(), before[feed.acceptor_id]
            assert now is not None and then is not None and now.entry.session_id == then.entry.session_id


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


def test_the_strict_baseline_stays_strict_for_a_worker_nobody_has_seen() -> None:
    (strict,) = feeds(["strict"], spread=False)
    meet([strict], ["p1", "p2"])  # it has seen others claim; they have never seen it
    strict.upsert(entry("held", 0, holder="p1", deadline=time.time() + 600))
    strict.replace_all([entry(f"devin-{n}", n) for n in range(50)])
    picks = {c.entry.session_id for dummy in range(20) if (c := strict.next_claim()) is not None}
    assert picks == {"devin-0"}


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_workers_falling_free_in_a_backlog_take_different_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every row has been claimable for a minute: each idle worker still has a row of its own at once.
    clock = FakeMonotonic()
    monkeypatch.setattr(time, "monotonic", clock)
    names = [f"worker-{n}" for n in range(6)]
    group = feeds(names)
    meet(group, names)
    for feed in group:
        feed.replace_all([entry(f"devin-{n:03d}", n) for n in range(40)])
    clock.now += 60.0
    immediate = immediate_picks(group, looking_since=clock.now)
    assert len(immediate) == len(set(immediate)) == len(names)  # nobody sends a request that must lose
    assert "devin-000" in immediate  # the head's contender takes the head


def test_fairness_bound_on_the_head_whose_contender_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeMonotonic()
    monkeypatch.setattr(time, "monotonic", clock)
    names = [f"w{n:02d}" for n in range(8)]
    ranked = sorted(names, key=lambda name: contender_order(name, "o"))
    gone, runner_up = ranked[0], ranked[1]
    present = feeds([name for name in names if name != gone])
    meet(present, names)  # the gone contender is still remembered as an idle peer
    head = entry("devin-head", 0)
    for feed in present:
        feed.replace_all([head])  # one row, matched to the gone worker
    assert immediate_picks(present) == []
    clock.now += SPREAD_STEP
    assert immediate_picks(present) == ["devin-head"]  # the next in order, one step later
    assert [f.acceptor_id for f in present if (c := f.next_claim()) is not None and c.wait == 0.0] == [
        runner_up
    ]
    clock.now += SPREAD_MAX_RANK * SPREAD_STEP
    assert len(immediate_picks(present)) == len(present)  # the bound: everyone may take it by now


def test_a_worker_the_others_do_not_count_takes_a_row_beyond_the_matched_ones() -> None:
    names = ["a1", "a2", "a3"]
    insiders = feeds(names)
    meet(insiders, names)
    (newcomer,) = feeds(["new"])
    meet([newcomer], names)  # it has seen them; they have never seen it claim
    rows = [entry(f"devin-{n:03d}", n) for n in range(6)]
    for feed in [*insiders, newcomer]:
        feed.replace_all(rows)
    assert not newcomer.known_to_peers
    choice = newcomer.next_claim()
    # A row beyond the three matched ones, once the matched ones have had the head's steps, at its moment
    # in the crowd's window (shared out over the 3 spare rows).
    window = crowd_window(CROWD_MAX, 0, 3)  # idle contenders in view: the widest window
    assert (
        choice is not None
        and SPREAD_MAX_RANK * SPREAD_STEP <= choice.wait <= SPREAD_MAX_RANK * SPREAD_STEP + window
    )
    assert choice.entry.session_id in {f"devin-{n:03d}" for n in range(3, 6)}
    assert sorted(immediate_picks(insiders)) == ["devin-000", "devin-001", "devin-002"]


def test_a_peer_that_gives_a_row_back_is_an_idle_contender_at_once() -> None:
    (feed,) = feeds(["me"])
    feed.upsert(entry("s1", 1, holder="peer", deadline=time.time() + 600))
    assert feed.contenders() == ["me"]  # busy
    feed.upsert(entry("s1", 1))  # released: pending again
    assert sorted(feed.contenders()) == ["me", "peer"]


def test_after_a_409_the_crowd_spreads_over_the_spare_rows() -> None:
    # A fleet that starts together: nobody has seen anybody claim, so every worker takes itself for alone
    # and goes for the oldest row; the losers must not race again for one row.
    rows = [entry(f"devin-{n:03d}", n) for n in range(100)]
    (strict,) = feeds(["strict"], spread=False)
    strict.replace_all(rows)
    crowd = feeds([f"fresh-{n}" for n in range(40)])
    for feed in crowd:
        feed.replace_all(rows)
        first = feed.next_claim()
        assert first is not None and first.entry.session_id == "devin-000"
        assert first.wait <= FIRST_CLAIM_JITTER
        feed.lost_race("devin-000", 5.0)
    choices = [c for f in crowd if (c := f.next_claim()) is not None]
    assert len(choices) == len(crowd)
    picked = {c.entry.session_id for c in choices}
    assert "devin-000" not in picked and len(picked) > 25  # 40 workers over 99 spare rows
    assert all(0.0 <= c.wait <= crowd_window(1, 1, 99) for c in choices)
    again = crowd[0].next_claim()  # the choice is a hash of worker and row: asking again keeps it
    assert again is not None and again.entry.session_id == choices[0].entry.session_id
    assert again.wait <= choices[0].wait
    choice = strict.next_claim(exclude=["devin-000"], conflicts=3)
    assert choice is not None and choice.entry.session_id == "devin-001"  # the baseline stays strict


def test_the_crowd_window_grows_with_the_crowd_and_each_409() -> None:
    assert crowd_window(100, 0, 1) == pytest.approx(10 * crowd_window(10, 0, 1))
    assert crowd_window(10, 1, 1) == pytest.approx(2 * crowd_window(10, 0, 1))
    assert crowd_window(100, 0, 10) == pytest.approx(crowd_window(10, 0, 1))  # shared out over the rows
    assert crowd_window(1000, 30, 1) == CROWD_WINDOW_CAP


def test_a_crowd_that_others_do_not_count_claims_a_new_row_one_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A hundred workers, each of which has seen the ninety-nine others claim but not its own claim (each
    # is one the others do not count, as far as it can tell): one new row. They used to claim it all at
    # once when the head's last step ran out; now each has its own moment in the crowd's window.
    clock = FakeMonotonic()
    monkeypatch.setattr(time, "monotonic", clock)
    names = [f"crowd-{n:03d}" for n in range(100)]
    group = feeds(names)
    for feed in group:
        meet([feed], [name for name in names if name != feed.acceptor_id])
    for feed in group:
        feed.replace_all([entry("devin-new", 1)])
        assert not feed.known_to_peers
    waits = sorted(c.wait for f in group if (c := f.next_claim()) is not None)
    assert len(waits) == len(group) and waits[0] >= SPREAD_MAX_RANK * SPREAD_STEP
    assert waits[-1] - waits[0] > 5.0  # spread over the crowd's window (the widest: idle peers in view)
    first = waits[0]
    assert sum(1 for wait in waits if wait - first < 0.1) <= 3  # not a storm: a few within a round trip


def test_a_claim_of_ours_on_the_watch_ends_the_streak() -> None:
    (feed,) = feeds(["me"])
    feed.replace_all([entry("a", 1), entry("b", 2)])
    feed.lost_race("a", 5.0)
    assert feed.streak() == 1
    feed.upsert(entry("b", 2, holder="me", deadline=time.time() + 600))
    assert feed.streak() == 0 and feed.known_to_peers


def test_a_worker_waits_for_the_watch_to_show_its_claim_given_back() -> None:
    # Its slot is free, but the others still see its last claim: they do not count it idle yet, and
    # one of them would pick the row matched to it. It waits for the echo (bounded), then claims.
    names = ["p1", "p2", "me"]
    (feed,) = feeds(["me"])
    meet([feed], names)
    rows = [entry(f"next-{n}", n + 1) for n in range(3)]
    feed.replace_all([entry("done", 0, holder="me", deadline=time.time() + 600), *rows])
    choice = feed.next_claim(looking_since=time.monotonic())
    assert choice is not None and 0.0 < choice.wait <= ECHO_WAIT
    feed.remove("done")  # given back and gone, on the watch
    choice = feed.next_claim(looking_since=time.monotonic())
    assert choice is not None and choice.wait == 0.0


def test_the_crowd_estimate_follows_whom_the_claims_come_from() -> None:
    # Every claim by an acceptor never seen before: a big fleet, mostly out of sight.
    (big,) = feeds(["me"])
    future = time.time() + 600
    for number in range(20):
        big.upsert(entry(f"s{number}", number, holder=f"newcomer-{number}", deadline=future))
    assert big.spreader.crowd() > 10 * 21  # far more than the 21 acceptors it has seen
    # Three workers whose claims keep coming from the same two peers: it stays near its size.
    (small,) = feeds(["me"])
    for number in range(20):
        small.upsert(entry(f"s{number}", number, holder=f"peer-{number % 2}", deadline=future))
        small.remove(f"s{number}")
    assert 3 <= small.spreader.crowd() <= 4
    # A renewal is not a claim: the same copy with a later deadline teaches nothing.
    before = big.spreader.crowd()
    big.upsert(entry("s0", 0, holder="newcomer-0", deadline=future + 60))
    assert big.spreader.crowd() == before


def test_a_fleet_size_from_the_deployment_spreads_the_first_claims_of_a_fleet_that_starts_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 200 workers that have seen nobody, one new row. Without a word on the fleet's size each takes it
    # as if alone (the oldest row, within the first-claim jitter); told the size, each has its moment in
    # the window of that many workers, so the first claims come one at a time.
    clock = FakeMonotonic()
    monkeypatch.setattr(time, "monotonic", clock)
    names = [f"fleet-{n:03d}" for n in range(200)]
    unaware = feeds(names)
    hinted = [QueueFeed(object(), "o", name, spread=True, fleet_size=200) for name in names]  # type: ignore[arg-type]
    for feed in (*unaware, *hinted):
        feed.replace_all([entry("devin-first", 1)])
    plain = [c for f in unaware if (c := f.next_claim()) is not None]
    assert {c.why for c in plain} == {"oldest"} and max(c.wait for c in plain) <= FIRST_CLAIM_JITTER
    told = [c for f in hinted if (c := f.next_claim()) is not None]
    assert {c.why for c in told} == {"spare"}
    waits = sorted(c.wait for c in told)
    assert waits[-1] - waits[0] > 10 * FIRST_CLAIM_JITTER  # spread over the window of 200 workers
    assert sum(1 for wait in waits if wait - waits[0] < 0.1) <= 3  # a few within a round trip, not 200
    assert all(f.spreader.crowd() >= 200 for f in hinted)


def test_the_fleet_size_counts_only_until_the_workers_own_claim_shows() -> None:
    feed = QueueFeed(object(), "o", "me", spread=True, fleet_size=500)  # type: ignore[arg-type]
    assert feed.spreader.crowd() == 500
    feed.replace_all([entry("a", 1), entry("b", 2)])
    feed.upsert(entry("a", 1, holder="me", deadline=time.time() + 600))  # its first claim, on the watch
    assert feed.spreader.crowd() < 500  # the claims seen decide from now on
    choice = feed.next_claim(exclude=["a"])  # still nobody else seen: strictly the oldest, at once
    assert choice is not None and (choice.entry.session_id, choice.wait, choice.why) == ("b", 0.0, "oldest")
