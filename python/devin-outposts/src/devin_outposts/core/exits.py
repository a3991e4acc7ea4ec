"""Exit codes of ``worker start`` and the exception that ends the worker with one line.

* 0: done (loop mode drained after a signal, or the one session of ``--once``/``--session``/direct-serve
  ended normally);
* 1: unexpected error; 2: usage (bad flag or environment value, ``--outpost`` needed);
* 3: the token was refused (401/403); 4: the outpost or ``--session`` was not found;
* 5: ``--session`` is claimed by another worker; 6: the outpost's platform is not this machine's;
* 7: the one session failed (remote failed past the restart limit, binary refused, claim lost);
* 8: another worker holds the data directory or the working directory;
* 128+N: the one session was interrupted by signal N (its claim was released).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_AUTH = 3
EXIT_NOT_FOUND = 4
EXIT_CONFLICT = 5
EXIT_PLATFORM = 6
EXIT_SESSION_FAILED = 7
EXIT_LOCKED = 8


class WorkerExit(Exception):
    """Ends the worker with ``code`` after printing ``message`` as one line."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
