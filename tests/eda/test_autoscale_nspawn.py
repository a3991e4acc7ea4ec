# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""The autoscale rulebook, for real: ansible-rulebook watches a fleet simulator's queue; a session waits longer
than the threshold; the rulebook runs devin.outposts.scale_workers, which converges one more worker instance on a
systemd-nspawn test host (scripts/test-hosts/); that worker claims the session; after the quiet period the
rulebook removes the instance again.

Needs root, systemd-nspawn, the test-host images (scripts/test-hosts/build-images.sh, which
scripts/stages/eda.sh runs first), ansible-rulebook and Java 17: skipped without them, failed when CI=true.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from devin_outposts_sim.admin_client import SimAdmin

from prerequisites import TEST_HOSTS
from prerequisites import TEST_HOSTS_CACHE as CACHE

HOST = "eda-autoscale"


@pytest.fixture
def run_dir() -> Iterator[Path]:
    """This test's own run directory for nspawn-host.sh (pids, relays, ssh control sockets): short, since a
    unix socket's path has at most 107 bytes, and private, so no other checkout's host of the same name is
    touched."""
    path = Path(tempfile.mkdtemp(prefix="eda-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _script(run_dir: Path, *argv: str) -> str:
    return subprocess.run(
        [str(TEST_HOSTS / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        env=dict(
            os.environ, DEVIN_OUTPOSTS_TEST_HOSTS=str(CACHE), DEVIN_OUTPOSTS_TEST_HOSTS_RUN=str(run_dir)
        ),
    ).stdout


@pytest.fixture
def fleet(nspawn_host_prerequisites: None, tmp_path: Path, run_dir: Path) -> Iterator[dict[str, Any]]:
    """The simulator and the stand-in devin-remote downloads (fleet-sim.sh), and one booted test host that
    reaches both on its own loopback at the same ports."""
    state = tmp_path / "fleet"
    _script(run_dir, "fleet-sim.sh", "start", str(state))
    try:
        info = json.loads((state / "sim.json").read_text())
        _script(run_dir, "nspawn-host.sh", "start", HOST, "bookworm")
        try:
            for port in (info["port"], info["static_port"]):
                _script(run_dir, "nspawn-host.sh", "relay", HOST, str(port), str(port))
            yield info
        finally:
            _script(run_dir, "nspawn-host.sh", "stop", HOST)
    finally:
        _script(run_dir, "fleet-sim.sh", "stop", str(state))


def _on_host(run_dir: Path, command: str) -> str:
    """``command``'s output on the test host (as root, through nsenter into its PID 1's namespaces)."""
    leader = (run_dir / HOST / "leader.pid").read_text().strip()
    return subprocess.run(
        ["nsenter", "-t", leader, "-a", "sh", "-c", command],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    ).stdout.strip()


@pytest.mark.timeout(900)
def test_a_long_wait_adds_a_worker_instance_and_a_quiet_period_removes_it(
    fleet: dict[str, Any], run_rulebook: Callable[..., Any], tmp_path: Path, run_dir: Path
) -> None:
    admin = SimAdmin(fleet["url"], Path(fleet["admin_token_file"]).read_text().strip())
    outpost = admin.create_outpost("eda-autoscale", "linux")
    token = admin.create_token("machine")
    sid = admin.enqueue(outpost.outpost_id).session_id  # waits: nobody serves the outpost yet
    state_file = tmp_path / "scale" / "eda-autoscale.yml"
    host_vars = {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(CACHE / "ssh" / "id_ed25519"),
        "ansible_ssh_common_args": (
            f"-o 'ProxyCommand=env DEVIN_OUTPOSTS_TEST_HOSTS_RUN={run_dir} {TEST_HOSTS}/nspawn-host.sh proxy %h' "
            "-o StrictHostKeyChecking=no "
            f"-o UserKnownHostsFile=/dev/null -o IdentitiesOnly=yes -o ControlPath={run_dir}/cp-%C"
        ),
        "ansible_python_interpreter": "auto_silent",
        # The host has no network: the worker's dependencies come from the test hosts' wheelhouse, the
        # devin-remote stand-in from the relayed static server.
        "devin_outposts_worker_wheelhouse": str(CACHE / "wheelhouse-py311"),
        "devin_outposts_worker_static_base_url": f"http://127.0.0.1:{fleet['static_port']}/",
        "devin_outposts_worker_controller_cache_dir": str(tmp_path / "controller-cache"),
        "devin_outposts_worker_drain_timeout": 5,
    }
    inventory = yaml.safe_dump(
        {
            "all": {
                "hosts": {
                    "localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
                }
            },
            "eda_workers": {"hosts": {HOST: host_vars}},
        }
    )
    variables = {
        "autoscale_outpost": "eda-autoscale",
        "autoscale_target": "eda_workers",
        "autoscale_scale_up_after": 2,
        "autoscale_scale_down_after": 20,
        "autoscale_min": 0,
        "autoscale_max": 2,
        "autoscale_interval": 1,
        "autoscale_state_file": str(state_file),
    }
    rulebook = run_rulebook("autoscale_workers", variables, inventory, fleet["url"], token)

    # Scale up: the count is recorded only after the deploy succeeded.
    rulebook.wait_until(
        lambda: state_file.exists() and "count: 1" in state_file.read_text(),
        "a scale-up to one instance",
        timeout=600,
    )
    assert _on_host(run_dir, "systemctl is-active devin-outposts-worker@autoscale-1.service") == "active"
    claims = rulebook.wait_until(
        lambda: [c for c in admin.claims(session_id=sid) if c["action"] == "claim"],
        f"a claim of {sid}",
        timeout=120,
    )
    assert claims[0]["acceptor_id"]
    assert (
        _on_host(run_dir, "ls /etc/systemd/system/multi-user.target.wants/ | grep -c devin-outposts-worker@")
        == "1"
    )

    # Scale down after the quiet period: the instance drains, releases its claim and is removed.
    admin.end_session(sid)
    rulebook.wait_until(lambda: "count: 0" in state_file.read_text(), "a scale-down to zero", timeout=400)
    assert _on_host(run_dir, "systemctl is-active devin-outposts-worker@autoscale-1.service") != "active"
    assert oct(state_file.stat().st_mode & 0o777) == "0o600"
    assert token not in rulebook.text()
