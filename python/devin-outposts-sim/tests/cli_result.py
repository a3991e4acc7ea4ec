"""What the simulator's command returned when the ``cli`` fixture (conftest.py) ran it in process."""

from __future__ import annotations

from typing import Callable, NamedTuple


class CliResult(NamedTuple):
    code: int
    out: str
    err: str


#: ``cli(*argv)``: ``devin-outposts-sim <argv>`` in process.
Cli = Callable[..., CliResult]
