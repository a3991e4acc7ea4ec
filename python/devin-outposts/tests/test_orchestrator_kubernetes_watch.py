"""The ``kubernetes`` driver's Pod watch, with the real driver and orchestrator on a fake API server.

Sessions learn their Pods' statuses from one list-and-watch (drivers/kubernetes/informer.py), not from
a GET per Pod: the tests count the fake's requests by verb, break its watch streams (a drop; a compaction
then a resume, answered 410 Gone), restart the orchestrator, and give Pods the waiting reasons and
conditions a kubelet and a scheduler report for a worker that cannot start. Statuses are set as a kubelet
would (tests/k8s_fake.py); assertions read the fake's stored objects and request log, and the simulator's
claim history.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

pytest.importorskip("lightkube", reason="the kubernetes extra (lightkube) is not installed")

from k8s_fake import FakeKube, run_fake_kube
from orchestrator_fakes import Running, released

from devin_outposts.api.models import Outpost
from devin_outposts.orchestrator.drivers import driver_class
from devin_outposts.orchestrator.drivers.base import (
    LABEL_ACCEPTOR,
    LABEL_MANAGED_BY,
    LABEL_OUTPOST,
    MANAGED_BY,
    DriverContext,
    WorkerState,
    WorkerStatus,
)
from devin_outposts.orchestrator.drivers.kubernetes.informer import PodInformer, PodTracker
from devin_outposts.orchestrator.drivers.kubernetes.manifests import ANNOTATION_SESSION
from devin_outposts.orchestrator.drivers.kubernetes.pod_status import pod_status
from devin_outposts.orchestrator.drivers.status_board import StatusBoard
from devin_outposts.orchestrator.options import MachineStatus, OrchestratorConfig
from devin_outposts.orchestrator.runner import Orchestrator
from devin_outposts_sim.testing import SimHandle

from worker_fakes import wait_for

NS = "outposts"
ACCEPTOR = "k8s-watch"
CONTAINER = "devin-worker"
OURS = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_ACCEPTOR: "a"}


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    with run_fake_kube() as server:
        yield server


def start(sim: SimHandle, outpost: Outpost, fake: FakeKube, tmp_path: Path, **overrides: Any) -> Running:
    kubeconfig = fake.kubeconfig(tmp_path / "kubeconfig", namespace=NS)
    settings: dict[str, Any] = dict(
        outpost=outpost.name, driver="kubernetes", max_concurrent=20, state_dir=tmp_path / "state",
        acceptor_id=ACCEPTOR, api_url=sim.url, token=sim.create_token("orchestrator"), status_interval=0.2,
        poll_interval=0.2, confirm_interval=0.05, confirm_reads=2, gc_interval=0.5, backoff_max=1.0,
        session_check_interval=300.0,
        driver_options={"kubeconfig": str(kubeconfig), "namespace": NS, "image": "registry.example/w:1"},
    )  # fmt: skip
    settings.update(overrides)
    return Running(Orchestrator(OrchestratorConfig(**settings)))


def live_pods(fake: FakeKube) -> list[dict[str, Any]]:
    return [p for p in fake.objects("Pod", NS) if not p["metadata"].get("deletionTimestamp")]


def pod_of(fake: FakeKube, session_id: str) -> dict[str, Any]:
    [pod] = [p for p in live_pods(fake) if p["metadata"]["annotations"].get(ANNOTATION_SESSION) == session_id]
    return pod


def uid_of(fake: FakeKube, session_id: str) -> Optional[str]:
    """The uid of the session's live Pod; None while there is none (being replaced)."""
    uids = [
        p["metadata"]["uid"]
        for p in live_pods(fake)
        if p["metadata"]["annotations"].get(ANNOTATION_SESSION) == session_id
    ]
    return uids[0] if uids else None


def running(restarts: int = 0) -> dict[str, Any]:
    return {
        "phase": "Running",
        "containerStatuses": [{"name": CONTAINER, "restartCount": restarts, "state": {"running": {}}}],
    }


def waiting(reason: str) -> dict[str, Any]:
    state = {"waiting": {"reason": reason, "message": f"{reason} for registry.example/w:1"}}
    return {"phase": "Pending", "containerStatuses": [{"name": CONTAINER, "restartCount": 0, "state": state}]}


UNSCHEDULABLE = {
    "phase": "Pending",
    "conditions": [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient memory.",
        }
    ],
}


def informer_lists(fake: FakeKube, since: int = 0) -> int:
    """Pod lists by the watch (by acceptor id, every outpost), apart from the sweep's per-outpost lists and
    the driver's check (any one Pod of ours)."""
    with fake.lock:
        return sum(
            1
            for r in fake.requests[since:]
            if r.verb == "list"
            and r.resource == "pods"
            and LABEL_ACCEPTOR in r.query["labelSelector"][0]
            and LABEL_OUTPOST not in r.query["labelSelector"][0]
        )


async def until(predicate: Callable[[], Any], what: str) -> None:
    await asyncio.to_thread(wait_for, predicate, 30, 0.05, what)


def bring_up(sim: SimHandle, outpost: Outpost, fake: FakeKube, orch: Running, count: int) -> list[str]:
    """``count`` sessions claimed, their Pods running, and every session seeing its worker run."""
    sids = [sim.admin.enqueue(outpost.outpost_id).session_id for dummy in range(count)]
    wait_for(lambda: len(live_pods(fake)) == count, timeout=60, what=f"{count} pods")
    for sid in sids:
        fake.set_pod_status(NS, pod_of(fake, sid)["metadata"]["name"], running())
        sim.admin.set_status(sid, "running")
    wait_for(
        lambda: len([s for s in orch.orchestrator.sessions if s.running_now]) == count,
        timeout=60,
        what="every session to see its worker running",
    )
    return sids


# -- Pod -> WorkerStatus ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"phase": "Pending"}, WorkerStatus(WorkerState.STARTING, detail="Pending")),
        (waiting("ErrImagePull"), (WorkerState.STARTING, "ErrImagePull")),
        (waiting("ImagePullBackOff"), (WorkerState.STARTING, "ErrImagePull")),  # one reason: one grace
        (waiting("CreateContainerConfigError"), (WorkerState.STARTING, "CreateContainerConfigError")),
        (waiting("RunContainerError"), (WorkerState.STARTING, "RunContainerError")),
        (waiting("InvalidImageName"), (WorkerState.FAILED, "InvalidImageName")),
        (waiting("ErrImageNeverPull"), (WorkerState.FAILED, "ErrImageNeverPull")),
        (
            waiting("ContainerCreating"),
            WorkerStatus(WorkerState.STARTING, detail="Pending ContainerCreating"),
        ),
        (UNSCHEDULABLE, (WorkerState.STARTING, "Unschedulable")),
        (running(), WorkerStatus(WorkerState.RUNNING, detail="Running")),
        ({"phase": "Succeeded"}, WorkerStatus(WorkerState.EXITED, exit_code=0, detail="Succeeded")),
    ],
)
def test_a_pod_reads_as_the_status_its_phase_and_reasons_say(status: dict[str, Any], expected: Any) -> None:
    read = pod_status({"metadata": {"name": "p"}, "status": status}, CONTAINER)
    if isinstance(expected, WorkerStatus):
        assert read == expected
    else:
        assert (read.state, read.reason) == expected
        assert read.detail  # the kubelet's or scheduler's words, for the result line


def a_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": OURS},
        "status": {"phase": "Pending"},
    }


def test_while_a_pod_is_replaced_the_old_one_going_reads_as_starting_and_its_late_events_are_ignored() -> (
    None
):
    tracker, running_now = PodTracker(), WorkerStatus(WorkerState.RUNNING)

    def pod(uid: str, **meta: Any) -> dict[str, Any]:
        return {"metadata": {"name": "p", "uid": uid, **meta}}

    tracker.replaced("p", "old")  # the first start made Pod "old"
    assert tracker.read(pod("old"), running_now, deleted=False) is running_now
    tracker.replacing("p", None)  # the next start: the uid it knew is the old one
    terminating = pod("old", deletionTimestamp="2026-01-01T00:00:00Z")
    assert tracker.read(terminating, running_now, deleted=False).state is WorkerState.STARTING  # type: ignore[union-attr]
    assert tracker.read(pod("old"), running_now, deleted=True).state is WorkerState.STARTING  # type: ignore[union-attr]
    assert (
        tracker.read(pod("new"), running_now, deleted=False) is running_now
    )  # the new one, before create returns
    tracker.replaced("p", "new")
    assert (
        tracker.read(pod("old"), running_now, deleted=True) is None
    )  # late: not the Pod the name stands for
    assert tracker.read(pod("new"), running_now, deleted=True) is running_now
    tracker.forget("p")  # torn down: any Pod of that name is news again
    assert tracker.read(pod("old"), running_now, deleted=False) is running_now


# -- the informer alone ------------------------------------------------------------------------------


def test_a_watch_that_ends_cleanly_resumes_from_its_bookmark_without_listing_again(
    fake: FakeKube, tmp_path: Path
) -> None:
    """timeoutSeconds is sent and honoured; each end carries a BOOKMARK whose version the next watch
    starts from; a change between two watches still arrives; one list in all."""
    options = {"kubeconfig": str(fake.kubeconfig(tmp_path / "kubeconfig", namespace=NS)), "image": "w:1"}
    driver = driver_class("kubernetes").from_options(DriverContext(state_dir=tmp_path), options)
    pod = a_pod("outpost-worker-a")
    fake.put(pod)
    fake.put({**pod, "metadata": {**pod["metadata"], "name": "not-ours", "labels": {}}})

    async def scenario() -> PodInformer:
        informer = PodInformer(
            driver.cluster,  # type: ignore[attr-defined]
            selector=OURS,
            container_name=CONTAINER,
            tracker=PodTracker(),
            watch_seconds=1,
        )
        board = StatusBoard()
        task = asyncio.ensure_future(informer.run(board))
        await until(lambda: informer.ends["end"] >= 1, "the first watch's end")
        fake.set_pod_status(NS, "not-ours", running())  # a revision no event of ours shows
        ended = informer.ends["end"]
        await until(lambda: informer.ends["end"] >= ended + 2, "a watch begun after that change, ended")
        fake.set_pod_status(NS, "outpost-worker-a", running())
        await until(
            lambda: (
                (row := board.row("outpost-worker-a")) is not None and row.status.state is WorkerState.RUNNING
            ),
            "the change streamed into the board",
        )
        assert board.synced and board.row("not-ours") is None
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await driver.aclose()
        return informer

    informer = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert informer.lists == 1 and informer.ends["error"] == informer.ends["gone"] == 0
    watches = [r for r in fake.requests if r.verb == "watch"]
    assert len(watches) >= 3
    assert all(
        w.query["timeoutSeconds"] == ["1"] and w.query["allowWatchBookmarks"] == ["true"] for w in watches
    )
    # Each watch after the first starts from the bookmark the one before ended with: the revision of the
    # change to a Pod not ours is reached by bookmarks alone.
    versions = [int(w.query["resourceVersion"][0]) for w in watches]
    not_ours = int(fake.get("Pod", NS, "not-ours")["metadata"]["resourceVersion"])  # type: ignore[index]
    assert versions == sorted(versions) and not_ours in versions
    assert fake.count("get") == 0


def test_a_watch_answered_410_straight_after_each_list_backs_off_instead_of_spinning(
    fake: FakeKube, tmp_path: Path
) -> None:
    options = {"kubeconfig": str(fake.kubeconfig(tmp_path / "kubeconfig", namespace=NS)), "image": "w:1"}
    driver = driver_class("kubernetes").from_options(DriverContext(state_dir=tmp_path), options)
    fake.put(a_pod("outpost-worker-a"))  # a revision above 0 (0 would mean "from now")
    fake.compacted = 10**9  # every version is too old

    async def scenario() -> PodInformer:
        informer = PodInformer(
            driver.cluster,  # type: ignore[attr-defined]
            selector=OURS,
            container_name=CONTAINER,
            tracker=PodTracker(),
        )
        board = StatusBoard()
        task = asyncio.ensure_future(informer.run(board))
        await until(lambda: fake.expired_watches >= 3, "three watches answered 410")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await driver.aclose()
        return informer

    informer = asyncio.run(asyncio.wait_for(scenario(), 60))
    # One list again at once, then pauses of 1 s, 2 s...: a spin would list hundreds of times meanwhile.
    assert informer.lists == fake.expired_watches < 10
    assert informer.ends["gone"] >= 2 and informer.ends["error"] == 0


# -- the orchestrator on the fake API server -------------------------------------------------------------


def test_running_sessions_cost_no_pod_read_only_one_list_and_one_watch(
    sim: SimHandle, outpost: Outpost, fake: FakeKube, tmp_path: Path
) -> None:
    orch = start(sim, outpost, fake, tmp_path)
    bring_up(sim, outpost, fake, orch, 20)
    mark = len(fake.requests)
    time.sleep(3)  # a window of 15 status intervals: polling would have read each Pod 15 times
    assert fake.count("get", since=mark) == 0
    assert fake.count("watch", since=mark) == 0  # the one watch stays open
    assert informer_lists(fake) == 1 and fake.count("watch") == 1
    assert fake.open_watches == 1
    orch.stop()


def test_a_pod_that_ends_while_the_watch_is_broken_still_ends_its_worker(
    sim: SimHandle, outpost: Outpost, fake: FakeKube, tmp_path: Path
) -> None:
    """The stream drops (no end of body) as the Pod succeeds: that change is never streamed, the list
    after the back-off shows it, and the session (still running in the fleet) gets a new worker."""
    orch = start(sim, outpost, fake, tmp_path, max_concurrent=3)
    sids = bring_up(sim, outpost, fake, orch, 3)
    first = pod_of(fake, sids[0])
    with fake.lock:  # atomically: the open watch never sends the change
        fake.drop_watches()
        fake.set_pod_status(NS, first["metadata"]["name"], {"phase": "Succeeded"})
    wait_for(
        lambda: uid_of(fake, sids[0]) not in (None, first["metadata"]["uid"]),
        timeout=60,
        what="a new pod for the session whose worker ended",
    )
    wait_for(lambda: informer_lists(fake) >= 2, timeout=30, what="the pods listed again after the drop")
    assert not any(released(sim, sid) for sid in sids)
    orch.stop()


@pytest.mark.parametrize("gone_as", ["event", "http"])
def test_a_pod_deleted_while_the_watch_was_away_is_missing_after_the_410_and_the_list(
    sim: SimHandle, outpost: Outpost, fake: FakeKube, tmp_path: Path, gone_as: str
) -> None:
    """The watch ends cleanly, its events compacted away and a Pod deleted meanwhile: the resume is
    answered 410 Gone (an ERROR event, or the HTTP status), the informer lists again, and the deleted
    Pod's session gives its claim back; the others keep theirs."""
    fake.gone_as_http = gone_as == "http"
    orch = start(sim, outpost, fake, tmp_path, max_concurrent=3)
    sids = bring_up(sim, outpost, fake, orch, 3)
    lists = informer_lists(fake)
    with fake.lock:  # atomically: the open watch never sends the deletion
        fake.delete("Pod", NS, pod_of(fake, sids[1])["metadata"]["name"])
        fake.compact()
        fake.end_watches()
    wait_for(lambda: released(sim, sids[1]), timeout=60, what="the deleted pod's claim released")
    assert fake.expired_watches >= 1
    assert informer_lists(fake) >= lists + 1
    assert not released(sim, sids[0]) and not released(sim, sids[2])
    orch.stop()


def test_a_restarted_orchestrator_adopts_its_pods_with_one_list_and_one_watch(
    sim: SimHandle, outpost: Outpost, fake: FakeKube, tmp_path: Path
) -> None:
    """No status storm: after a restart, the adopted Pods' statuses come from the new process's list."""
    orch = start(sim, outpost, fake, tmp_path, max_concurrent=10)
    sids = bring_up(sim, outpost, fake, orch, 10)
    uids = sorted(p["metadata"]["uid"] for p in live_pods(fake))
    orch.stop()  # SIGTERM: sessions detached, Pods and claims kept
    mark = len(fake.requests)
    again = start(sim, outpost, fake, tmp_path, max_concurrent=10)
    wait_for(
        lambda: len([s for s in again.orchestrator.sessions if s.adopted and s.running_now]) == 10,
        timeout=60,
        what="every pod adopted and seen running",
    )
    assert sorted(p["metadata"]["uid"] for p in live_pods(fake)) == uids  # adopted, not recreated
    assert informer_lists(fake, since=mark) == 1 and fake.count("watch", since=mark) == 1
    assert fake.count("get", since=mark) == 0
    assert not any(released(sim, sid) for sid in sids)
    again.stop()


def test_a_worker_that_cannot_start_releases_its_claim_within_the_grace_with_the_reason(
    sim: SimHandle, outpost: Outpost, fake: FakeKube, tmp_path: Path
) -> None:
    reasons = {"ErrImagePull": "ErrImagePull", "ImagePullBackOff": "ErrImagePull"}
    orch = start(sim, outpost, fake, tmp_path, max_concurrent=4, start_failure_grace=0.5)
    began = time.monotonic()
    sids = [sim.admin.enqueue(outpost.outpost_id).session_id for dummy in range(4)]
    wait_for(lambda: len(live_pods(fake)) == 4, timeout=60, what="4 pods")
    given = dict(
        zip(
            sids,
            [
                waiting("ErrImagePull"),
                waiting("ImagePullBackOff"),
                waiting("InvalidImageName"),
                UNSCHEDULABLE,
            ],
        )
    )
    for sid, status in given.items():
        fake.set_pod_status(NS, pod_of(fake, sid)["metadata"]["name"], status)
    for sid in sids:
        wait_for(lambda sid=sid: released(sim, sid), timeout=60, what=f"session {sid} released")
    # Far inside the 300 s boot timeout: the grace (or FAILED at once), not the boot timeout, ended them.
    assert time.monotonic() - began < 120
    # The result is recorded once the release is done: wait for it too.
    wait_for(
        lambda: {r.session_id for r in orch.orchestrator.results} >= set(sids), timeout=30, what="the results"
    )
    results = {}
    for result in orch.orchestrator.results:
        results.setdefault(result.session_id, result)  # the first: a re-claimed session may end again
    expected = [
        reasons.get(r, r) for r in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "Unschedulable")
    ]
    assert [results[sid].reason for sid in sids] == expected
    assert all(results[sid].infrastructure for sid in sids)
    orch.stop()


def test_polling_still_reads_each_pod_and_never_watches(
    sim: SimHandle, outpost: Outpost, fake: FakeKube, tmp_path: Path
) -> None:
    orch = start(sim, outpost, fake, tmp_path, max_concurrent=2, machine_status=MachineStatus.POLL)
    sids = bring_up(sim, outpost, fake, orch, 2)
    first = pod_of(fake, sids[0])
    fake.set_pod_status(NS, first["metadata"]["name"], {"phase": "Succeeded"})
    wait_for(
        lambda: uid_of(fake, sids[0]) not in (None, first["metadata"]["uid"]),
        timeout=60,
        what="a new pod for the session whose worker ended",
    )
    mark = len(fake.requests)
    wait_for(lambda: fake.count("get", since=mark) >= 4, timeout=30, what="the pods read on a timer")
    assert fake.count("watch") == 0 and informer_lists(fake) == 0
    orch.stop()
