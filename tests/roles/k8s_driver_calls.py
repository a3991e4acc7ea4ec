"""Run the ``kubernetes`` driver through every call it has against the package's fake API server, and print
the RBAC rules those requests need, as JSON: ``[[api group, resource, verb], ...]``.

test_k8s_manifests.py compares them with the Role the orchestrator role renders. It runs as its own process:
that test forbids sockets in its own, and the fake serves on loopback.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python/devin-outposts/tests"))

from k8s_fake import FakeKube, Request, run_fake_kube  # noqa: E402

from devin_outposts.orchestrator.drivers import driver_class  # noqa: E402
from devin_outposts.orchestrator.drivers.base import DriverContext, SessionSpec, WorkerLaunch  # noqa: E402
from devin_outposts.orchestrator.drivers.status_board import StatusBoard  # noqa: E402

_PATH = re.compile(r"^/(?:api/v1|apis/([^/]+)/v1)/namespaces/[^/]+/([a-z]+)(/[^/]+)?$")
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
POLICY = {"enabled": True, "allow": [{"hostname": "github.com"}, {"ipv4": "10.0.0.0/8"}]}


def rule(request: Request) -> tuple[str, str, str]:
    """The (api group, resource, verb) an API server's authorizer checks for ``request``."""
    match = _PATH.match(request.path)
    if match is None:
        raise AssertionError(f"not a namespaced object path: {request.path}")
    group, resource, named = match.group(1) or "", match.group(2), match.group(3)
    if request.method == "GET":
        verb = "get" if named else "watch" if request.query.get("watch") else "list"
    else:
        verb = _VERBS[request.method]
    return group, resource, verb


async def every_call(fake: FakeKube, directory: Path) -> None:
    """Each driver call, with every option that makes it ask the cluster for more (state_volume, a policy)."""
    options: dict[str, Any] = {
        "kubeconfig": str(fake.kubeconfig(directory / "kubeconfig")),
        "image": "registry.example/session:1",
        "state_volume": True,
        "lease_duration": 2,
        "lease_renew_interval": 0.5,
    }
    driver = driver_class("kubernetes").from_options(DriverContext(state_dir=directory), options)
    spec = SessionSpec("devin-1", "outpost_env-1", "orch-1", network_policy=POLICY)
    launch = WorkerLaunch("devin-1", "ct_x", "wss://gateway.example", network_policy=POLICY)
    await driver.check()
    lock = driver.leadership("orch-1")
    assert lock is not None
    async with lock:
        machine = await driver.provision(spec)
        await driver.start(machine, launch)
        await driver.status(machine)
        await driver.list_owned("orch-1", "outpost_env-1")
        snapshot = await driver.snapshot(machine)
        await driver.teardown(machine)
        await driver.list_snapshots("orch-1", "outpost_env-1")
        machine = await driver.provision(spec)
        await driver.restore(machine, snapshot)
        await driver.start(machine, launch)  # the Pod, Secret and NetworkPolicy of the last start replaced
        await driver.start(machine, launch)
        await driver.sweep_orphans("orch-1", "outpost_env-1", set())
        await driver.teardown(machine)
        await driver.delete_snapshot(snapshot)
        await follow_pods(fake, driver)
    await driver.aclose()


async def follow_pods(fake: FakeKube, driver: Any) -> None:
    """The Pod status watch (list, then watch), until its first watch request."""
    source = driver.status_source("orch-1")
    assert source is not None
    task = asyncio.ensure_future(source.run(StatusBoard()))
    deadline = asyncio.get_running_loop().time() + 60
    while not fake.count("watch"):
        if asyncio.get_running_loop().time() > deadline or task.done():
            raise AssertionError("the pod watch did not start")
        await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def main() -> None:
    with run_fake_kube() as fake:
        asyncio.run(every_call(fake, Path(sys.argv[1])))
        print(json.dumps(sorted({rule(request) for request in fake.requests})))


if __name__ == "__main__":
    main()
