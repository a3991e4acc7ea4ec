"""The bundled worker: ``devin-outposts worker start``, a drop-in for ``devin worker start``.

It runs on :mod:`devin_outposts.core` (the claim loop, the queue feed, the session pool, serving a claim,
the platform layer) and never imports the orchestrator. Modules, each one concern:

* :mod:`.options`: the worker's table of options → flags, environment variables and
  :class:`~.options.WorkerConfig` (the machinery and the shared rows are :mod:`devin_outposts.core.config`);
* :mod:`.runner`: the worker: directories, locks, signals, metrics, and the dispatch to a mode (queue:
  the core claim loop; ``--session``; direct-serve);
* :mod:`.session`: serving one claimed session with a local ``devin-remote``, and
  :class:`~.session.WorkerHost`, what the claim loop runs each claim with;
* :mod:`.binary`: resolve the ``devin-remote`` SHA, download, verify, cache;
* :mod:`.spawn`: the clean session environment, launching and stopping ``devin-remote``;
* :mod:`.windows`: the Windows service host (service, its setup, the ``worker.env`` reader).

Only httpx and pydantic are needed: nothing here imports the simulator's web stack or Ansible.
"""
