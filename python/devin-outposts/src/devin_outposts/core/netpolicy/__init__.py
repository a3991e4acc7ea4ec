"""Each session's ``spec.network_policy``, enforced on the machine that runs it (docs/network-policy.md).

* :mod:`.policy`: what a policy allows (the one reading, pure);
* :mod:`.peek`: the name a connection's first bytes ask for (TLS SNI, HTTP Host), and what they start;
* :mod:`.request`: the reading of one request head sent to the egress proxy (CONNECT, absolute-form HTTP);
* :mod:`.proxy`: the per-session egress proxy on a Unix socket (:class:`~.proxy.EgressProxy`);
* :mod:`.relay`: moving a tunnel's bytes (backpressure, half-close, splice(2) for bulk transfers).
"""
