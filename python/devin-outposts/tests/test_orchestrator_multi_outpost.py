"""Several outposts in one orchestrator process (docs/orchestrator.md, "Several outposts").

Two outposts served by one in-process orchestrator with a scripted driver (every worker runs at once),
against the in-process simulator: each outpost's cap and the process's ``--max-concurrent`` are checked on
the simulator's own view of the queue (the rows it holds claimed, per outpost) and on ``/metrics``
samples, a restart takes both outposts' sessions back with their machines, and the options read lists
of outposts with their caps. The shared cap itself is checked on two session pools directly.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import httpx
import pytest
from orchestrator_fakes import Running, ScriptedDriver, orchestrators

from devin_outposts.api.models import Outpost, Phase, QueueEntry
from devin_outposts.core.config import ConfigError, MetricsAddr
from devin_outposts.core.metrics import Metrics
from devin_outposts.core.pool import SessionPool, SharedCap
from devin_outposts.orchestrator.drivers.base import WorkerState, WorkerStatus
from devin_outposts.orchestrator.metrics import OutpostsMetrics, outpost_metrics
from devin_outposts.orchestrator.options import OrchestratorConfig, OutpostSpec, parse_args, parse_outposts
from devin_outposts.orchestrator.runner import Orchestrator
from devin_outposts_sim.remote import tools
from devin_outposts_sim.testing import SimHandle, run_sim

from worker_fakes import WorkerProcess, kill_pids_working_under, pids_working_under, wait_for

CAPS = {"alpha": 2, "beta": 3}
PROCESS_CAP = 4
PER_OUTPOST = 10
TOKEN_ENV = {"DEVIN_OUTPOSTS_TOKEN": "tok"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def outposts(sim: SimHandle) -> dict[str, Outpost]:
    return {name: sim.admin.create_outpost(name, "linux") for name in CAPS}


@pytest.fixture
def start(sim: SimHandle, tmp_path: Path) -> Iterator[Callable[..., Running]]:
    caps = ",".join(f"{name}={cap}" for name, cap in CAPS.items())
    with orchestrators(
        sim, tmp_path / "state", outpost=caps, max_concurrent=PROCESS_CAP, acceptor_id="orch-multi"
    ) as run:
        yield run


def running_worker() -> ScriptedDriver:
    return ScriptedDriver(lambda sid, starts: WorkerStatus(WorkerState.RUNNING))


def claimed(sim: SimHandle, outpost: Outpost) -> set[str]:
    """The sessions the simulator holds claimed on ``outpost`` now."""
    entries = [
        QueueEntry.model_validate(row["entry"]) for row in sim.admin.sessions(outpost_id=outpost.outpost_id)
    ]
    return {entry.session_id for entry in entries if entry.status.phase == Phase.CLAIMED}


def scrape(port: int) -> Optional[str]:
    try:
        reply = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
    except httpx.HTTPError:
        return None
    return reply.text if reply.status_code == 200 else None


def samples(metrics: str, name: str) -> dict[str, float]:
    """Each outpost's value of ``name`` on a /metrics page, by its ``outpost`` label."""
    found: dict[str, float] = {}
    for line in metrics.splitlines():
        match = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            found[labels["outpost"]] = float(match.group(2))
    return found


def test_two_outposts_are_served_by_one_process_each_within_its_own_cap(
    sim: SimHandle, outposts: dict[str, Outpost], start: Callable[..., Running]
) -> None:
    """Caps 2 and 3 under a process cap of 4, ten sessions queued on each: the orchestrator fills up to
    the caps, never past them (every sample of the simulator's queue and of /metrics), and both queues
    drain; the metrics carry each outpost's label, and /healthz lists each outpost."""
    port = free_port()
    driver = running_worker()
    orch = start(driver, metrics_addr=MetricsAddr("127.0.0.1", port))
    ended: set[str] = set()

    def within_caps() -> dict[str, set[str]]:
        """The sessions claimed now, by outpost, after checking every cap on them and on /metrics."""
        now = {name: claimed(sim, outpost) - ended for name, outpost in outposts.items()}
        for name, sessions in now.items():
            assert len(sessions) <= CAPS[name], (name, sorted(sessions))
        assert sum(len(sessions) for sessions in now.values()) <= PROCESS_CAP, now
        page = scrape(port)
        if page is not None:
            workers = samples(page, "outposts_active_workers")
            for name, value in workers.items():
                assert value <= CAPS[name], (name, value)
            assert sum(workers.values()) <= PROCESS_CAP, workers
        return now

    def filled(target: int) -> Optional[dict[str, set[str]]]:
        now = within_caps()
        return now if sum(len(sessions) for sessions in now.values()) >= target else None

    def serve(counts: dict[str, int]) -> list[dict[str, set[str]]]:
        """Queue ``counts`` sessions on each outpost and end them as they are claimed, each time the
        orchestrator has filled what the caps allow of those still queued. Every round's claims."""
        queued = {
            name: [sim.admin.enqueue(outposts[name].outpost_id).session_id for dummy in range(n)]
            for name, n in counts.items()
        }
        rounds = []
        while any(sid not in ended for sids in queued.values() for sid in sids):
            left = {name: len([sid for sid in sids if sid not in ended]) for name, sids in queued.items()}
            target = min(PROCESS_CAP, sum(min(CAPS[name], n) for name, n in left.items()))
            now = wait_for(
                lambda target=target: filled(target), timeout=30, what=f"{target} sessions claimed"
            )
            rounds.append(now)
            for sid in set().union(*now.values()):
                sim.admin.end_session(sid, "terminated")
                ended.add(sid)
        for name, sids in queued.items():
            for sid in sids:
                wait_for(
                    lambda sid=sid: any(r["action"] == "release" for r in sim.admin.claims(session_id=sid)),
                    timeout=30,
                    what=f"the release of {sid}",
                )
                claims = [r for r in sim.admin.claims(session_id=sid) if r["action"] == "claim"]
                assert [(r["acceptor_id"], r["outpost_id"]) for r in claims] == [
                    ("orch-multi", outposts[name].outpost_id)
                ], sid
        return rounds

    # Both queues full: the process's cap binds (4 of the 5 the outposts' caps would allow).
    both = serve(dict.fromkeys(CAPS, PER_OUTPOST))
    assert sum(len(s) for s in both[0].values()) == PROCESS_CAP
    # One queue alone: its own cap binds, below the process's.
    for name in CAPS:
        alone = serve({name: 5})
        assert len(alone[0][name]) == CAPS[name]
    page = wait_for(lambda: scrape(port), what="/metrics")
    claimed_total = samples(page, "outposts_sessions_claimed_total")
    assert claimed_total == {name: float(PER_OUTPOST + 5) for name in CAPS}
    assert f'pool_id="{outposts["alpha"].outpost_id}"' in page
    assert page.count("# TYPE outposts_sessions_claimed_total counter") == 1  # one family, two series
    health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    assert (health.status_code, health.json()) == (
        200,
        {"status": "ok", "outposts": {"alpha": {"status": "ok"}, "beta": {"status": "ok"}}},
    )
    assert orch.thread.is_alive()


def test_a_restart_takes_back_both_outposts_sessions_with_their_machines(
    sim: SimHandle, outposts: dict[str, Outpost], start: Callable[..., Running]
) -> None:
    driver = running_worker()
    first = start(driver)
    sessions = {
        name: [sim.admin.enqueue(o.outpost_id).session_id for dummy in range(2)]
        for name, o in outposts.items()
    }
    every = [sid for sids in sessions.values() for sid in sids]
    wait_for(lambda: all(driver.starts(sid) == 1 for sid in every), timeout=30, what="four workers started")
    for sid in every:
        sim.admin.set_status(sid, "running")  # served (what a worker's devin-remote would report)
    first.stop()  # a stop detaches: machines and claims stay for the next start
    assert sorted(driver.machines) == sorted(every)
    second = start(driver).orchestrator
    # Each outpost's recovery re-claims its two sessions (a take-back counts as a claim).
    wait_for(
        lambda: [o.metrics.counters["sessions_claimed"] for o in second.outposts] == [2, 2],
        timeout=30,
        what="every session taken back",
    )
    for name, sids in sessions.items():
        assert claimed(sim, outposts[name]) == set(sids)
    for sid in every:
        assert driver.starts(sid) == 1, sid  # adopted as it was: its worker never started again
        assert not any(r["action"] == "release" for r in sim.admin.claims(session_id=sid)), sid
    assert driver.torn_down == []
    for sid in every:
        sim.admin.end_session(sid, "terminated")
    wait_for(lambda: sorted(driver.torn_down) == sorted(every), timeout=30, what="every machine torn down")


def test_one_kubernetes_orchestrator_serves_both_outposts_under_one_lease(
    sim: SimHandle, outposts: dict[str, Outpost], tmp_path: Path
) -> None:
    """The kubernetes driver, against the fake API server: both outposts' sessions get pods annotated with
    their own outpost, made by the one acceptor id that holds the one Lease."""
    pytest.importorskip("lightkube", reason="the kubernetes extra (lightkube) is not installed")
    from k8s_fake import run_fake_kube  # it needs lightkube

    from devin_outposts.orchestrator.drivers.kubernetes.manifests import (
        ANNOTATION_ACCEPTOR,
        ANNOTATION_OUTPOST,
    )

    namespace = "outposts"
    with run_fake_kube() as fake:
        kubeconfig = fake.kubeconfig(tmp_path / "kubeconfig", namespace=namespace)
        config = OrchestratorConfig(
            outpost="alpha=1 beta=1", driver="kubernetes", max_concurrent=PROCESS_CAP,
            state_dir=tmp_path / "k8s", acceptor_id="k8s-multi", api_url=sim.url,
            token=sim.create_token("orchestrator"), status_interval=0.05, poll_interval=0.2,
            confirm_interval=0.05, confirm_reads=2, gc_interval=0.3, backoff_max=1.0,
            driver_options={"kubeconfig": str(kubeconfig), "namespace": namespace,
                            "image": "registry.example/w:1", "lease_duration": 1.5,
                            "lease_renew_interval": 0.3},
        )  # fmt: skip
        running = Running(Orchestrator(config))
        try:
            for outpost in outposts.values():
                for dummy in range(2):
                    sim.admin.enqueue(outpost.outpost_id)

            def two_pods() -> Optional[list[dict[str, Any]]]:
                pods = [
                    p for p in fake.objects("Pod", namespace) if not p["metadata"].get("deletionTimestamp")
                ]
                return pods if len(pods) == 2 else None

            pods = wait_for(two_pods, timeout=30, what="two pods")
            annotations = [pod["metadata"]["annotations"] for pod in pods]
            assert sorted(a[ANNOTATION_OUTPOST] for a in annotations) == sorted(
                o.outpost_id for o in outposts.values()
            )
            assert {a[ANNOTATION_ACCEPTOR] for a in annotations} == {"k8s-multi"}
            [lease] = fake.objects("Lease", namespace)
            assert lease["spec"]["holderIdentity"]
            # Each outpost's own cap of 1: the second session of each stays queued.
            for outpost in outposts.values():
                assert len(claimed(sim, outpost)) == 1
        finally:
            running.stop()


def test_for_real_a_restart_after_kill_9_adopts_both_outposts_machines(tmp_path: Path) -> None:
    """``orchestrate --driver process`` with ``--outpost`` given twice: a session of each outpost is served
    by a worker it started; after ``kill -9`` the next orchestrator adopts both machines (no session is
    served twice: one gateway connection each) and both still serve a tool call."""
    with run_sim(claim_ttl=20, watch_max_duration=5, keepalive_interval=0.5, sweep_interval=0.05) as sim:
        outposts = [sim.admin.create_outpost(name, "linux") for name in CAPS]
        sim.admin.publish_standin_variant("orchestrated", python=sys.executable, latest=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVIN_", "PYTEST_"))}
        env.update(
            DEVIN_OUTPOSTS_TOKEN=sim.create_token("orchestrator"), DEVIN_API_URL=sim.url, LANG="C.UTF-8"
        )
        args = [
            "--outpost", "alpha=1", "--outpost", "beta=1", "--driver", "process", "--max-concurrent", "2",
            "--state-dir", str(tmp_path / "state"), "--acceptor-id", "orch-multi-real",
            "--static-base-url", sim.static_base_url, "--poll-interval-secs", "0.5",
            "--status-interval-secs", "0.2", "--confirm-interval-secs", "0.2", "--gc-interval", "1",
            "--backoff-max-secs", "2",
            "--stop-grace-secs", "5", "--driver-opt", "stop_grace=5",
        ]  # fmt: skip
        processes = [
            WorkerProcess(args, env, tmp_path / f"{name}.log", command=("orchestrate",)) for name in "ab"
        ]
        try:
            processes[0].start()
            sessions = [sim.admin.enqueue(outpost.outpost_id).session_id for outpost in outposts]
            wait_for(lambda: all(sim.admin.connections(s) for s in sessions), timeout=60, what="both served")
            processes[0].kill9()
            machines = tmp_path / "state" / "process" / "machines"
            assert len([p for p in machines.iterdir() if p.is_dir()]) == 2  # they outlive their orchestrator
            processes[1].start()
            wait_for(
                lambda: processes[1].log().count("adopting machine") == 2, timeout=60, what="two adoptions"
            )
            for sid in sessions:
                sim.admin.add_calls(sid, [tools.run(f"echo {sid}")])
            for sid in sessions:
                [call] = sim.admin.wait_calls(sid, timeout=60)
                assert call["result"]["output"] == f"{sid}\n"
                assert len(sim.admin.connections(sid)) == 1, sid  # the first worker kept serving
                sim.admin.end_session(sid, "terminated")
            wait_for(
                lambda: all(
                    any(r["action"] == "release" for r in sim.admin.claims(session_id=s)) for s in sessions
                ),
                timeout=60,
                what="both released",
            )
            wait_for(
                lambda: not [p for p in machines.iterdir() if p.is_dir()], timeout=30, what="machines gone"
            )
        finally:
            for process in processes:
                process.stop()
            if kill_pids_working_under(tmp_path):  # machines a failed test left detached
                time.sleep(0.2)
    assert not pids_working_under(tmp_path)


# --- the shared cap ----------------------------------------------------------------------------------------


def test_pools_under_a_shared_cap_offer_a_slot_only_while_both_caps_have_room() -> None:
    cap = SharedCap(3)
    alpha = SessionPool(2, Metrics(), drain_timeout=1, shared=cap)
    beta = SessionPool(3, Metrics(), drain_timeout=1, shared=cap)
    with alpha.reserving(), alpha.reserving():
        assert beta.free_slot() == 0  # 2 of 3 taken by alpha's claims in flight
        with beta.reserving():
            assert (alpha.free_slot(), beta.free_slot(), cap.in_use()) == (None, None, 3)
        assert beta.free_slot() == 0
    assert (alpha.free_slot(), beta.free_slot(), cap.in_use()) == (0, 0, 0)


def test_one_metrics_page_holds_each_family_once_with_every_outposts_samples() -> None:
    alpha, beta = outpost_metrics("alpha"), outpost_metrics("beta")
    alpha.inc("sessions_claimed", 2)
    beta.observe("session_start_seconds", 3.0)
    page = OutpostsMetrics([alpha, beta]).render()
    assert page.count("# HELP outposts_sessions_claimed_total ") == 1
    assert 'outposts_sessions_claimed_total{outpost="alpha"} 2' in page
    assert 'outposts_sessions_claimed_total{outpost="beta"} 0' in page
    assert 'outposts_session_start_seconds_bucket{outpost="beta",le="5"} 1' in page
    head = page.index("# TYPE outposts_session_start_seconds histogram")
    assert page.index('outposts_session_start_seconds_count{outpost="alpha"}') > head


# --- options -----------------------------------------------------------------------------------------------


def test_outposts_are_read_from_repeated_flags_and_from_the_variables_list() -> None:
    config = parse_args(["--outpost", "alpha=2", "--outpost", "beta", "--driver", "process"], TOKEN_ENV)
    assert config.outposts == (OutpostSpec("alpha", 2), OutpostSpec("beta", None))
    env = {
        **TOKEN_ENV,
        "DEVIN_ORCHESTRATOR_OUTPOST": "alpha=2, beta=3  gamma",
        "DEVIN_ORCHESTRATOR_MAX_CONCURRENT": "4",
    }
    config = parse_args(["--driver", "process"], env)
    assert [str(spec) for spec in config.outposts] == ["alpha=2", "beta=3", "gamma"]
    # The flag wins over the variable, as every option's does.
    assert parse_args(["--outpost", "delta", "--driver", "process"], env).outposts == (OutpostSpec("delta"),)
    # Each outpost's own cap never exceeds the process's; without one it is the process's.
    caps = [config.for_outpost(spec).max_concurrent for spec in config.outposts]
    assert caps == [2, 3, 4]
    assert config.for_outpost(OutpostSpec("big", 9)).max_concurrent == 4
    # One outpost, as before: its name, the process's cap.
    single = parse_args(["--outpost", "fleet", "--driver", "process"], TOKEN_ENV)
    assert (single.outposts, single.for_outpost(single.outposts[0]).max_concurrent) == (
        (OutpostSpec("fleet"),),
        10,
    )


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("alpha=0", "CAP a whole number >= 1"),
        ("alpha=two", "CAP a whole number >= 1"),
        ("=3", "CAP a whole number >= 1"),
        ("alpha,beta=2,alpha=3", "names 'alpha' twice"),
    ],
)
def test_a_bad_outpost_list_is_refused_naming_the_flag(text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        parse_outposts(text)
    with pytest.raises(ConfigError, match="--outpost"):
        parse_args(["--outpost", text, "--driver", "process"], TOKEN_ENV)


def test_no_outpost_at_all_is_refused() -> None:
    with pytest.raises(ConfigError, match="--outpost is required"):
        parse_args(["--outpost", " , ", "--driver", "process"], TOKEN_ENV)
