"""The session Pod the ``kubernetes`` driver renders, run for real with ``podman kube play``.

No Kubernetes cluster can run here, but podman runs a Pod manifest with its Secret: this shows that the
Pod and Secret :func:`render_session_manifests` produces start our worker in direct-serve mode, which
serves a session claimed on the fleet simulator (the stand-in ``devin-remote`` connects to the gateway
with the connect token from the Secret and runs the tool calls the test scripts), exits 0 when the session
ends, and that ``podman kube down`` leaves nothing behind.

The image is the podman driver's session image (scripts/test-hosts/build-session-image.sh: the Debian
test-host root filesystem plus this checkout's ``devin-outposts`` wheel, built offline and cached by a
hash of its inputs), which is also what python/devin-outposts/Containerfile builds for users.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import httpx
import pytest
from test_orchestrator_podman import IN_CI, WHY_NOT, session_image

from devin_outposts.api.models import Outpost
from devin_outposts.orchestrator.drivers.base import SessionSpec, WorkerLaunch
from devin_outposts.orchestrator.drivers.kubernetes import render_session_manifests
from devin_outposts_sim.remote import tools
from devin_outposts_sim.testing import SimHandle
from devin_outposts_sim.testing.remote import claim_session

from netpolicy_harness import (
    LOOPBACK_POLICY,
    Upstream,
    assert_confined,
    client_calls_in_a_machine,
    confinement_plan,
)

PACKAGE = Path(__file__).resolve().parents[1]
NAMESPACE = "outposts"
NEVER = "Never"
PODMAN = shutil.which("podman") or "podman"

# The podman driver's tests own the checks and the image: skipped without podman or root on a developer's
# machine, failed in CI; the image is scripts/test-hosts/build-session-image.sh's (built once, cached).
pytestmark = [
    pytest.mark.skipif(WHY_NOT is not None and not IN_CI, reason=WHY_NOT or ""),
    pytest.mark.timeout(300),
]
__all__ = ["session_image"]


def podman(
    *args: str, check: bool = True, input_bytes: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [PODMAN, *args], input=input_bytes.decode() if input_bytes else None,
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed ({result.returncode}): {result.stderr[-2000:]}")
    return result


def _yaml(objects: list[dict[str, Any]]) -> str:
    # JSON documents are YAML documents.
    return "\n---\n".join(json.dumps(obj) for obj in objects) + "\n"


def _names(*args: str) -> list[str]:
    return podman(*args).stdout.split()


@dataclass
class Played:
    """One session Pod running under podman, with what it was made from."""

    pod: dict[str, Any]
    manifest: Path
    secret_name: str
    volume: str = ""

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def container(self) -> str:
        # podman names a kube Pod's containers <pod>-<container>.
        return f"{self.name}-{self.pod['spec']['containers'][-1]['name']}"


@dataclass
class PodmanKube:
    """Plays rendered session Pods; removes everything it made at the end, whatever happened."""

    sim: SimHandle
    outpost: Outpost
    token: str
    image: str
    tmp: Path
    played: list[Played] = field(default_factory=list)
    volumes: set[str] = field(default_factory=set)

    def play(
        self, sid: str, acceptor: str, container: Optional[dict[str, Any]] = None, **options: Any
    ) -> Played:
        """Claim ``sid`` and play its Pod; ``container``: more of the worker container's template."""
        claim = claim_session(self.sim.url, self.token, sid, acceptor)
        assert claim.status.connect_token and claim.status.gateway_url
        spec = SessionSpec(session_id=sid, outpost_id=self.outpost.outpost_id, acceptor_id=acceptor)
        policy = claim.spec.network_policy
        launch = WorkerLaunch(
            session_id=sid,
            connect_token=claim.status.connect_token.get_secret_value(),
            gateway_url=claim.status.gateway_url,
            static_base_url=self.sim.static_base_url,
            # As the orchestrator hands it over (machine.py): the worker in the Pod enforces it.
            network_policy=policy.model_dump(mode="json") if policy is not None else None,
        )
        objects = render_session_manifests(
            spec,
            launch,
            options={
                "namespace": NAMESPACE,
                "image": self.image,
                # A local image: never pulled.
                "pod_template": {
                    "spec": {
                        "containers": [
                            {"name": "devin-worker", "imagePullPolicy": "Never", **(container or {})}
                        ]
                    }
                },
                **options,
            },
        )
        # A policy session's NetworkPolicy (between the two) is not played: podman has no network plugin
        # that enforces one, and the session is confined by the worker in the Pod all the same.
        secret, pod = objects[0], objects[-1]
        assert (secret["kind"], pod["kind"]) == ("Secret", "Pod")
        manifest = self.tmp / f"{pod['metadata']['name']}-{len(self.played)}.yaml"
        manifest.write_text(_yaml([pod]))
        played = Played(pod, manifest, secret["metadata"]["name"])
        for volume in pod["spec"].get("volumes") or []:
            if "persistentVolumeClaim" in volume:
                # podman backs a persistentVolumeClaim with the named volume of the claim's name.
                played.volume = volume["persistentVolumeClaim"]["claimName"]
                self.volumes.add(played.volume)
        self.played.append(played)
        # The Secret becomes a podman secret holding the Secret's ``data`` as JSON (base64 values), which
        # is what podman's secretKeyRef reads. Not through `kube play` itself: podman 4.3 (Debian 12)
        # stores a Secret from a kube file as YAML and then cannot read it back (podman issue #16269,
        # fixed in 4.4). The token goes through stdin, never argv.
        podman("secret", "create", played.secret_name, "-", input_bytes=json.dumps(secret["data"]).encode())
        # --network host: the worker reaches the simulator on 127.0.0.1.
        podman("kube", "play", "--network", "host", str(manifest))
        assert podman("pod", "exists", played.name, check=False).returncode == 0
        return played

    def exit_state(self, played: Played) -> Optional[list[str]]:
        state = podman(
            "inspect", played.container, "--format", "{{.State.Status}} {{.State.ExitCode}}", check=False
        )
        return state.stdout.split() if state.returncode == 0 and state.stdout.startswith("exited") else None

    def down(self, played: Played) -> None:
        """What teardown does: the Pod and its Secret go; a volume stays (it is the PVC)."""
        podman("kube", "down", str(played.manifest))
        podman("secret", "rm", played.secret_name)
        self.played.remove(played)

    def leftovers(self, played: Played) -> dict[str, list[str]]:
        return {
            "pods": [p for p in _names("pod", "ps", "--format", "{{.Name}}") if p == played.name],
            "containers": [
                c for c in _names("ps", "-a", "--format", "{{.Names}}") if c.startswith(played.name)
            ],
            "secrets": [
                s for s in _names("secret", "ls", "--format", "{{.Name}}") if s == played.secret_name
            ],
            "volumes": [v for v in _names("volume", "ls", "--format", "{{.Name}}") if v == played.volume],
        }

    def cleanup(self) -> None:
        for played in self.played:
            podman("kube", "down", str(played.manifest), check=False)
            podman("secret", "rm", played.secret_name, check=False)
        for volume in self.volumes:
            podman("volume", "rm", "--force", volume, check=False)


@pytest.fixture
def kube(
    sim: SimHandle, outpost: Outpost, machine_token: str, session_image: str, tmp_path: Path
) -> Iterator[PodmanKube]:
    handle = PodmanKube(sim, outpost, machine_token, session_image, tmp_path)
    try:
        yield handle
    finally:
        handle.cleanup()


def _run(sim: SimHandle, sid: str, command: str) -> dict[str, Any]:
    calls = sim.admin.add_calls(sid, [tools.run(command)])
    done = [c for c in sim.admin.wait_calls(sid, timeout=90) if c["id"] == calls[0]["id"]]
    assert len(done) == 1 and done[0]["state"] == "done", done
    result: dict[str, Any] = done[0]["result"]
    return result


@pytest.mark.timeout(300)  # the first run builds the image (about 15 s here)
def test_the_rendered_session_pod_serves_a_session_under_podman_kube_play(
    sim: SimHandle, outpost: Outpost, kube: PodmanKube, wait_until: Callable[..., Any]
) -> None:
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    acceptor = "k8s-podman-proof"
    played = kube.play(sid, acceptor)

    connection = sim.admin.wait_connection(sid, timeout=90)
    assert connection["acceptor_id"] == acceptor  # the claim whose token the stand-in used
    assert connection["cwd"] == "/var/lib/devin-worker/repos"
    assert "DEVIN_OUTPOSTS_TOKEN" not in connection["env"]
    result = _run(sim, sid, "echo served-in-a-pod; pwd")
    assert result["exit_code"] == 0, result
    assert result["output"].split() == ["served-in-a-pod", "/var/lib/devin-worker/repos"]

    sim.admin.end_session(sid, "terminated")
    assert wait_until(lambda: kube.exit_state(played), timeout=60) == ["exited", "0"]
    # The worker ran in direct-serve mode: the fleet API saw only the test's claim, no worker's claim.
    assert {c["acceptor_id"] for c in sim.admin.claims(session_id=sid)} == {acceptor}

    kube.down(played)
    assert kube.leftovers(played) == {"pods": [], "containers": [], "secrets": [], "volumes": []}


@pytest.mark.timeout(300)
def test_a_kept_state_volume_carries_the_repos_into_the_resumed_session_pod(
    sim: SimHandle, outpost: Outpost, kube: PodmanKube, machine_token: str, wait_until: Callable[..., Any]
) -> None:
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    acceptor = "k8s-podman-resume"
    first = kube.play(sid, acceptor, state_volume=True)
    assert first.volume.startswith("outpost-state-")
    sim.admin.wait_connection(sid, timeout=90)
    assert _run(sim, sid, "echo written-before-suspend > note.txt")["exit_code"] == 0

    # Suspended: the worker exits 0, the Pod and Secret go, the volume (the kept PVC) stays.
    sim.admin.end_session(sid, "suspended")
    assert wait_until(lambda: kube.exit_state(first), timeout=60) == ["exited", "0"]
    kube.down(first)
    assert kube.leftovers(first)["volumes"] == [first.volume]
    release = httpx.post(
        f"{sim.url}/opbeta/outposts/devins/{sid}/release",
        json={"acceptor_id": acceptor},
        headers={"Authorization": f"Bearer {machine_token}"},
        timeout=10,
    )
    assert release.status_code == 200, release.text

    # The session comes back (kind=resume); its new Pod mounts the same claim name, so the same volume.
    sim.admin.tombstone(sid)
    sim.admin.enqueue(outpost.outpost_id, session_id=sid, kind="resume")
    second = kube.play(sid, acceptor, state_volume=True)
    assert second.volume == first.volume
    sim.admin.wait_connection(sid, count=2, timeout=90)
    result = _run(sim, sid, "cat note.txt; pwd")
    assert result["output"].split() == ["written-before-suspend", "/var/lib/devin-worker/repos"], result

    sim.admin.end_session(sid, "terminated")
    assert wait_until(lambda: kube.exit_state(second), timeout=60) == ["exited", "0"]
    kube.down(second)
    podman("volume", "rm", second.volume)  # what teardown does to a PVC that is not kept
    assert kube.leftovers(second) == {"pods": [], "containers": [], "secrets": [], "volumes": []}


@pytest.mark.timeout(300)
def test_the_rendered_pod_confines_a_policy_session_under_podman_kube_play(
    sim: SimHandle, outpost: Outpost, kube: PodmanKube, wait_until: Callable[..., Any]
) -> None:
    """The worker in the rendered Pod confines a policy session as on a host, under a runtime whose default
    seccomp profile allows user namespaces (podman's, as CRI-O's), with every capability dropped and no
    privilege escalation (docs/orchestrator-kubernetes.md, "Network policy"): what the policy allows is
    reached on the host's loopback, the rest is refused, and the denied upstream records nothing."""
    allowed, denied = Upstream("allowed"), Upstream("denied", host="127.0.0.2")
    try:
        policy = LOOPBACK_POLICY
        sid = sim.admin.enqueue(outpost.outpost_id, network_policy=policy).session_id
        locked_down = {
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        }
        played = kube.play(sid, "k8s-podman-policy", container=locked_down)
        worker = played.pod["spec"]["containers"][-1]
        assert worker["securityContext"] == locked_down["securityContext"]
        sim.admin.wait_connection(sid, timeout=90)
        sim.admin.add_calls(sid, client_calls_in_a_machine(confinement_plan(allowed, denied)))
        calls = sim.admin.wait_calls(sid, timeout=90)
        assert [c["state"] for c in calls] == ["done", "done"], calls
        assert_confined(calls[1]["result"]["output"], allowed, denied)
        # It still reaches its gateway, and ends cleanly.
        sim.admin.end_session(sid, "terminated")
        assert wait_until(lambda: kube.exit_state(played), timeout=60) == ["exited", "0"]
        kube.down(played)
        assert kube.leftovers(played) == {"pods": [], "containers": [], "secrets": [], "volumes": []}
    finally:
        allowed.close()
        denied.close()
