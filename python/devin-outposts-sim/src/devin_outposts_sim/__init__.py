"""The fleet simulator: a local, faithful implementation of the Devin Outposts fleet API.

It answers exactly like the real service is documented to (docs/fleet-api.md):
the same 401/403/404/409/422s, cursors, claim TTLs, watch stream endings. State lives in SQLite, so it
survives restarts. See docs/simulator.md for running it and for every choice made where the contract is
silent.

Modules:

* :mod:`~devin_outposts_sim.testing` - ``run_sim()`` (in-process) and ``sim_process()`` (subprocess)
  for tests; start here.
* :mod:`~devin_outposts_sim.admin_client` - ``SimAdmin``, the client of the ``/_sim`` admin API.
* :mod:`~devin_outposts_sim.store` - ``Store``, the state and every rule (claims, cursors, history).
* :mod:`~devin_outposts_sim.app` / :mod:`~devin_outposts_sim.admin` / :mod:`~devin_outposts_sim.watch`
  - the HTTP routes, the admin routes, the SSE stream.
* :mod:`~devin_outposts_sim.server` - uvicorn wiring used by ``devin-outposts-sim serve``.
* :mod:`~devin_outposts_sim.dist` / :mod:`~devin_outposts_sim.gateway` / :mod:`~devin_outposts_sim.brain`
  - the ``devin-remote`` distribution, the gateway a session's remote connects to, and the brain API
  that scripts its tool calls (:mod:`~devin_outposts_sim.tools`).
* :mod:`~devin_outposts_sim.remote_standin` - the stand-in ``devin-remote`` the distribution serves
  (stdlib only); :mod:`~devin_outposts_sim.remote_testing` runs it in tests.

* :mod:`~devin_outposts_sim.cli` - the ``devin-outposts-sim`` command;
  :mod:`~devin_outposts_sim.pytest_plugin` - pytest fixtures (``sim``, ``make_sim``, tokens, ...)
  for this repository's tests and for users' own (loaded by pytest wherever this distribution is installed).

This distribution (``devin-outposts-sim``) is for development, CI and controllers, never for worker
hosts. It may import :mod:`devin_outposts.api` (the wire models); nothing in ``devin_outposts`` imports
it. Importing this package imports nothing heavy; ``admin_client`` needs only httpx.
"""

from __future__ import annotations

__version__ = "0.1.0"
