"""What a network policy allows: every case of netpolicy_cases.yaml against core/netpolicy/policy.py, and
the helpers the proxy and the CLI use (the gateway's endpoint, host normalisation)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from devin_outposts.core.netpolicy.policy import (
    Policy,
    PolicyError,
    gateway_endpoint,
    ip_literal,
    normalise_host,
)

CASES = yaml.safe_load((Path(__file__).parent / "netpolicy_cases.yaml").read_text(encoding="utf-8"))


def check_id(check: dict[str, Any]) -> str:
    where = f"{check['host']!r}:{check.get('port', 443)}"
    if "address" in check:
        where += f" at {check['address']}"
    return f"{where} -> {'allowed' if check['allowed'] else 'denied'}"


def case_checks() -> list[Any]:
    return [
        pytest.param(case, check, id=f"{case['name']} | {check_id(check)}")
        for case in CASES
        for check in case.get("checks", [])
    ]


@pytest.mark.parametrize(("case", "check"), case_checks())
def test_decision(case: dict[str, Any], check: dict[str, Any]) -> None:
    policy = Policy.from_spec(case["policy"], case.get("gateway"))
    port = check.get("port", 443)
    if "address" in check:
        decision = policy.check_address(check["host"], port, check["address"])
    else:
        decision = policy.check_name(check["host"], port)
    assert (decision.allowed, decision.rule) == (check["allowed"], check["rule"]), decision.describe()
    verdict = "allowed" if check["allowed"] else "denied"
    assert decision.describe().startswith(f"{verdict} by {check['rule']}: ")


@pytest.mark.parametrize("case", [c for c in CASES if "error" not in c], ids=lambda case: case["name"])
def test_ignored_rules(case: dict[str, Any]) -> None:
    policy = Policy.from_spec(case["policy"], case.get("gateway"))
    expected = case.get("ignored", [])
    assert len(policy.ignored) == len(expected), policy.ignored
    for entry, text in zip(policy.ignored, expected):
        assert text in entry


@pytest.mark.parametrize("case", [c for c in CASES if "error" in c], ids=lambda case: case["name"])
def test_not_a_policy(case: dict[str, Any]) -> None:
    with pytest.raises(PolicyError, match=case["error"]):
        Policy.from_spec(case["policy"])


def test_every_rule_kind_is_in_the_table() -> None:
    """The table covers what the docstring promises (a guard against a case dropped by accident)."""
    rules = {check["rule"].split(" ")[0] for case in CASES for check in case.get("checks", [])}
    assert {"hostname", "ipv4", "ipv6", "default", "rebinding", "the", "no"} <= rules


@pytest.mark.parametrize(
    ("url", "endpoint"),
    [
        ("wss://gw.example/ws", ("gw.example", 443)),
        ("https://GW.example.:8443", ("gw.example", 8443)),
        ("ws://gw.example", ("gw.example", 80)),
        ("http://[2001:db8::1]:81/x", ("2001:db8::1", 81)),
    ],
)
def test_gateway_endpoint(url: str, endpoint: tuple[str, int]) -> None:
    assert gateway_endpoint(url) == endpoint


def test_gateway_without_host() -> None:
    with pytest.raises(PolicyError, match="has no host"):
        gateway_endpoint("wss:///ws")


def test_normalise_and_literal() -> None:
    assert normalise_host(" [2001:DB8::1] ") == "2001:db8::1"
    assert normalise_host("Example.COM.") == "example.com"
    assert str(ip_literal("[::ffff:10.0.0.1]")) == "10.0.0.1"
    assert ip_literal("example.com") is None
