"""``devin-outposts network-policy check``, run as the real command: what it prints and its exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

POLICY = json.dumps(
    {
        "enabled": True,
        "allow": [{"hostname": "*.example.com"}, {"ipv4": "10.0.0.0/8"}, {"port": 443}],
    }
)


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devin_outposts", "network-policy", "check", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_allowed_name_exits_0_and_says_which_rule() -> None:
    done = check(POLICY, "api.example.com")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert (
        "api.example.com:443: allowed by hostname *.example.com: api.example.com matches *.example.com"
        in lines
    )
    assert any(line.startswith("ignored: rule 2 ") and "unknown key(s) port" in line for line in lines)
    assert done.stderr == ""


def test_a_denied_name_exits_1() -> None:
    done = check(POLICY, "evil.test:22")
    assert done.returncode == 1
    assert "evil.test:22: denied by default deny: no rule allows evil.test" in done.stdout.splitlines()


def test_each_address_is_judged_and_one_allowed_address_is_enough() -> None:
    done = check(POLICY, "api.example.com", "--address", "127.0.0.1", "--address", "10.1.2.3")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(
        line.startswith("api.example.com:443 at 127.0.0.1: denied by rebinding guard: ") for line in lines
    )
    assert "api.example.com:443 at 10.1.2.3: allowed by ipv4 10.0.0.0/8: 10.1.2.3 is in 10.0.0.0/8" in lines


def test_only_refused_addresses_exit_1() -> None:
    done = check(POLICY, "api.example.com", "--address", "192.168.1.1", "--address", "[fd00::1]")
    assert done.returncode == 1
    assert sum(" denied by rebinding guard: " in line for line in done.stdout.splitlines()) == 2


def test_without_addresses_nothing_is_resolved() -> None:
    """A name that cannot resolve is judged by name only: no address line, no lookup error."""
    done = check(POLICY, "nowhere.example.com")
    assert done.returncode == 0, done.stderr
    assert not any(" at " in line for line in done.stdout.splitlines())


def test_the_gateway_is_allowed_and_named() -> None:
    done = check(
        '{"enabled": true, "allow": []}', "gw.example:8443", "--gateway-url", "wss://gw.example:8443/ws"
    )
    assert done.returncode == 0, done.stderr
    assert "gateway: gw.example:8443 (always allowed)" in done.stdout.splitlines()
    assert (
        "gw.example:8443: allowed by the session's gateway: gw.example:8443 is the claim's gateway"
        in done.stdout
    )


def test_a_policy_that_is_not_enabled_allows_everything() -> None:
    done = check('{"enabled": false, "allow": []}', "[2001:db8::1]:22")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("policy: not enforced")
    assert "[2001:db8::1]:22: allowed by no policy enforced" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (['{"enabled": true', "x.example"], "the policy is not JSON"),
        (["[]", "x.example"], "a network policy must be an object"),
        (['{"enabled": true, "allow": {}}', "x.example"], "allow must be a list"),
        ([POLICY, "x.example:99999"], "'99999' is not a port"),
        ([POLICY, "x.example:https"], "'https' is not a port"),
        ([POLICY, "x.example", "--address", "nope"], "--address: 'nope' does not appear to be"),
        ([POLICY, "x.example", "--gateway-url", "wss:///ws"], "has no host"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], message: str) -> None:
    done = check(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("devin-outposts: error: ")
    assert message in done.stderr
