"""The bundled worker: ``devin-outposts worker start``, a drop-in for ``devin worker start``.

Modules, each one concern:

* :mod:`.config`: flags and environment → :class:`~.config.WorkerConfig`;
* :mod:`.identity`: the persisted acceptor id and the data-dir/workdir locks;
* :mod:`.paths`: server ids → safe paths;
* :mod:`.binary`: resolve the ``devin-remote`` SHA, download, verify, cache;
* :mod:`.spawn`: the clean session environment, launching and stopping ``devin-remote``;
* :mod:`.queue`: list-then-watch with reconnects and backoff, or polling;
* :mod:`.session`: serving one claimed session (renew, watch status, restart, release);
* :mod:`.runner`: the worker: modes, slots, signals and drain, ``/healthz`` state;
* :mod:`.claiming`: queue mode: restart recovery and the claim loop;
* :mod:`.outposts`: choosing the outpost, the platform check;
* :mod:`.exits`: exit codes;
* :mod:`.metrics`: ``/metrics`` and ``/healthz``;
* :mod:`.logs`: text or JSON logs with secrets redacted.

Only httpx and pydantic are needed: nothing here imports the simulator's web stack or Ansible.
"""
