"""A session id cannot forge log lines (issue 37, S8).

A session id with a newline started a line of its own in the text log, one that could read like any other
(a fake "released" line, say), and an ``ESC`` in it reached the terminal that showed the log. The text
format now writes control characters as ``\\xNN``; the JSON format escaped them already. A real worker
serves a session of :class:`fault_fleet.FaultFleet` whose id holds both, and its log is read back.
"""

from __future__ import annotations

import io
import json
import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fault_fleet import FaultFleet
from test_worker_malformed import TOKEN, wait_serving, worker_args, worker_env

from devin_outposts.core.logs import (
    CONTEXT_FIELDS,
    JsonFormatter,
    RedactingFilter,
    TextFormatter,
    escape_controls,
)

from worker_fakes import DistServer, FakeRemote, WorkerProcess

FORGED = "2026-01-01 00:00:00,000 INFO    devin_outposts.core.sessions: released session devin-x"
HOSTILE = f"devin-a\n{FORGED}\x1b[2J\u2028"
ESCAPED = "devin-a\\x0a" + FORGED + "\\x1b[2J\\u2028"


def serve_hostile_session(tmp_path: Path, remote: FakeRemote, *extra: str) -> str:
    """A real worker claims, serves and releases the session ``HOSTILE``; its log."""
    with FaultFleet(TOKEN) as fleet, DistServer("abc1234", remote.script) as dist:
        fleet.enqueue(HOSTILE)
        args = worker_args(tmp_path, dist.url, *extra)
        worker = WorkerProcess(args, worker_env(fleet.url), tmp_path / "worker.log").start()
        try:
            wait_serving(worker, lambda: remote.runs(HOSTILE), "the session to be served")
            fleet.set_status(HOSTILE, "terminated")
            wait_serving(worker, lambda: fleet.calls("POST", f"/{HOSTILE}/release"), "the release")
            worker.signal(signal.SIGTERM)
            assert worker.wait(30) == 0
        finally:
            worker.stop()
    return worker.log()


def test_a_session_id_with_a_newline_and_an_escape_stays_on_its_line(
    tmp_path: Path, remote: FakeRemote
) -> None:
    log = serve_hostile_session(tmp_path, remote)
    lines = log.splitlines()
    assert not [line for line in lines if line.startswith(FORGED[:10])], log  # no line of the id's own
    assert "\x1b" not in log and "\u2028" not in log
    claimed = [line for line in lines if f"claimed session {ESCAPED} (slot 0)" in line]
    assert len(claimed) == 1, log
    assert claimed[0].endswith(f"session_id={ESCAPED} slot=0")  # the context field, escaped as well
    assert [line for line in lines if f"released session {ESCAPED}" in line], log


def test_json_logs_escape_the_same_id_by_themselves(tmp_path: Path, remote: FakeRemote) -> None:
    log = serve_hostile_session(tmp_path, remote, "--log-format", "json")
    records = [json.loads(line) for line in log.splitlines()]  # every line is one whole record
    assert "\x1b" not in log and "\u2028" not in log
    claimed = [r for r in records if r["msg"] == f"claimed session {HOSTILE} (slot 0)"]
    assert len(claimed) == 1, log
    assert claimed[0]["session_id"] == HOSTILE


# --- the formatter, for every field the worker and the orchestrator log ------------------------------------


@contextmanager
def logger_to(stream: io.StringIO, fmt: str) -> Iterator[logging.Logger]:
    """A logger whose lines go to ``stream`` as the programs' handler writes them (``setup_logging``)."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger(f"devin_outposts.test_log_lines.{fmt}")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        yield logger
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_every_context_field_and_argument_stays_on_one_line(fmt: str) -> None:
    stream = io.StringIO()
    fields = {name: f"{name}\r\n{FORGED}\x00\x07\x1b]0;title\x07\x85" for name in CONTEXT_FIELDS}
    with logger_to(stream, fmt) as logger:  # the orchestrator's lines name machines, as its drivers do
        logger.warning("machine %s of session %s failed: %s", "m\n1", HOSTILE, "detail\x1b[0m", extra=fields)
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n"), text
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in text[:-1]), repr(text)
    if fmt == "text":
        assert f"machine m\\x0a1 of session {ESCAPED} failed: detail\\x1b[0m" in text
        for name in CONTEXT_FIELDS:
            assert f" {name}={escape_controls(fields[name])}" in text
    else:
        record = json.loads(text)
        assert record["msg"] == f"machine m\n1 of session {HOSTILE} failed: detail\x1b[0m"
        assert {name: record[name] for name in CONTEXT_FIELDS} == fields


def test_a_traceback_keeps_its_lines_and_the_message_is_escaped() -> None:
    stream = io.StringIO()
    with logger_to(stream, "text") as logger:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logger.exception("serving session %s crashed", HOSTILE)
    first, *rest = stream.getvalue().splitlines()
    assert first.endswith(f"serving session {ESCAPED} crashed")
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "RuntimeError: boom"
