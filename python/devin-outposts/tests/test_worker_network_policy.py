"""The worker enforces each session's network policy, end to end: a real ``devin-outposts worker start``, the
simulator's real stand-in ``devin-remote`` and a brain's commands that try every way out of the session.

Upstreams on the host's loopback record every byte they get; the simulator's claim history, call results,
the worker's log and its ``/metrics`` say what the worker did. Nothing leaves this machine: the addresses a
session tries beyond the loopback are TEST-NET ones (192.0.2.0/24), which the sandbox sends to the egress
proxy, and the proxy refuses.

Needs what the sandbox needs (root here, as in CI; util-linux, iproute2, nftables): skipped without it,
failed in CI.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netpolicy_harness import (
    LOOPBACK_POLICY,
    WHY_NOT,
    Upstream,
    assert_confined,
    cannot_run,
    client_calls_in_a_machine,
    confinement_plan,
)
from standin_harness import SESSION_PYTHON, Harness, running_harness
from worker_fakes import metrics_from_log


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    with running_harness(tmp_path) as h:
        yield h


@pytest.fixture
def upstreams() -> Any:
    allowed, denied = Upstream("allowed"), Upstream("denied", host="127.0.0.2")
    try:
        yield allowed, denied
    finally:
        allowed.close()
        denied.close()


@pytest.fixture
def confinable() -> None:
    if WHY_NOT:
        cannot_run(f"sessions cannot be confined here: {WHY_NOT}")


def client_output(harness: Harness, session_id: str, plan: list[list[Any]]) -> str:
    """Run the session client with ``plan`` as the session's command (written into its working directory:
    a confined session sees no path of this checkout's under /tmp); its output."""
    harness.sim.admin.add_calls(session_id, client_calls_in_a_machine(plan, SESSION_PYTHON))
    call = harness.calls_done(session_id)[-1]
    assert call["result"]["exit_code"] == 0, call
    return str(call["result"]["output"])


def attempts(harness: Harness, session_id: str, plan: list[list[Any]]) -> list[dict[str, Any]]:
    """The session client's JSON lines for ``plan``."""
    output = client_output(harness, session_id, plan)
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def end(harness: Harness, session_id: str) -> None:
    harness.sim.admin.set_status(session_id, "terminated")
    harness.wait(lambda: harness.released(session_id), f"{session_id} to be released")


def test_a_session_reaches_what_its_policy_allows_and_nothing_else(
    confinable: None, harness: Harness, upstreams: tuple[Upstream, Upstream]
) -> None:
    allowed, denied = upstreams
    h = harness
    h.worker("w1", "--metrics-addr", "127.0.0.1:0")
    policy = {**LOOPBACK_POLICY, "allow": [*LOOPBACK_POLICY["allow"], {"hostname": "*.allowed.test"}]}
    sid = h.sim.admin.enqueue(h.outpost.outpost_id, network_policy=policy).session_id
    output = client_output(h, sid, confinement_plan(allowed, denied))
    assert_confined(output, allowed, denied)
    # Counted per session and verdict while it runs: the denials above (the direct connect to TEST-NET
    # reaches the proxy through the redirect), and what was allowed (the upstream, the gateway).
    text = metrics_from_log(h.workers[0].log())
    series = rf'^devin_outposts_worker_egress_connections_total\{{[^}}]*session="{sid}"'
    counts = {
        verdict: int(value)
        for verdict, value in re.findall(series + r'[^}]*verdict="(\w+)"[^}]*\} (\d+)$', text, re.M)
    }
    assert counts.get("denied", 0) >= 3 and counts.get("allowed", 0) >= 2, text
    # The session reached its gateway (it ran the command), and ends cleanly; its series go with it.
    end(h, sid)
    log = h.workers[0].log()
    assert f"session {sid}" in log and "denied 127.0.0.2:" in log and "denied denied.example:443" in log, log
    assert f'session="{sid}"' not in metrics_from_log(log)


def test_a_session_without_a_policy_is_not_confined(
    confinable: None, harness: Harness, upstreams: tuple[Upstream, Upstream]
) -> None:
    allowed, dummy_denied = upstreams
    h = harness
    h.worker("w1")
    sid = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
    [result] = attempts(h, sid, [["direct", "127.0.0.1", allowed.port]])
    assert result["reply"].startswith("allowed:GET /direct"), result
    assert len(allowed.received) == 1
    end(h, sid)


def test_a_worker_that_cannot_confine_releases_policy_sessions_and_serves_the_others(
    harness: Harness,
) -> None:
    """A worker on a host whose user namespaces are disabled (here: run in a user namespace whose own
    ``user.max_user_namespaces`` is 0) cannot confine sessions: it releases a session whose policy is
    enabled, with one line that names the setting and a count, and serves one without a policy."""
    h = harness
    no_namespaces = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"'
    prefix = ("unshare", "--user", "--map-root-user", "sh", "-c", no_namespaces, "sh")
    worker = h.worker("w1", "--metrics-addr", "127.0.0.1:0", prefix=prefix)
    policy = {"enabled": True, "allow": [{"hostname": "github.com"}]}
    refused = h.sim.admin.enqueue(h.outpost.outpost_id, network_policy=policy).session_id
    h.wait(lambda: h.released(refused), f"{refused} to be released")
    assert not h.sim.admin.connections(refused), "the refused session's remote must never start"
    served = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
    h.connection(served)
    end(h, served)
    log = worker.log()
    lines = [line for line in log.splitlines() if "cannot enforce it" in line]
    assert len(lines) == 1 and refused in lines[0], log
    assert "user namespaces are disabled (user.max_user_namespaces = 0)" in lines[0], log
    text = metrics_from_log(log)
    assert re.search(r"^devin_outposts_worker_network_policy_refusals_total(\{[^}]*\})? 1$", text, re.M), text


def test_with_network_policy_ignore_a_policy_session_runs_unfiltered_with_a_warning(
    harness: Harness, upstreams: tuple[Upstream, Upstream]
) -> None:
    allowed, dummy_denied = upstreams
    h = harness
    worker = h.worker("w1", "--network-policy", "ignore")
    policy = {"enabled": True, "allow": []}
    sid = h.sim.admin.enqueue(h.outpost.outpost_id, network_policy=policy).session_id
    [result] = attempts(h, sid, [["direct", "127.0.0.1", allowed.port]])
    assert result["reply"].startswith("allowed:GET /direct"), result
    end(h, sid)
    assert f"session {sid}: its network policy is NOT enforced" in worker.log()
