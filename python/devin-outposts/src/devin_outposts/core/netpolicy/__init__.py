"""Each session's ``spec.network_policy``, enforced on the machine that runs it (docs/network-policy.md).

* :mod:`.policy`: what a policy allows (the one reading, pure);
* :mod:`.peek`: the name a connection's first bytes ask for (TLS SNI, HTTP Host), and what they start;
* :mod:`.request`: the reading of one request head sent to the egress proxy (CONNECT, absolute-form HTTP);
* :mod:`.proxy`: the per-session egress proxy (:class:`~.proxy.EgressProxy`), behind a doorway
  (:mod:`.doorway`: no name on the file system);
* :mod:`.http1`: one plain HTTP request per connection through it (its body by its framing, nothing after);
* :mod:`.relay`: moving a tunnel's bytes (backpressure, half-close, splice(2) for bulk transfers);
* :mod:`.sandbox`: running a session confined to its policy: the launcher's command line and the worker's
  seam (:func:`~.sandbox.sandbox_command`, :func:`~.sandbox.write_spec`, :class:`~.sandbox.SandboxExit`);
  :mod:`.spec` what the launcher is told;
* :mod:`.launcher`: the confined session's first process (namespaces, view, set up, preflight, shim, init,
  signals); :mod:`.launcher_exits` its exit codes; :mod:`.entry` entering the namespaces; :mod:`.view` what
  the session sees of the host's files; :mod:`.init` the first process of its process namespace;
  :mod:`.session_ids` a root worker's ids for its sessions;
* :mod:`.namespace`: the session's network namespace: addresses, the nftables table, the preflight;
* :mod:`.hostsfile`: the session's ``/etc/hosts`` (the machine's own names on loopback, every other name
  through the stub DNS);
* :mod:`.shim`: the listeners inside it that lead every TCP connection to the egress proxy;
* :mod:`.stubdns`: the stub DNS inside it (allowed names only, fake addresses, never forwards);
* :mod:`.probe`: can this host confine sessions (:func:`~.probe.probe`);
* :mod:`.confinement`: one session's confinement as the worker uses it (may it run here, its proxy, its
  command line; :class:`~.confinement.EnforcementMode`, the orchestrator's hand-over variable).
"""
