"""The bundled worker: ``devin-outposts worker start``, a drop-in for ``devin worker start``.

Modules, each one concern:

* :mod:`.options`: one table of options → flags, environment variables and :class:`~.options.WorkerConfig`;
* :mod:`.identity`: the persisted acceptor id and the data-dir/workdir locks;
* :mod:`.paths`: server ids → safe paths;
* :mod:`.binary`: resolve the ``devin-remote`` SHA, download, verify, cache;
* :mod:`.spawn`: the clean session environment, launching and stopping ``devin-remote``;
* :mod:`.feed`: list-then-watch with reconnects and backoff, or polling; which row to claim next;
* :mod:`.session`: serving one claimed session (renew, watch status, restart, release);
* :mod:`.pool`: the slots, the running sessions, the drain and the one wake-up event;
* :mod:`.queue_mode`: queue mode: restart recovery and the claim loop;
* :mod:`.runner`: the worker: directories, locks, signals, metrics, and the dispatch to a mode;
* :mod:`.platform`: everything that differs per operating system;
* :mod:`.retrying`: backoff, and which fleet errors are worth a retry;
* :mod:`.outposts`: choosing the outpost, the platform check;
* :mod:`.exits`: exit codes;
* :mod:`.metrics`: ``/metrics`` and ``/healthz``;
* :mod:`.logs`: text or JSON logs with secrets redacted.

Only httpx and pydantic are needed: nothing here imports the simulator's web stack or Ansible.
"""
