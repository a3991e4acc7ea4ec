"""What several of the simulator's test modules share: the result of the ``cli`` fixture (conftest.py), and a
clock to hand to the state in place of ``time.time``."""

from __future__ import annotations

from typing import Callable, NamedTuple


class CliResult(NamedTuple):
    """What ``devin-outposts-sim <argv>`` returned when the ``cli`` fixture ran it in process."""

    code: int
    out: str
    err: str


#: ``cli(*argv)``: ``devin-outposts-sim <argv>`` in process.
Cli = Callable[..., CliResult]


class SteppingClock:
    """A clock the test moves by hand (forwards, or backwards)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
