"""Each session's ``spec.network_policy``, enforced on the machine that runs it (docs/network-policy.md).

* :mod:`.policy`: what a policy allows (the one reading, pure);
* :mod:`.peek`: the name a connection's first bytes ask for (TLS SNI, HTTP Host).
"""
