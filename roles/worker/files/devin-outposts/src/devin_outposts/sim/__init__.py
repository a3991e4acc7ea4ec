"""The fleet simulator: a local, faithful implementation of the Devin Outposts fleet API.

It answers exactly like the real service is documented to (``shared/reference/outposts-contract.md``):
the same 401/403/404/409/422s, cursors, claim TTLs, watch stream endings. State lives in SQLite, so it
survives restarts. See docs/simulator.md for running it and for every choice made where the contract is
silent.

Modules:

* :mod:`~devin_outposts.sim.testing` - ``run_sim()`` (in-process) and ``sim_process()`` (subprocess)
  for tests; start here.
* :mod:`~devin_outposts.sim.admin_client` - ``SimAdmin``, the client of the ``/_sim`` admin API.
* :mod:`~devin_outposts.sim.store` - ``Store``, the state and every rule (claims, cursors, history).
* :mod:`~devin_outposts.sim.app` / :mod:`~devin_outposts.sim.admin` / :mod:`~devin_outposts.sim.watch`
  - the HTTP routes, the admin routes, the SSE stream.
* :mod:`~devin_outposts.sim.server` - uvicorn wiring used by ``devin-outposts sim serve``.
* :mod:`~devin_outposts.sim.dist` / :mod:`~devin_outposts.sim.gateway` / :mod:`~devin_outposts.sim.brain`
  - the ``devin-remote`` distribution, the gateway a session's remote connects to, and the brain API
  that scripts its tool calls (:mod:`~devin_outposts.sim.tools`).
* :mod:`~devin_outposts.sim.remote_standin` - the stand-in ``devin-remote`` the distribution serves
  (stdlib only); :mod:`~devin_outposts.sim.remote_testing` runs it in tests.

Importing this package imports nothing heavy; ``admin_client`` needs only httpx, the server needs the
``sim`` extra (starlette, uvicorn).
"""
