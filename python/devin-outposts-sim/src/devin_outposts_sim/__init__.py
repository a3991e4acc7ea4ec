"""The fleet simulator: a local, faithful implementation of the Devin Outposts fleet API.

It answers exactly like the real service is documented to (docs/fleet-api.md):
the same 401/403/404/409/422s, cursors, claim TTLs, watch stream endings. State lives in SQLite, so it
survives restarts. See docs/simulator.md for running it, for its module map and for every choice made
where the contract is silent.

Layers, top to bottom (python/importlinter.ini enforces them; a module imports only from below it):

* :mod:`~devin_outposts_sim.cli` - the ``devin-outposts-sim`` command; :mod:`~devin_outposts_sim.testing`
  - ``run_sim()``, ``sim_process()``, the stand-in runner and the pytest plugin; start here for tests.
* :mod:`~devin_outposts_sim.http` - the Starlette app, its routes (fleet API, gateway, ``/_sim`` admin and
  brain, distributions, SSE watch) and the uvicorn server; :mod:`~devin_outposts_sim.admin_client` -
  ``SimAdmin``, the client of the ``/_sim`` admin API (httpx only).
* :mod:`~devin_outposts_sim.state` - ``Store``: the SQLite state and every rule (claims, cursors,
  history, gateway records, distributions), with no HTTP.
* :mod:`~devin_outposts_sim.remote` - the stand-in ``devin-remote`` (stdlib only) and the tool calls it
  runs (:mod:`~devin_outposts_sim.remote.tools`).
* :mod:`~devin_outposts_sim.errors` - the refusals every layer raises, each with its HTTP status.

This distribution (``devin-outposts-sim``) is for development, CI and controllers, never for worker
hosts. It may import :mod:`devin_outposts.api` (the wire models); nothing in ``devin_outposts`` imports
it. Importing this package imports nothing heavy; ``admin_client`` needs only httpx.
"""

from __future__ import annotations

__version__ = "0.1.0"
