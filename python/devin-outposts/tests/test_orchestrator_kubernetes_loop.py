"""The orchestrator's loop with the ``kubernetes`` driver: the simulator's queue, a fake API server.

Two in-process orchestrators share one acceptor id (two replicas of one Deployment): the Lease lets one
act. The pods it makes live in the fake API server (tests/k8s_fake.py), whose statuses the test sets as a
kubelet would. Assertions read the fake's stored objects, the simulator's claim history and the two
orchestrators' own counters.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightkube", reason="the kubernetes extra (lightkube) is not installed")

from k8s_fake import FakeKube, run_fake_kube
from orchestrator_fakes import Running

from devin_outposts.api.models import Outpost
from devin_outposts.orchestrator.options import OrchestratorConfig
from devin_outposts.orchestrator.runner import Orchestrator
from devin_outposts_sim.testing import SimHandle

from worker_fakes import wait_for

NS = "outposts"
ACCEPTOR = "k8s-replicated"


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    with run_fake_kube() as server:
        yield server


def start(sim: SimHandle, outpost: Outpost, fake: FakeKube, tmp_path: Path, name: str) -> Running:
    kubeconfig = fake.kubeconfig(tmp_path / f"{name}.kubeconfig", namespace=NS)
    config = OrchestratorConfig(
        outpost=outpost.name, driver="kubernetes", max_concurrent=3, state_dir=tmp_path / name,
        acceptor_id=ACCEPTOR, api_url=sim.url, token=sim.create_token("orchestrator"), status_interval=0.05,
        poll_interval=0.2, confirm_interval=0.05, confirm_reads=2, gc_interval=0.3, backoff_max=1.0,
        driver_options={"kubeconfig": str(kubeconfig), "namespace": NS, "image": "registry.example/w:1",
                        "lease_duration": 1.5, "lease_renew_interval": 0.3},
    )  # fmt: skip
    return Running(Orchestrator(config))


def pods(fake: FakeKube) -> list[dict[str, Any]]:
    return [p for p in fake.objects("Pod", NS) if not p["metadata"].get("deletionTimestamp")]


def running_status(restarts: int = 0) -> dict[str, Any]:
    return {
        "phase": "Running",
        "containerStatuses": [{"name": "devin-worker", "restartCount": restarts, "state": {"running": {}}}],
    }


def test_one_of_two_replicas_leads_and_the_other_adopts_its_pod_when_it_stops(
    sim: SimHandle, outpost: Outpost, fake: FakeKube, tmp_path: Path
) -> None:
    first = start(sim, outpost, fake, tmp_path, "a")
    wait_for(lambda: fake.objects("Lease", NS), timeout=20, what="a Lease")
    second = start(sim, outpost, fake, tmp_path, "b")
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    [pod] = wait_for(lambda: pods(fake), timeout=20, what="the session's pod")
    fake.set_pod_status(NS, pod["metadata"]["name"], running_status())
    sim.admin.set_status(sid, "running")
    leaders = [r for r in (first, second) if r.orchestrator.metrics.counters["sessions_claimed"]]
    assert [r.orchestrator.metrics.counters["sessions_claimed"] for r in leaders] == [1]
    leader, follower = (first, second) if leaders[0] is first else (second, first)
    wait_for(lambda: leader.orchestrator.sessions and leader.orchestrator.sessions[0].running_now, timeout=20,
             what="the leader to see the worker running")  # fmt: skip
    pod_uid = pod["metadata"]["uid"]
    leader.stop()  # SIGTERM: the session is detached, its pod and claim kept
    assert [p["metadata"]["uid"] for p in pods(fake)] == [pod_uid]
    wait_for(lambda: follower.orchestrator.metrics.counters["sessions_claimed"] == 1, timeout=30,
             what="the other replica to take the session back")  # fmt: skip
    wait_for(lambda: follower.orchestrator.sessions and follower.orchestrator.sessions[0].adopted, timeout=10,
             what="the pod to be adopted")  # fmt: skip
    assert [p["metadata"]["uid"] for p in pods(fake)] == [pod_uid]  # adopted, not recreated
    claims = [r for r in sim.admin.claims(session_id=sid) if r["action"] == "release"]
    assert claims == []
    # The session ends: the pod exits 0, the status says terminated; pod and secret go, the claim is released.
    sim.admin.set_status(sid, "terminated")
    with fake.lock:  # the fleet's word may have reached the session first: its pod is then deleted already
        if fake.get("Pod", NS, pod["metadata"]["name"]) is not None:
            fake.set_pod_status(NS, pod["metadata"]["name"], {"phase": "Succeeded"})
    wait_for(lambda: any(r["action"] == "release" for r in sim.admin.claims(session_id=sid)), timeout=30,
             what="the release")  # fmt: skip
    fake.finish_deletions()
    wait_for(
        lambda: not pods(fake) and not fake.objects("Secret", NS), timeout=20, what="the pod and secret gone"
    )
    follower.stop()
