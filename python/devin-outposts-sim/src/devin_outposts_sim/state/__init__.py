"""The simulator's state and every rule of the fleet contract, without HTTP.

:class:`~devin_outposts_sim.state.store.Store` is the entry point: one SQLite database
(:mod:`~devin_outposts_sim.state.db`) and the parts that hold it (accounts, the queue, the gateway's
records, the claim history, the two distributions). The HTTP layer (:mod:`devin_outposts_sim.http`) calls
it from a thread pool; tests may use it directly. Nothing in here imports Starlette, uvicorn or httpx
(python/importlinter.ini enforces it), so every rule can be tested without a server.
"""
