"""The ``podman`` driver under issue 24's findings, for real (rootful podman, the session image).

* hardening: no new privileges, no capabilities, default memory, CPU and pids limits, and the connect
  token nowhere in ``podman inspect`` (checked in ``/proc/<pid>/status`` of every process of the
  container, and from inside, by a tool call of the session it still serves);
* concurrent teardowns: each session's teardown lists and removes its own volumes only, so that another
  session's teardown removing its volumes meanwhile never fails it (``podman volume ls`` inspects every
  volume it lists, and fails on one removed under it).

Assertions are on what podman and ``/proc`` report, and on the simulator's records of the session.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from test_orchestrator_podman import (
    Podman,
    needs_podman,
    pod,
    podman,
    processes_holding,
    run,
    session_image,
)

from devin_outposts.api.models import Outpost
from devin_outposts.orchestrator.drivers import driver_class
from devin_outposts.orchestrator.drivers.base import LABEL_ACCEPTOR, DriverContext
from devin_outposts.orchestrator.drivers.podman import PodmanDriver
from devin_outposts.orchestrator.drivers.podman.objects import ids_label
from devin_outposts_sim.remote import tools
from devin_outposts_sim.testing import SimHandle

__all__ = ["pod", "session_image"]


@needs_podman
def test_concurrent_teardowns_never_depend_on_each_others_volumes(pod: Podman) -> None:
    """Ten machines torn down at once, ten times over: on podman 4.3 a listing of every session's volumes
    failed in about one round in three ("Could not list state volumes: no volume with name ... found")."""

    async def round_of(n: int) -> list[Any]:
        specs = [pod.spec(f"devin-teardown-{n}-{i}") for i in range(10)]
        machines = await asyncio.gather(*(pod.driver.provision(spec) for spec in specs))
        return await asyncio.gather(*(pod.driver.teardown(m) for m in machines), return_exceptions=True)

    failures = [str(r) for n in range(10) for r in run(round_of(n)) if isinstance(r, BaseException)]
    assert failures == []
    assert pod.leftovers() == {"containers": [], "volumes": [], "files": []}


def _token_secrets_of(acceptor: str) -> list[str]:
    """The podman secrets labelled with ``acceptor`` (podman 4.3 lists secrets without labels)."""
    found = []
    for name in podman("secret", "ls", "--format", "{{.Name}}").stdout.split():
        inspected = podman("secret", "inspect", name, check=False)
        if inspected.returncode == 0 and acceptor in inspected.stdout:
            found.append(name)
    return found


def _status_fields(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, dummy, v in (line.partition(":") for line in lines)}


@needs_podman
def test_a_session_container_is_hardened_limited_and_keeps_the_token_out_of_inspect(
    session_image: str, sim: SimHandle, outpost: Outpost, machine_token: str, tmp_path: Path
) -> None:
    """With the driver's defaults (no limit options given): no new privileges, no capability, stated
    memory, CPU and pids limits, and the connect token nowhere in ``podman inspect``; the session is
    served all the same."""
    state_dir = tmp_path / "orchestrator"
    state_dir.mkdir(mode=0o700)
    options = {"image": session_image, "network": "host", "stop_grace": 2}
    driver = driver_class("podman").from_options(DriverContext(state_dir=state_dir), options)
    assert isinstance(driver, PodmanDriver)
    acceptor = f"podman-hardening-{os.urandom(4).hex()}"
    harness = Podman(driver, state_dir / "podman", acceptor, sim, outpost, machine_token)
    try:
        run(driver.check())
        sid = sim.admin.enqueue(outpost.outpost_id).session_id
        launch = harness.claim(sid)
        machine = run(driver.provision(harness.spec(sid)))
        run(driver.start(machine, launch))
        sim.admin.wait_connection(sid, timeout=60)
        sim.admin.add_calls(sid, [tools.run("grep -E '^(NoNewPrivs|CapEff|CapBnd)' /proc/self/status")])
        [call] = sim.admin.wait_calls(sid, timeout=60)
        assert call["result"]["output"].split() == [
            "CapEff:", "0000000000000000", "CapBnd:", "0000000000000000", "NoNewPrivs:", "1",
        ]  # fmt: skip

        inspected = podman("container", "inspect", machine.name).stdout
        assert launch.connect_token not in inspected
        host = json.loads(inspected)[0]["HostConfig"]
        assert (host["Memory"], host["NanoCpus"], host["PidsLimit"]) == (4 * 2**30, 2 * 10**9, 4096)
        # Every process of the container, seen from the host.
        pids = [int(p) for p in podman("top", machine.name, "hpid").stdout.split()[1:]]
        assert len(pids) >= 3  # the init, the worker, the remote
        for pid in pids:
            status = _status_fields(pid)
            assert (status["NoNewPrivs"], status["CapEff"], status["CapBnd"]) == (
                "1",
                "0000000000000000",
                "0000000000000000",
            ), pid
        assert processes_holding(launch.connect_token, where="cmdline") == []
        assert _token_secrets_of(acceptor) == []  # made for the create, gone right after
        run(driver.teardown(machine))
        assert harness.leftovers() == {"containers": [], "volumes": [], "files": []}
    finally:
        label = f"label={LABEL_ACCEPTOR}={acceptor}"
        listed = podman("ps", "-a", "--filter", label, "--format", "{{.Names}}", check=False)
        for name in listed.stdout.split():
            podman("rm", "--force", "--time", "1", name, check=False)
        listed = podman("volume", "ls", "--filter", label, "--format", "{{.Name}}", check=False)
        for name in listed.stdout.split():
            podman("volume", "rm", name, check=False)


@needs_podman
def test_a_token_secret_left_by_a_dead_orchestrator_is_swept(pod: Podman) -> None:
    """The secret lives from its creation to the container's: an orchestrator killed in between leaves
    it, and the sweep removes it (ours only: by its labels)."""
    labels = {**pod.spec("devin-left-secret").labels(), "outposts.devin.ai/ids": ids_label(
        "devin-left-secret", pod.outpost.outpost_id, pod.acceptor
    )}  # fmt: skip
    run(pod.driver.secrets.create("outpost-session-token-00112233aabbccdd", "ct_left_behind", labels))
    assert _token_secrets_of(pod.acceptor) == ["outpost-session-token-00112233aabbccdd"]
    assert run(pod.driver.sweep_orphans(pod.acceptor, pod.outpost.outpost_id, set())) == 1
    assert _token_secrets_of(pod.acceptor) == []
