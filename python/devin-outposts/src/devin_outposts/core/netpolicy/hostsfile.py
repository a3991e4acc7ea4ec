"""The session's ``/etc/hosts``: the host's, with only this machine's own names on its loopback (and the
multicast and unspecified entries that come with them), bound over ``/etc/hosts`` in the session's view
(:mod:`.view`) (docs/network-policy.md, "How a session is confined").

Why: a name that the session resolves from the host's ``/etc/hosts`` (``10.0.0.5 git.corp``) reaches the
shim as a bare address, and the shim cannot tell which name it was for. A client that speaks first still
says so (TLS SNI, HTTP ``Host``), but one whose server speaks first (SSH, SMTP) does not, so ``git`` over
SSH to an allowed host that the host pins in ``/etc/hosts`` was refused. Without those lines the name goes
to the stub DNS like any other: an allowed name gets a fake address the shim maps back to the name, and the
egress proxy resolves it on the host, where ``/etc/hosts`` still applies (and so does the rebinding guard).
``localhost`` and the machine's host name stay on loopback: the session's loopback is its own.

Nothing here is a confinement: a session that changed its view of the file would only change which
address it connects to, and every address goes through the egress path.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Optional

HOSTS = Path("/etc/hosts")
_LOOPBACK_ALIASES = ("localhost.localdomain", "ip6-localhost", "ip6-loopback")


def own_lines(text: str, own_names: Iterable[str]) -> str:
    """The entries of a hosts file to keep: comments and blank lines; this machine's own names
    (``own_names``, ``localhost`` and ``*.localhost``) on loopback addresses; and the multicast and
    unspecified entries (``ip6-allnodes``), which name no host. Any other name is left out, a loopback
    one too: the host's loopback is not the session's, so ``127.0.0.1 registry.local`` must go through the
    egress path (which reaches the host's loopback only where an address rule allows it)."""
    own = {name.lower() for name in own_names if name}
    kept: list[str] = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if not words:
            kept.append(line)
            continue
        try:
            address = ipaddress.ip_address(words[0].split("%", 1)[0])
        except ValueError:
            continue  # not an address: glibc skips the line too
        if address.is_multicast or address.is_unspecified:
            kept.append(line)
        elif address.is_loopback:
            names = [name for name in words[1:] if _is_own(name.lower(), own)]
            if names == words[1:]:
                kept.append(line)
            elif names:
                kept.append(" ".join([words[0], *names]))
    return "".join(f"{line}\n" for line in kept)


def own_names() -> list[str]:
    """This machine's names: its host name, short and as given, and the usual loopback aliases."""
    hostname = socket.gethostname()
    return [hostname, hostname.split(".", 1)[0], *_LOOPBACK_ALIASES]


def _is_own(name: str, own: set[str]) -> bool:
    return name in own or name == "localhost" or name.endswith(".localhost")


def session_hosts(hosts: Path = HOSTS) -> Optional[str]:
    """The session's ``/etc/hosts``: the own lines (:func:`own_lines`) of ``hosts``; None when there is no
    such file (every name goes to the stub DNS already). The launcher binds it, read-only, over ``hosts``
    in its view (:mod:`.view`); a file it cannot read is a warning, not a refusal: it confines nothing."""
    try:
        original = hosts.read_text(errors="replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        logging.getLogger("devin_outposts.sandbox").warning(
            "names in %s resolve to their addresses, not through the stub DNS: %s", hosts, exc
        )
        return None
    return own_lines(original, own_names())
