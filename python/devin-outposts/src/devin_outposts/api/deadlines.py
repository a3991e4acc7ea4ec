"""The total deadline of each request of the fleet client, and the cut a stopping program puts on them all.

httpx limits each network operation (connect, each read, each write), not a request as a whole: an answer
that sends one byte every 10 s never trips a 30 s read timeout, and a 100,000-byte body then takes 11 days
(issue 37, S5). :class:`Deadlines` runs each request, from its connection to the last byte of its answer,
as a task of its own that is cancelled when its deadline passes, whatever the server does.

A program that stops calls :meth:`Deadlines.cut`: every request in flight, and every request made after
it, must then end within a few seconds of the cut (the releases a second signal still makes, docs/worker.md,
"Signals and shutdown"). A request past the cut is not sent at all.

A cancellation of the caller cancels the request too, at once. Standard library only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar

T = TypeVar("T")


class DeadlinePassed(Exception):
    """A request did not end within its deadline: ``cut`` tells whether that was the stop's cut (and no
    attempt should follow) or the request's own total deadline (an answer too slow, maybe dripping)."""

    def __init__(self, seconds: float, *, cut: bool) -> None:
        what = "cut short: the program is stopping" if cut else f"no complete answer within {seconds:g}s"
        super().__init__(what)
        self.seconds = seconds
        self.cut = cut


@dataclass(eq=False)  # kept in a set, by identity
class _Request:
    task: asyncio.Task[Any]
    end: float
    cut: bool
    #: Cancels the request at ``end`` (:meth:`expire`).
    timer: asyncio.TimerHandle = field(init=False)
    #: The deadline passed and the request was cancelled for it.
    expired: bool = False

    def expire(self) -> None:
        self.expired = True
        self.task.cancel()


def _consume(task: asyncio.Task[Any]) -> None:
    """Retrieve the outcome of a request nobody awaits any more (its caller was cancelled), so that asyncio
    does not log "exception was never retrieved"."""
    if not task.cancelled():
        task.exception()


class Deadlines:
    """Runs each request within ``seconds`` (:meth:`run`), and within the cut once there is one."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        #: The loop time by which every request must have ended, once :meth:`cut` was called.
        self._cut: Optional[float] = None
        self._running: set[_Request] = set()
        # Made on first use, on the running loop (on Python 3.9 an Event binds to the loop current when
        # it is created): set by the cut, so that a wait between two attempts ends with it.
        self._cut_event: Optional[asyncio.Event] = None

    def _event(self) -> asyncio.Event:
        if self._cut_event is None:
            self._cut_event = asyncio.Event()
            if self._cut is not None:
                self._cut_event.set()
        return self._cut_event

    def cut(self, within: float) -> None:
        """From now on, every request (in flight or to come) ends within ``within`` seconds; a later cut
        only ever brings that moment forward. Called on the running loop."""
        loop = asyncio.get_running_loop()
        end = loop.time() + max(0.0, within)
        self._cut = end if self._cut is None else min(self._cut, end)
        for request in self._running:
            if request.end > self._cut:
                request.timer.cancel()
                request.end, request.cut = self._cut, True
                request.timer = loop.call_at(self._cut, request.expire)
        self._event().set()

    async def pause(self, seconds: float) -> None:
        """Wait ``seconds`` between two attempts of a request, or until a cut comes (the next attempt then
        meets the cut at once instead of after a wait of up to a minute's ``Retry-After``)."""
        if self._cut is not None:
            return
        waits = {asyncio.ensure_future(asyncio.sleep(seconds)), asyncio.ensure_future(self._event().wait())}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def run(self, request: Coroutine[Any, Any, T]) -> T:
        """``request``'s result, or :class:`DeadlinePassed` once its deadline (or the cut) has passed, in
        which case it was cancelled. Its own errors are raised as they are."""
        loop = asyncio.get_running_loop()
        end, cut = loop.time() + self.seconds, False
        if self._cut is not None and self._cut <= end:
            end, cut = self._cut, True
            if end <= loop.time():
                request.close()  # never started: nothing is sent
                raise DeadlinePassed(self.seconds, cut=True)
        task = asyncio.ensure_future(request)
        running = _Request(task, end, cut)
        running.timer = loop.call_at(end, running.expire)
        self._running.add(running)
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.add_done_callback(_consume)
            task.cancel()
            raise
        finally:
            running.timer.cancel()
            self._running.discard(running)
        if task.cancelled() and running.expired:
            raise DeadlinePassed(self.seconds, cut=running.cut)
        return task.result()  # raises CancelledError if the request cancelled itself


class Idle:
    """The idle deadline of a stream, which is meant to stay open: it fails once ``seconds`` have passed
    without an event or a keepalive, however many bytes came meanwhile (a stream that drips a byte at a
    time and never completes a line is as idle as a silent one). Each read has its own timeout too, so a
    silent stream is noticed by its transport."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._seen = 0

    def progress(self, count: int) -> None:
        """``count`` is how many events and keepalives the stream brought so far."""
        if count != self._seen:
            self._seen = count
            self._last = self._loop.time()

    @property
    def expired(self) -> bool:
        return self._loop.time() - self._last > self.seconds


__all__ = ["DeadlinePassed", "Deadlines", "Idle"]
