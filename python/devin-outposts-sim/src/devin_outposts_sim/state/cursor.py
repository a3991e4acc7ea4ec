"""Opaque cursors.

Queue cursors are ``base64url("v1:<rev>:<session_id>")``: ``rev`` is the simulator's internal, strictly
increasing float revision of the row (the wire ``updated_at`` is only whole seconds), written with
``repr`` so it round-trips exactly. ``v1:<rev>`` without a session id (the form of the example cursor in
the docs, ``djE6MTc4MTA1MDAwMC4w``) is accepted too and means "every row at or after ``rev``".

Outpost list cursors (``after``/``end_cursor``) are ``base64url("o1:<seq>")`` over the creation order, and
organization list cursors ``base64url("g1:<seq>")`` over theirs. Anything else, a cursor of another list
included, is rejected with 422.
"""

from __future__ import annotations

import base64
import binascii
import math
from dataclasses import dataclass

from devin_outposts_sim.errors import Invalid

_QUEUE_PREFIX = "v1:"
_OUTPOST_PREFIX = "o1:"
_ORG_PREFIX = "g1:"


@dataclass(frozen=True, order=True)
class QueueCursor:
    """A position in the queue's ``(rev, session_id)`` order. Rows at or after it are "after" it."""

    rev: float
    session_id: str = ""

    def encode(self) -> str:
        return _b64(f"{_QUEUE_PREFIX}{self.rev!r}:{self.session_id}")


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


def _unb64(raw: str) -> str:
    text = raw.strip().replace("+", "-").replace("/", "_")
    text += "=" * (-len(text) % 4)
    try:
        return base64.urlsafe_b64decode(text.encode("ascii")).decode("utf-8")
    except (binascii.Error, UnicodeError, ValueError) as exc:
        raise Invalid("Invalid cursor") from exc


def decode_queue_cursor(raw: str) -> QueueCursor:
    text = _unb64(raw)
    if not text.startswith(_QUEUE_PREFIX):
        raise Invalid("Invalid cursor")
    rev_text, _sep, session_id = text[len(_QUEUE_PREFIX) :].partition(":")
    try:
        rev = float(rev_text)
    except ValueError as exc:
        raise Invalid("Invalid cursor") from exc
    if not math.isfinite(rev) or rev < 0:
        raise Invalid("Invalid cursor")
    return QueueCursor(rev, session_id)


def _encode_seq(prefix: str, seq: int) -> str:
    return _b64(f"{prefix}{seq}")


def _decode_seq(prefix: str, raw: str) -> int:
    text = _unb64(raw)
    if not text.startswith(prefix):
        raise Invalid("Invalid cursor")
    digits = text[len(prefix) :]
    if not digits.isascii() or not digits.isdigit():
        raise Invalid("Invalid cursor")
    return int(digits)


def encode_outpost_cursor(seq: int) -> str:
    return _encode_seq(_OUTPOST_PREFIX, seq)


def decode_outpost_cursor(raw: str) -> int:
    return _decode_seq(_OUTPOST_PREFIX, raw)


def encode_org_cursor(seq: int) -> str:
    return _encode_seq(_ORG_PREFIX, seq)


def decode_org_cursor(raw: str) -> int:
    return _decode_seq(_ORG_PREFIX, raw)
