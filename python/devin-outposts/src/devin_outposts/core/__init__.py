"""The claim-and-serve machinery both programs run on: the worker (``worker start``) and the orchestrator
(``orchestrate``). It imports ``api`` only, never either program: what differs between them is handed in
(a :class:`~.claiming.SessionHost`, a config that has the fields a :class:`~.claiming.ClaimSettings` or a
:class:`~.sessions.ServeSettings` reads).

Modules, each one concern:

* :mod:`.claiming`: the claim loop (restart recovery, then claiming whenever a slot is free) and the
  :class:`~.claiming.SessionHost` protocol each program implements (a host may hold claims back);
  ``/healthz``'s state;
* :mod:`.feed`: list-then-watch with reconnects and backoff, or polling; the claimable rows, oldest first;
* :mod:`.spread`: which row this worker claims next among the outpost's idle workers (claim spreading);
* :mod:`.pool`: the slots, the running sessions, the drain and the one wake-up event;
* :mod:`.serving`: serving one claimed session, whatever runs it (renew, watch status, restart, release);
* :mod:`.sessions`: what the pool, the loop and serving share about a session: its result, why a launch
  stopped, the protocols of what serves it, releasing a claim and when to renew it;
* :mod:`.config`: the option-table machinery (flag, then environment variable, then default; the value
  parsers; :class:`~.config.ConfigError`), the rows both programs declare, each once
  (:data:`~.config.SHARED_OPTIONS`), and the one reader of yes/no words (:func:`~.config.truth`);
* :mod:`.outposts`: choosing the outpost, the platform check;
* :mod:`.retrying`: backoff, and which fleet errors are worth a retry;
* :mod:`.identity`: the persisted acceptor id and the directory locks;
* :mod:`.paths`: server ids to safe paths, private directories;
* :mod:`.processes`: the record of a running ``devin-remote`` and stopping one a killed predecessor left;
* :mod:`.tokenfile`: the one reader of the account token: its variable, a file descriptor or a 0600 file;
* :mod:`.platform`: everything that differs per operating system (:mod:`~.platform.posix`,
  :mod:`~.platform.windows`);
* :mod:`.netpolicy`: each session's ``spec.network_policy``: what it allows, the egress proxy that enforces
  it, and confining a session to it;
* :mod:`.metrics`: ``/metrics`` and ``/healthz`` (and the egress proxies' verdicts, by session);
* :mod:`.logs`: text or JSON logs with secrets redacted;
* :mod:`.exits`: the exit codes (:class:`~.exits.ExitCode`) and :class:`~.exits.ProgramExit`.
"""
