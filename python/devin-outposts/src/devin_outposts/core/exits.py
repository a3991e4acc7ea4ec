"""The exit codes of ``worker start`` and ``orchestrate`` (and the CLI's verbs), and the exception that
ends a program with one line.

* 0: done (loop mode drained after a signal, or the one session of ``--once``/``--session``/direct-serve
  ended normally);
* 1: unexpected error; 2: usage (bad flag or environment value, ``--outpost`` needed);
* 3: the token was refused (401/403); 4: the outpost or ``--session`` was not found;
* 5: ``--session`` is claimed by another worker; 6: the outpost's platform is not this machine's;
* 7: the one session failed (remote failed past the restart limit, binary refused, claim lost);
* 8: another worker (or orchestrator) holds the data directory, the working directory or the state
  directory;
* 9: the one session's network policy is enabled and this machine cannot enforce it (its claim was
  released, or, in direct-serve mode, is left to the orchestrator, which releases it at once);
* 128+N: the one session was interrupted by signal N (its claim was released).
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """The codes a program exits with (docs/worker.md, docs/orchestrator.md, docs/troubleshooting.md)."""

    OK = 0
    ERROR = 1
    USAGE = 2
    AUTH = 3
    NOT_FOUND = 4
    CONFLICT = 5
    PLATFORM = 6
    SESSION_FAILED = 7
    LOCKED = 8
    NETWORK_POLICY = 9

    def __str__(self) -> str:
        return str(self.value)  # "3", as Python 3.11 prints an IntEnum, on 3.9 and 3.10 too


class ProgramExit(Exception):
    """Ends the program with ``code`` after printing ``message`` as one line."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code
