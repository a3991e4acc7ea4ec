"""The ``kubernetes`` driver against a fake API server (tests/k8s_fake.py), and its manifests offline.

No Kubernetes API server can run here, so the driver talks through its real client (lightkube, real
HTTP) to a fake that implements exactly the endpoints it uses, and every assertion reads the fake's
stored objects: what a cluster would hold, not what the driver said it did. Pod statuses are set by the
test, since no kubelet runs. The manifests are also validated against the Kubernetes JSON schemas
(kubernetes-validate, offline), and test_orchestrator_kubernetes_podman.py runs the rendered Pod.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import subprocess
import sys
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("lightkube", reason="the kubernetes extra (lightkube) is not installed")

from k8s_fake import SCHEMA_VERSIONS, FakeKube, no_network, run_fake_kube

from devin_outposts.orchestrator.drivers import driver_class
from devin_outposts.orchestrator.drivers.base import (
    LABEL_ACCEPTOR,
    LABEL_MANAGED_BY,
    LABEL_OUTPOST,
    LABEL_SESSION,
    MANAGED_BY,
    DriverContext,
    DriverError,
    SessionSpec,
    WorkerLaunch,
    WorkerState,
)
from devin_outposts.orchestrator.drivers.kubernetes import (
    KubernetesDriver,
    LeaseLock,
    render_session_manifests,
)
from devin_outposts.orchestrator.drivers.kubernetes.manifests import LABEL_SNAPSHOT

T = TypeVar("T")
NS = "outposts"
IMAGE = "registry.example/devin-outposts-session:1"
TOKEN = "connect-token-that-must-stay-in-the-secret"
# A long session id with characters that are not DNS-safe: names must still be <= 63 and distinct.
LONG_ID = "devin-" + "AbC_" * 20 + "end"


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def until(predicate: Callable[[], bool], timeout: float = 60) -> None:
    """Wait for observed state (polling the fake), failing after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("the condition did not become true")
        await asyncio.sleep(0.05)


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    with run_fake_kube() as server:
        yield server


def make_driver(fake: FakeKube, tmp_path: Path, **options: Any) -> KubernetesDriver:
    config = fake.kubeconfig(tmp_path / "kubeconfig")
    context = DriverContext(state_dir=tmp_path / "state", worker_command=("devin-outposts",))
    opts: dict[str, Any] = {"kubeconfig": str(config), "image": IMAGE, **options}
    driver = driver_class("kubernetes").from_options(context, opts)
    assert isinstance(driver, KubernetesDriver)
    return driver


def spec(
    session_id: str = "devin-abc123", acceptor: str = "orch-1", outpost: str = "outpost_env-1"
) -> SessionSpec:
    return SessionSpec(session_id=session_id, outpost_id=outpost, acceptor_id=acceptor)


def launch(session_id: str = "devin-abc123", token: str = TOKEN) -> WorkerLaunch:
    return WorkerLaunch(session_id=session_id, connect_token=token, gateway_url="wss://gateway.example/x")


def names(objs: list[dict[str, Any]]) -> list[str]:
    return [o["metadata"]["name"] for o in objs]


# -- options -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"namespace": "x", "imag": "typo"}, "unknown kubernetes driver option imag"),
        ({}, "option image is required"),
        ({"image": IMAGE, "overrides": {"labels": {LABEL_SESSION: "x"}}}, f"may not set {LABEL_SESSION}"),
        ({"image": IMAGE, "overrides": {"restartPolicy": "Never"}}, "unknown key restartPolicy"),
        (
            {"image": IMAGE, "pod_template": {"spec": {"restartPolicy": "Always"}}},
            "restartPolicy must be OnFailure",
        ),
        ({"image": IMAGE, "owner": {"apiVersion": "v1", "kind": "Pod", "name": "me"}}, "a Pod cannot own"),
        ({"image": IMAGE, "lease_duration": "5", "lease_renew_interval": 5}, "must be shorter"),
        ({"image": IMAGE, "state_volume": "maybe"}, "must be true or false"),
    ],
)
def test_bad_options_are_refused_in_one_line(tmp_path: Path, options: dict[str, Any], message: str) -> None:
    with pytest.raises(DriverError) as caught:
        driver_class("kubernetes").from_options(DriverContext(state_dir=tmp_path), options)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


# -- provision and start: the objects in the cluster -----------------------------------------------------


def test_start_creates_pod_and_secret_as_the_operator_does(
    fake: FakeKube, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    fake.put(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "orchestrator", "namespace": NS},
            "spec": {
                "selector": {"matchLabels": {"app": "o"}},
                "template": {"metadata": {"labels": {"app": "o"}}},
            },
        }
    )
    owner_uid = fake.get("Deployment", NS, "orchestrator")["metadata"]["uid"]  # type: ignore[index]
    driver = make_driver(
        fake,
        tmp_path,
        owner={"apiVersion": "apps/v1", "kind": "Deployment", "name": "orchestrator"},
        pod_template={
            "metadata": {"labels": {"team": "infra"}, "annotations": {"note": "base"}},
            "spec": {
                "nodeSelector": {"pool": "sessions"},
                "containers": [
                    {
                        "name": "devin-worker",
                        "image": "base:0",
                        "env": [{"name": "FROM_TEMPLATE", "value": "1"}],
                    },
                    {"name": "sidecar", "image": "sidecar:1"},
                ],
            },
        },
        overrides={"labels": {"cost-center": "42"}, "resources": {"limits": {"memory": "4Gi"}}},
    )
    session = spec(LONG_ID)

    async def scenario() -> None:
        await driver.check()
        machine = await driver.provision(session)
        await driver.start(machine, launch(LONG_ID))
        await driver.aclose()

    run(scenario())
    [pod] = fake.objects("Pod", NS)
    [secret] = fake.objects("Secret", NS)
    meta = pod["metadata"]
    assert meta["name"].startswith("outpost-worker-devin-abc-abc") and len(meta["name"]) <= 63
    assert (
        secret["metadata"]["name"].startswith("outpost-token-devin-abc")
        and len(secret["metadata"]["name"]) <= 63
    )
    assert meta["labels"][LABEL_MANAGED_BY] == MANAGED_BY
    assert meta["labels"][LABEL_ACCEPTOR] == "orch-1" and meta["labels"][LABEL_OUTPOST] == "outpost_env-1"
    assert len(meta["labels"][LABEL_SESSION]) <= 63 and meta["labels"][LABEL_SESSION] != LONG_ID
    assert meta["labels"]["team"] == "infra" and meta["labels"]["cost-center"] == "42"
    assert meta["annotations"]["outposts.devin.ai/session-id"] == LONG_ID
    assert meta["annotations"]["outposts.cognition.com/pool-id"] == "outpost_env-1"
    assert meta["annotations"]["note"] == "base"
    # Owned by the Deployment (looked up by name), never by a Pod; the Secret is owned by its Pod.
    assert meta["ownerReferences"] == [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "orchestrator", "uid": owner_uid}
    ]
    assert secret["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
    ]
    podspec = pod["spec"]
    assert podspec["restartPolicy"] == "OnFailure"
    assert podspec["automountServiceAccountToken"] is False
    assert podspec["nodeSelector"] == {"pool": "sessions"}
    worker, sidecar = podspec["containers"]
    assert sidecar == {"name": "sidecar", "image": "sidecar:1"}
    assert worker["name"] == "devin-worker" and worker["image"] == IMAGE
    assert worker["command"] == ["devin-outposts"] and worker["args"] == [
        "worker",
        "start",
        f"--session={LONG_ID}",
    ]
    assert worker["resources"] == {"limits": {"memory": "4Gi"}}
    env = {e["name"]: e for e in worker["env"]}
    assert env["DEVIN_REMOTE_SESSION_TOKEN"] == {
        "name": "DEVIN_REMOTE_SESSION_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "token"}},
    }
    assert env["DEVIN_OUTPOST_GATEWAY_URL"]["value"] == "wss://gateway.example/x"
    assert env["DEVIN_WORKER_CACHE_DIR"]["value"] == "/var/lib/devin-worker/cache"
    assert env["FROM_TEMPLATE"]["value"] == "1"
    # The token is in the Secret and nowhere in the Pod, nor in the driver's log.
    assert base64.b64decode(secret["data"]["token"]).decode() == TOKEN
    assert TOKEN not in json.dumps(pod)
    assert TOKEN not in caplog.text
    assert not fake.objects("PersistentVolumeClaim", NS)  # no state_volume: no PVC


def test_provision_is_idempotent_and_start_replaces_the_pod(fake: FakeKube, tmp_path: Path) -> None:
    driver = make_driver(fake, tmp_path, state_volume=True)

    async def scenario() -> tuple[str, str]:
        first = await driver.provision(spec())
        again = await driver.provision(spec())  # the PVC exists: 409 AlreadyExists is not an error
        assert again.ref == first.ref
        await driver.start(first, launch())
        uid1 = fake.objects("Pod", NS)[0]["metadata"]["uid"]
        fake.hold_deletions = {"Pod"}  # the old Pod terminates for a while, holding its name
        task = asyncio.create_task(driver.start(again, launch(token="fresh-token")))
        pod_path = f"/api/v1/namespaces/{NS}/pods/{first.ref}"
        deleted_at = len(fake.requests)
        # The driver deleted the Pod and keeps reading it: it waits for the name to be free.

        def seen() -> list[tuple[str, str]]:
            return [(r.method, r.path) for r in fake.requests[deleted_at:]]

        await until(lambda: seen().count(("GET", pod_path)) >= 3)
        assert any(o["metadata"].get("deletionTimestamp") for o in fake.objects("Pod", NS))
        assert not task.done()
        assert not any(r.method == "POST" and r.path.endswith("/pods") for r in fake.requests[deleted_at:])
        fake.finish_deletions()
        await task
        await driver.aclose()
        return uid1, fake.objects("Pod", NS)[0]["metadata"]["uid"]

    uid1, uid2 = run(scenario())
    assert uid1 != uid2
    assert len(fake.objects("Pod", NS)) == 1
    [secret] = fake.objects("Secret", NS)
    assert base64.b64decode(secret["data"]["token"]).decode() == "fresh-token"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == uid2
    [pvc] = fake.objects("PersistentVolumeClaim", NS)
    assert pvc["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert "ownerReferences" not in pvc["metadata"]  # not owned by the Pod: it may outlive it
    creates = [r for r in fake.requests if r.method == "POST" and r.path.endswith("/persistentvolumeclaims")]
    assert len(creates) >= 2  # provision twice (and start): the conflicts were absorbed


def test_a_terminating_state_volume_is_waited_for_not_reused(fake: FakeKube, tmp_path: Path) -> None:
    driver = make_driver(fake, tmp_path, state_volume=True)

    async def scenario() -> tuple[str, str]:
        machine = await driver.provision(spec())
        await driver.start(machine, launch())
        old = fake.objects("PersistentVolumeClaim", NS)[0]["metadata"]["uid"]
        fake.hold_deletions = {"PersistentVolumeClaim"}
        await driver.teardown(machine)  # the PVC is terminating now
        task = asyncio.create_task(driver.provision(spec()))
        mark = len(fake.requests)
        await until(lambda: len([r for r in fake.requests[mark:] if r.method == "GET"]) >= 3)
        assert not task.done()
        assert not any(r.method == "POST" for r in fake.requests[mark:])
        fake.finish_deletions()
        await task
        await driver.aclose()
        return old, fake.objects("PersistentVolumeClaim", NS)[0]["metadata"]["uid"]

    old, new = run(scenario())
    assert old != new


def test_mapping_options_may_be_json_text(tmp_path: Path) -> None:
    # --driver-opt overrides='{"labels": {"a": "b"}}' gives text, not a mapping.
    driver = driver_class("kubernetes").from_options(
        DriverContext(state_dir=tmp_path), {"image": IMAGE, "overrides": '{"labels": {"team": "a"}}'}
    )
    assert isinstance(driver, KubernetesDriver)
    [pod] = [
        o
        for o in render_session_manifests(spec(), launch(), settings=driver.options.pod)
        if o["kind"] == "Pod"
    ]
    assert pod["metadata"]["labels"]["team"] == "a"
    with pytest.raises(DriverError, match="option overrides must be a mapping"):
        driver_class("kubernetes").from_options(
            DriverContext(state_dir=tmp_path), {"image": IMAGE, "overrides": "x"}
        )


def test_status_follows_the_pod(fake: FakeKube, tmp_path: Path) -> None:
    driver = make_driver(fake, tmp_path)

    async def scenario() -> list[Any]:
        machine = await driver.provision(spec())
        seen = [await driver.status(machine)]
        await driver.start(machine, launch())
        name = machine.ref
        seen.append(await driver.status(machine))  # Pending
        for status in (
            {
                "phase": "Running",
                "containerStatuses": [{"name": "devin-worker", "restartCount": 0, "state": {"running": {}}}],
            },
            {
                "phase": "Running",
                "containerStatuses": [
                    {"name": "sidecar", "restartCount": 9},
                    {
                        "name": "devin-worker",
                        "restartCount": 2,
                        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    },
                ],
            },
            {
                "phase": "Succeeded",
                "containerStatuses": [
                    {"name": "devin-worker", "restartCount": 2, "state": {"terminated": {"exitCode": 0}}}
                ],
            },
            {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "name": "devin-worker",
                        "restartCount": 5,
                        "state": {"terminated": {"exitCode": 3, "reason": "Error"}},
                    }
                ],
            },
            {"phase": "Failed", "reason": "Evicted"},
        ):
            fake.set_pod_status(NS, name, status)
            seen.append(await driver.status(machine))
        await driver.teardown(machine)
        seen.append(await driver.status(machine))
        await driver.aclose()
        return seen

    seen = run(scenario())
    assert [(s.state, s.exit_code, s.restarts) for s in seen] == [
        (WorkerState.STARTING, None, 0),  # provisioned, not started
        (WorkerState.STARTING, None, 0),
        (WorkerState.RUNNING, None, 0),
        (WorkerState.RUNNING, None, 2),  # the sidecar's restarts are not the worker's
        (WorkerState.EXITED, 0, 2),
        (WorkerState.EXITED, 3, 5),
        (WorkerState.EXITED, 1, 0),
        (WorkerState.MISSING, None, 0),
    ]
    assert "CrashLoopBackOff" in seen[3].detail and "Evicted" in seen[6].detail


def test_teardown_deletes_pod_and_secret_and_is_idempotent(fake: FakeKube, tmp_path: Path) -> None:
    driver = make_driver(fake, tmp_path, state_volume=True)
    fake.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "unrelated", "namespace": NS}})

    async def scenario() -> None:
        machine = await driver.provision(spec())
        await driver.start(machine, launch())
        assert fake.objects("Pod", NS) and len(fake.objects("Secret", NS)) == 2
        await driver.teardown(machine)
        await driver.teardown(machine)  # gone already: no error
        await driver.aclose()

    run(scenario())
    assert fake.objects("Pod", NS) == []
    assert names(fake.objects("Secret", NS)) == ["unrelated"]
    assert fake.objects("PersistentVolumeClaim", NS) == []  # not kept as a snapshot: deleted too


def test_list_owned_filters_by_acceptor_and_outpost(fake: FakeKube, tmp_path: Path) -> None:
    driver = make_driver(fake, tmp_path)
    sessions = [
        spec("devin-1"),
        spec("devin-2"),
        spec("devin-3", acceptor="orch-2"),
        spec("devin-4", outpost="outpost_env-2"),
    ]
    # A Pod someone else made with our labels but another name is not ours to adopt.
    fake.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "impostor",
                "namespace": NS,
                "labels": spec("devin-5").labels(),
                "annotations": {
                    "outposts.devin.ai/session-id": "devin-5",
                    "outposts.devin.ai/acceptor-id": "orch-1",
                    "outposts.cognition.com/pool-id": "outpost_env-1",
                },
            },
            "spec": {"containers": []},
        }
    )

    async def scenario() -> list[Any]:
        for s in sessions:
            await driver.start(await driver.provision(s), launch(s.session_id))
        owned = await driver.list_owned("orch-1", "outpost_env-1")
        statuses = [await driver.status(m) for m in owned]
        await driver.aclose()
        return [(m.session_id, m.outpost_id, m.acceptor_id, m.ref, s.state) for m, s in zip(owned, statuses)]

    found = run(scenario())
    assert sorted(f[:3] for f in found) == [
        ("devin-1", "outpost_env-1", "orch-1"),
        ("devin-2", "outpost_env-1", "orch-1"),
    ]
    assert all(f[4] is WorkerState.STARTING for f in found)  # adopted Pods, still Pending (no kubelet)
    assert all(f[3] in names(fake.objects("Pod", NS)) for f in found)
    selector = [
        r.query["labelSelector"][0] for r in fake.requests if r.method == "GET" and r.path.endswith("/pods")
    ][-1]
    assert f"{LABEL_ACCEPTOR}=orch-1" in selector and f"{LABEL_MANAGED_BY}={MANAGED_BY}" in selector


def test_snapshot_restore_list_and_delete_through_the_pvc(fake: FakeKube, tmp_path: Path) -> None:
    driver = make_driver(fake, tmp_path, state_volume=True, volume_size="5Gi", storage_class="fast")

    async def scenario() -> None:
        machine = await driver.provision(spec())
        await driver.start(machine, launch())
        pvc_uid = fake.objects("PersistentVolumeClaim", NS)[0]["metadata"]["uid"]
        snap = await driver.snapshot(machine)
        await driver.teardown(machine)
        assert fake.objects("Pod", NS) == [] and fake.objects("Secret", NS) == []
        [kept] = fake.objects("PersistentVolumeClaim", NS)
        assert kept["metadata"]["uid"] == pvc_uid and kept["metadata"]["labels"][LABEL_SNAPSHOT] == "true"
        assert "outposts.cognition.com/suspended-at" in kept["metadata"]["annotations"]
        [listed] = await driver.list_snapshots("orch-1", "outpost_env-1")
        assert listed.ref == snap.ref == kept["metadata"]["name"] and listed.session_id == "devin-abc123"
        assert await driver.list_snapshots("orch-2", "outpost_env-1") == []

        # Resume with the snapshot: the new Pod mounts the very same PVC.
        resumed = await driver.provision(spec())
        await driver.restore(resumed, listed)
        await driver.start(resumed, launch())
        [pvc] = fake.objects("PersistentVolumeClaim", NS)
        assert pvc["metadata"]["uid"] == pvc_uid and LABEL_SNAPSHOT not in pvc["metadata"]["labels"]
        [pod] = fake.objects("Pod", NS)
        volume = next(v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v)
        assert volume["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
        mount = next(m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == volume["name"])
        assert mount["mountPath"] == "/var/lib/devin-worker"
        assert await driver.list_snapshots("orch-1", "outpost_env-1") == []
        await driver.delete_snapshot(listed)  # restored: it is the live session's volume now, not deleted
        assert fake.objects("PersistentVolumeClaim", NS)

        # Suspend again, but resume without restoring (start_fresh): an empty volume replaces it.
        snap2 = await driver.snapshot(resumed)
        await driver.teardown(resumed)
        fresh = await driver.provision(spec())
        await driver.start(fresh, launch())
        [pvc] = fake.objects("PersistentVolumeClaim", NS)
        assert pvc["metadata"]["uid"] != pvc_uid and LABEL_SNAPSHOT not in pvc["metadata"]["labels"]
        assert (
            pvc["spec"]["storageClassName"] == "fast"
            and pvc["spec"]["resources"]["requests"]["storage"] == "5Gi"
        )

        # delete_snapshot removes a kept one.
        await driver.snapshot(fresh)
        await driver.teardown(fresh)
        await driver.delete_snapshot(snap2)
        await driver.delete_snapshot(snap2)  # gone already: no error
        await driver.aclose()

    run(scenario())
    assert fake.objects("PersistentVolumeClaim", NS) == []


def test_snapshot_without_a_state_volume_is_an_error(fake: FakeKube, tmp_path: Path) -> None:
    driver = make_driver(fake, tmp_path)

    async def scenario() -> None:
        machine = await driver.provision(spec())
        try:
            with pytest.raises(DriverError, match="state_volume"):
                await driver.snapshot(machine)
        finally:
            await driver.aclose()

    run(scenario())


def test_sweep_orphans_deletes_secrets_of_sessions_not_live(fake: FakeKube, tmp_path: Path) -> None:
    driver = make_driver(fake, tmp_path, state_volume=True)
    other = make_driver(fake, tmp_path)

    async def scenario() -> int:
        for sid in ("devin-live", "devin-gone", "devin-kept"):
            await driver.start(await driver.provision(spec(sid)), launch(sid))
        await other.start(
            await other.provision(spec("devin-theirs", acceptor="orch-2")), launch("devin-theirs")
        )
        kept = await driver.list_owned("orch-1", "outpost_env-1")
        for machine in kept:
            if machine.session_id == "devin-kept":
                await driver.snapshot(machine)
        # The Pods went away without a teardown (deleted by hand); their Secrets and volumes stayed.
        for pod in fake.objects("Pod", NS):
            if "live" not in pod["metadata"]["name"]:
                del fake.store[("Pod", NS, pod["metadata"]["name"])]
        removed = await driver.sweep_orphans("orch-1", "outpost_env-1", {"devin-live"})
        await driver.aclose()
        await other.aclose()
        return removed

    removed = run(scenario())
    secrets = names(fake.objects("Secret", NS))
    assert removed == 3  # devin-gone's Secret and PVC, devin-kept's Secret
    assert any("devin-live" in n for n in secrets) and any("devin-theirs" in n for n in secrets)
    assert not any("devin-gone" in n or "devin-kept" in n for n in secrets)
    pvcs = names(fake.objects("PersistentVolumeClaim", NS))
    assert any("devin-kept" in n for n in pvcs)  # a snapshot: not an orphan
    assert not any("devin-gone" in n for n in pvcs)


def test_the_driver_reports_an_unreachable_cluster_as_a_driver_error(tmp_path: Path) -> None:
    with run_fake_kube() as server:
        config = server.kubeconfig(tmp_path / "kubeconfig")
    driver = driver_class("kubernetes").from_options(
        DriverContext(state_dir=tmp_path), {"kubeconfig": str(config), "image": IMAGE, "request_timeout": 5}
    )

    async def scenario() -> None:
        try:
            with pytest.raises(DriverError, match="Could not list pods in namespace outposts"):
                await driver.check()
        finally:
            await driver.aclose()

    run(scenario())


# -- leader election ----------------------------------------------------------------------------------


def test_leader_election_one_wins_and_the_other_takes_over(fake: FakeKube, tmp_path: Path) -> None:
    # A duration well above the renewal period, so a loaded machine does not make B take over early.
    options = {"lease_duration": 3.0, "lease_renew_interval": 0.2}
    first = make_driver(fake, tmp_path, **options)
    second = make_driver(fake, tmp_path, **options)

    async def scenario() -> None:
        lock_a = first.leadership("orch-1")
        lock_b = second.leadership("orch-1")
        assert isinstance(lock_a, LeaseLock) and isinstance(lock_b, LeaseLock)
        assert lock_a.name == lock_b.name and lock_a.identity != lock_b.identity
        await lock_a.acquire()
        lock_a.start_renewing()
        contender = asyncio.create_task(lock_b.acquire())
        # While A renews, B keeps failing: wait for several of B's attempts (each a GET of the Lease).
        reads = len([r for r in fake.requests if r.method == "GET"])
        await until(lambda: len([r for r in fake.requests if r.method == "GET"]) >= reads + 8)
        assert not contender.done()
        lease = fake.get("Lease", NS, lock_a.name)
        assert lease is not None and lease["spec"]["holderIdentity"] == lock_a.identity
        # A stops renewing without releasing (a crash): B takes over once the Lease expired.
        task = lock_a._task
        assert task is not None
        task.cancel()
        await contender
        lease = fake.get("Lease", NS, lock_a.name)
        assert lease is not None and lease["spec"]["holderIdentity"] == lock_b.identity
        assert lease["spec"]["leaseTransitions"] == 1
        # A, resuming its renewals, finds the Lease taken and sets lost.
        lock_b.start_renewing()
        lock_a.start_renewing()
        await asyncio.wait_for(lock_a.lost.wait(), timeout=30)
        assert not lock_a.leading and lock_b.leading and not lock_b.lost.is_set()
        await lock_a.release()
        await lock_b.release()
        lease = fake.get("Lease", NS, lock_a.name)
        assert lease is not None and not lease["spec"].get("holderIdentity")
        await first.aclose()
        await second.aclose()

    run(scenario())


def test_a_released_lease_is_taken_at_once_and_conflicts_are_retried(fake: FakeKube, tmp_path: Path) -> None:
    # A long duration: the takeover below can only come from the release, not from expiry.
    options = {"lease_duration": 60, "lease_renew_interval": 0.2}
    first = make_driver(fake, tmp_path, **options)
    second = make_driver(fake, tmp_path, **options)

    async def scenario() -> None:
        lock_a, lock_b = first.leadership("orch-1"), second.leadership("orch-1")
        assert lock_a is not None and lock_b is not None
        async with lock_a:
            contender = asyncio.create_task(lock_b.acquire())
            await asyncio.sleep(0)
            assert not contender.done()
        await contender
        lease = fake.get("Lease", NS, lock_b.name)
        assert lease is not None and lease["spec"]["holderIdentity"] == lock_b.identity
        conflicts = [r for r in fake.requests if r.method == "PUT"]
        assert conflicts  # every takeover and renewal is a replace with resourceVersion
        await lock_b.release()
        await first.aclose()
        await second.aclose()

    run(scenario())
    assert make_driver(fake, tmp_path, leader_election=False).leadership("orch-1") is None


def test_a_leader_that_cannot_renew_loses_the_lease(fake: FakeKube, tmp_path: Path) -> None:
    driver = make_driver(fake, tmp_path, lease_duration=1, lease_renew_interval=0.2)

    async def scenario() -> None:
        lock = driver.leadership("orch-1")
        assert lock is not None
        async with lock:
            renewals = len([r for r in fake.requests if r.method == "PUT"])
            await until(lambda: len([r for r in fake.requests if r.method == "PUT"]) >= renewals + 2)
            assert lock.leading and not lock.lost.is_set()
            fake.outage = True
            await asyncio.wait_for(lock.lost.wait(), timeout=30)
            assert not lock.leading
            fake.outage = False
        await driver.aclose()

    run(scenario())


def test_a_stale_resource_version_is_a_conflict(fake: FakeKube) -> None:
    lease = fake.put(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "l", "namespace": NS},
            "spec": {"holderIdentity": "a"},
        }
    )
    from k8s_fake import Request

    stale = {**lease, "metadata": {**lease["metadata"], "resourceVersion": "0"}}
    code, body = fake.handle(
        Request(
            "PUT", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/l", {}, "application/json", stale
        )
    )
    assert (code, body["reason"]) == (409, "Conflict")
    code, body = fake.handle(
        Request(
            "PUT", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/l", {}, "application/json", lease
        )
    )
    assert code == 200


# -- manifests, offline -----------------------------------------------------------------------------


def test_render_session_manifests_without_a_cluster() -> None:
    objs = render_session_manifests(
        spec(LONG_ID), launch(LONG_ID), options={"image": IMAGE, "namespace": "team-a", "state_volume": True}
    )
    assert [o["kind"] for o in objs] == ["Secret", "PersistentVolumeClaim", "Pod"]
    assert all(o["metadata"]["namespace"] == "team-a" and len(o["metadata"]["name"]) <= 63 for o in objs)
    assert TOKEN not in json.dumps(objs[2])


def test_rendering_needs_no_client_library() -> None:
    # A role or docs example renders the Pod where lightkube (the kubernetes extra) is not installed.
    code = (
        "import sys; sys.modules['lightkube'] = None\n"
        "from devin_outposts.orchestrator.drivers.base import SessionSpec, WorkerLaunch\n"
        "from devin_outposts.orchestrator.drivers.kubernetes import render_session_manifests\n"
        "objs = render_session_manifests(SessionSpec('devin-1', 'o', 'a'), WorkerLaunch('devin-1', 't', 'wss://g'),"
        " options={'image': 'i'})\n"
        "print([o['kind'] for o in objs])\n"
        "import devin_outposts.orchestrator.drivers.kubernetes as k\n"
        "try:\n    k.KubernetesDriver\nexcept ImportError:\n    print('no driver')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["['Secret', 'Pod']", "no driver"]


# -- every manifest against the Kubernetes schemas, offline ----------------------------------------------


def test_every_object_the_driver_sends_is_valid_offline(
    fake: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    driver = make_driver(
        fake,
        tmp_path,
        state_volume=True,
        storage_class="standard",
        workdir="/home/devin/work",  # outside the data dir: a second, subPath mount of the PVC
        pod_template={
            "metadata": {"labels": {"team": "infra"}},
            "spec": {
                "securityContext": {"fsGroup": 1000},
                "tolerations": [{"key": "sessions", "operator": "Exists"}],
                "containers": [{"name": "sidecar", "image": "sidecar:1"}],
            },
        },
        overrides={"args": ["worker", "start"], "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}},
        lease_duration=2,
        lease_renew_interval=0.5,
    )

    async def scenario() -> None:
        machine = await driver.provision(spec(LONG_ID))
        await driver.start(machine, launch(LONG_ID))
        await driver.snapshot(machine)
        lock = driver.leadership("orch-1")
        assert lock is not None
        async with lock:
            pass
        await driver.aclose()

    run(scenario())
    sent = [r.body for r in fake.requests if r.method in ("POST", "PUT")]
    kinds = sorted({body["kind"] for body in sent})
    assert kinds == ["Lease", "PersistentVolumeClaim", "Pod", "Secret"]
    rendered = render_session_manifests(
        spec(LONG_ID), launch(LONG_ID), options={"image": IMAGE, "state_volume": True}
    )
    monkeypatch.setattr("socket.socket.connect", no_network)
    for version in SCHEMA_VERSIONS:
        for body in [*sent, *rendered]:
            kubernetes_validate.validate(body, version, strict=True)
    # The validator does reject what is wrong (here an unknown field), so the loop above can fail.
    [pod] = [b for b in sent if b["kind"] == "Pod"]
    broken = json.loads(json.dumps(pod))
    broken["spec"]["containers"][0]["restartPolicyy"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, SCHEMA_VERSIONS[-1], strict=True)
    mounts = {m["mountPath"]: m.get("subPath") for m in pod["spec"]["containers"][-1]["volumeMounts"]}
    assert mounts == {"/var/lib/devin-worker": None, "/home/devin/work": "repos"}
