"""The ``podman`` driver under issue 24's findings, for real (rootful podman, the session image).

* concurrent teardowns: each session's teardown lists and removes its own volumes only, so that another
  session's teardown removing its volumes meanwhile never fails it (``podman volume ls`` inspects every
  volume it lists, and fails on one removed under it).

Assertions are on what podman reports (``podman ps``/``volume ls`` by the test's acceptor label).
"""

from __future__ import annotations

import asyncio
from typing import Any

from test_orchestrator_podman import Podman, needs_podman, pod, run, session_image

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
