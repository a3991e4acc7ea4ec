"""``devin-outposts network-policy check '<policy json>' <host[:port]>``: what a session's network policy
decides for one destination, and why (docs/network-policy.md, "Explaining a decision").

It asks the same reading the egress proxy asks (core/netpolicy/policy.py): first about the name, as the
proxy does before it resolves anything, then about each ``--address`` given, as the proxy does about each
address it resolved. It resolves nothing itself: without ``--address`` only the name is judged. The ignored
rules of the policy are printed too.

Exit codes: 0 when the proxy would connect (the name is allowed and, with ``--address``, at least one
address is: the proxy tries the allowed ones in order), 1 when it would refuse, 2 on bad input.
"""

from __future__ import annotations

import argparse
import ipaddress
import json

from devin_outposts.cli.common import fail
from devin_outposts.core.exits import ExitCode
from devin_outposts.core.netpolicy.peek import PeekError, split_host_port
from devin_outposts.core.netpolicy.policy import Policy, PolicyError, normalise_host

DEFAULT_PORT = 443


def _check(args: argparse.Namespace) -> int:
    try:
        spec = json.loads(args.policy)
    except json.JSONDecodeError as exc:
        return fail(f"the policy is not JSON: {exc}", ExitCode.USAGE)
    try:
        host, port = split_host_port(args.destination, DEFAULT_PORT)
        addresses = [ipaddress.ip_address(address.strip("[]")) for address in args.address]
        policy = Policy.from_spec(spec, args.gateway_url)
    except (PeekError, PolicyError) as exc:
        return fail(str(exc), ExitCode.USAGE)
    except ValueError as exc:  # ip_address's own message names the value: "'x' does not appear to be ..."
        return fail(f"--address: {exc}", ExitCode.USAGE)
    if not host or port is None:
        return fail(f"{args.destination!r} names no host", ExitCode.USAGE)
    where = f"[{normalise_host(host)}]:{port}" if ":" in host else f"{normalise_host(host)}:{port}"
    if not policy.enforced:
        print("policy: not enforced (no policy, or enabled is false): nothing is filtered")
    else:
        rules = len(policy.hostnames) + len(policy.networks)
        print(f"policy: enforced, {rules} rule(s) read, {len(policy.ignored)} ignored")
    if policy.gateway is not None:
        print(f"gateway: {policy.gateway[0]}:{policy.gateway[1]} (always allowed)")
    for ignored in policy.ignored:
        print(f"ignored: {ignored}")
    by_name = policy.check_name(host, port)
    print(f"{where}: {by_name.describe()}")
    if not by_name.allowed:
        return ExitCode.ERROR
    if not addresses:
        return ExitCode.OK
    verdicts = [policy.check_address(host, port, address) for address in addresses]
    for address, verdict in zip(addresses, verdicts):
        print(f"{where} at {address}: {verdict.describe()}")
    return ExitCode.OK if any(verdict.allowed for verdict in verdicts) else ExitCode.ERROR


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("network-policy", help="explain what a session's network policy allows")
    verbs = parser.add_subparsers(dest="network_policy_command", metavar="VERB")
    verbs.required = True
    check = verbs.add_parser(
        "check",
        help="say whether a policy allows a destination, by which rule and why",
        description="Say whether a session's network policy allows host[:port], by which rule and why. "
        "Nothing is resolved: give the addresses to judge with --address. Exit 0 when allowed, 1 when "
        "denied, 2 on bad input.",
    )
    check.add_argument(
        "policy", help='spec.network_policy as JSON, e.g. \'{"enabled": true, "allow": [...]}\''
    )
    check.add_argument(
        "destination", metavar="host[:port]", help=f"a name or an IP address (port {DEFAULT_PORT})"
    )
    check.add_argument("--gateway-url", default=None, help="the claim's gateway_url (always allowed)")
    check.add_argument(
        "--address",
        action="append",
        default=[],
        metavar="IP",
        help="an address the name resolved to, judged as the proxy judges it (repeatable)",
    )
    check.set_defaults(handler=_check)
