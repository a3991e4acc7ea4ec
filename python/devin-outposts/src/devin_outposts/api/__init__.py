"""The async client of the Devin Outposts fleet API (docs/fleet-api.md §2-§4), with its wire models and
errors. It imports nothing else of ours: the worker, the simulator and the command line build on it.

* :mod:`.client`: :class:`~.client.FleetClient` (retries, pagination, the SSE watch, error mapping);
* :mod:`.models`: the pydantic models of queue entries, outposts and the default platform;
* :mod:`.errors`: the exceptions, one per kind of answer (auth, not found, conflict, ...);
* :mod:`.limits`: the size limits every reply is read within.
"""
