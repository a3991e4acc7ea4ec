"""The orchestrator: claim first, then a fresh machine per session (docs/orchestrator.md).

It runs on :mod:`devin_outposts.core` (the claim loop, the queue feed, the session pool, serving a claim)
and never imports the worker. Modules, each one concern:

* :mod:`.runner`: the orchestrator: the state dir and its lock, the driver, leadership, signals, the
  ``/metrics`` server, the status source, and one :class:`~.outpost.OutpostRunner` per outpost served;
* :mod:`.outpost`: one outpost served: its session pool (its own cap, under the process's), its claim
  loop with its host, its sweep and its metrics;
* :mod:`.queue`: :class:`~.queue.MachineHost`, what the claim loop runs each claim with: a machine per
  session, recovery that adopts machines, no single reply stopping the loop;
* :mod:`.machine`: one session on one machine: provision (or adopt), start the worker, watch it,
  snapshot, tear down;
* :mod:`.plan`: the decisions, as pure functions a table of cases tests: what a machine's status read
  means (wait, exited, restarted in place, give up), what the sweep collects, snapshots or keeps;
* :mod:`.sweep`: the garbage-collection sweep of machines, snapshots and secrets no session needs;
* :mod:`.backoff`: no new claims for a while when the driver keeps failing to start workers (10 s doubling
  to 300 s, one probe session after each pause, ended by a worker seen running);
* :mod:`.options`: the orchestrator's table of options → flags, environment variables and
  :class:`~.options.OrchestratorConfig` (the rows the worker has too are :mod:`devin_outposts.core.config`'s);
* :mod:`.metrics`: the names of Cognition's operator, plus ours; each outpost's labelled, on one page;
* :mod:`.drivers`: what a session runs on (``process``, ``podman``, ``kubernetes``, ``ansible``), each
  imported only when chosen, behind the interface in :mod:`.drivers.base`.
"""
