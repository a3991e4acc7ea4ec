"""Each session's ``spec.network_policy``, enforced on the machine that runs it (docs/network-policy.md).

* :mod:`.policy`: what a policy allows (the one reading, pure);
* :mod:`.peek`: the name a connection's first bytes ask for (TLS SNI, HTTP Host), and what they start;
* :mod:`.request`: the reading of one request head sent to the egress proxy (CONNECT, absolute-form HTTP);
* :mod:`.proxy`: the per-session egress proxy on a Unix socket (:class:`~.proxy.EgressProxy`);
* :mod:`.http1`: one plain HTTP request per connection through it (its body by its framing, nothing after);
* :mod:`.relay`: moving a tunnel's bytes (backpressure, half-close, splice(2) for bulk transfers);
* :mod:`.sandbox`: running a session confined to its policy: the launcher's command line and the worker's
  seam (:func:`~.sandbox.sandbox_argv`, :func:`~.sandbox.write_policy_file`, :class:`~.sandbox.SandboxExit`);
* :mod:`.launcher`: the confined session's first process (set up, preflight, shim, session, signals);
  :mod:`.launcher_exits` its exit codes;
* :mod:`.namespace`: the session's network namespace: addresses, the nftables table, the preflight;
* :mod:`.hostsfile`: the session's ``/etc/hosts`` (the machine's own names on loopback, every other name
  through the stub DNS);
* :mod:`.shim`: the listeners inside it that lead every TCP connection to the egress socket;
* :mod:`.stubdns`: the stub DNS inside it (allowed names only, fake addresses, never forwards);
* :mod:`.probe`: can this host confine sessions (:func:`~.probe.probe`);
* :mod:`.confinement`: one session's confinement as the worker uses it (may it run here, its proxy, its
  command line; :class:`~.confinement.EnforcementMode`, the orchestrator's hand-over variable).
"""
