"""A direct-serve worker never sees the claim: the orchestrator hands each session's network policy to the
worker in its machine through the environment, and the worker reads it back as the claim had it."""

from __future__ import annotations

import argparse
import json

import pytest

from devin_outposts.core.config import ConfigError
from devin_outposts.core.netpolicy.confinement import ENV_SESSION_NETWORK_POLICY
from devin_outposts.orchestrator.drivers.base import WorkerLaunch
from devin_outposts.worker import options as worker_options

POLICY = {
    "enabled": True,
    "allow": [{"hostname": "*.github.com", "ipv4": None, "ipv6": None}, {"ipv4": "10.0.0.0/8"}],
}


def direct_config(env: dict[str, str]) -> worker_options.WorkerConfig:
    parser = argparse.ArgumentParser()
    worker_options.add_start_arguments(parser)
    args = parser.parse_args(["--session", "devin-1"])
    base = {"DEVIN_REMOTE_SESSION_TOKEN": "ct_x", "DEVIN_OUTPOST_GATEWAY_URL": "wss://gw.example"}
    return worker_options.build_config(args, {**base, **env})


def test_the_launch_carries_the_policy_and_the_worker_reads_it_back() -> None:
    launch = WorkerLaunch(
        session_id="devin-1", connect_token="ct_x", gateway_url="wss://gw.example", network_policy=POLICY
    )
    env = launch.environment()
    assert json.loads(env[ENV_SESSION_NETWORK_POLICY]) == POLICY
    assert direct_config(env).session_network_policy == POLICY


def test_a_session_without_a_policy_hands_none_over() -> None:
    env = WorkerLaunch(
        session_id="devin-1", connect_token="ct_x", gateway_url="wss://gw.example"
    ).environment()
    assert ENV_SESSION_NETWORK_POLICY not in env
    assert direct_config(env).session_network_policy is None


@pytest.mark.parametrize("raw", ["{not json", "[]", '"enabled"'])
def test_a_policy_that_cannot_be_read_stops_the_worker(raw: str) -> None:
    with pytest.raises(ConfigError, match=ENV_SESSION_NETWORK_POLICY):
        direct_config({ENV_SESSION_NETWORK_POLICY: raw})
