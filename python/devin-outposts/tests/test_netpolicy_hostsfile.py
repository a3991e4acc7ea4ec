"""The session's /etc/hosts keeps this machine's own names on loopback and nothing else (core/netpolicy/
hostsfile.py): every other name, a loopback one too, goes through the stub DNS and so the egress path."""

from __future__ import annotations

from devin_outposts.core.netpolicy.hostsfile import own_lines

HOST_FILE = """# The host's
127.0.0.1\tlocalhost
127.0.1.1 builder.example.com builder
::1 localhost ip6-localhost ip6-loopback
ff02::1 ip6-allnodes
10.0.0.5 git.corp   # pinned by the admin
127.0.0.1 registry.local app.localhost
not-an-address name

"""


def test_only_the_machines_own_names_stay_on_loopback() -> None:
    kept = own_lines(HOST_FILE, ["builder", "ip6-localhost"])
    assert kept.splitlines() == [
        "# The host's",
        "127.0.0.1\tlocalhost",
        "127.0.1.1 builder",
        "::1 localhost ip6-localhost",
        "ff02::1 ip6-allnodes",
        "127.0.0.1 app.localhost",
        "",
    ]


def test_names_pinned_to_other_addresses_are_left_to_the_stub_dns() -> None:
    kept = own_lines(HOST_FILE, ["builder"])
    assert "git.corp" not in kept and "registry.local" not in kept and "10.0.0.5" not in kept
