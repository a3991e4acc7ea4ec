"""Worker logging: ``text`` or ``json`` lines on stderr, with secrets redacted.

Log calls pass context as ``extra={"session_id": ..., "outpost": ...}``; the text format appends it as
``key=value`` pairs and the JSON format as fields. Every secret the worker handles (the account token,
every connect token) is registered with :func:`register_secret`, and a filter replaces any occurrence in a
message or its arguments with ``***`` as a last line of defence: the code never logs them on purpose.

Ids come from the server (session ids, outpost ids and names, machine names, error details) and from a
session's own output, and they land in log lines. The text format writes every control character of a
message and of its context values as ``\\xNN`` (:func:`escape_controls`), so that a session id holding a
newline cannot forge a line of its own, nor one holding ``ESC`` drive the terminal that shows the log
(issue 37, S8). A traceback keeps its own line breaks. The JSON format needs nothing more: ``json.dumps``
writes every control character, and every character outside ASCII, as an escape.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from typing import Any, Optional, TextIO

CONTEXT_FIELDS = (
    "session_id",
    "outpost",
    "acceptor_id",
    "slot",
    "pid",
    "sha",
    "exit_code",
    "attempt",
    "machine",
    "error_kind",
)
_secrets: set[str] = set()
_secrets_lock = threading.Lock()
#: C0 and C1 controls, DEL, and the Unicode line and paragraph separators (some viewers break lines there).
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` with each control character written as ``\\xNN`` (``\\u2028``, ``\\u2029``): one line,
    whatever a server or a session put in it. A backslash is kept as it is (Windows paths stay readable), so
    a text that already held ``\\x0a`` reads the same as an escaped newline."""
    return _CONTROLS.sub(_escaped, text)


def register_secret(value: Optional[str]) -> None:
    """Never print ``value`` (ignored when empty or too short to redact safely)."""
    if value and len(value) >= 8:
        with _secrets_lock:
            _secrets.add(value)


def forget_secret(value: Optional[str]) -> None:
    if value:
        with _secrets_lock:
            _secrets.discard(value)


def redact(text: str) -> str:
    with _secrets_lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, "***")
    return text


class RedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message or record.args:
            record.msg = clean
            record.args = None
        return True


class TextFormatter(logging.Formatter):
    """``<time> <LEVEL> <logger>: <message> <key>=<value>...``, one line whatever the message and the values
    hold (:func:`escape_controls`); a traceback follows on its own lines."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(super().formatMessage(record))

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = " ".join(
            f"{name}={escape_controls(str(getattr(record, name)))}"
            for name in CONTEXT_FIELDS
            if getattr(record, name, None) is not None
        )
        return redact(f"{line} {context}" if context else line)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                data[name] = value
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return redact(json.dumps(data, default=str))


def setup_logging(fmt: str = "text", level: str = "info", stream: Optional[TextIO] = None) -> None:
    """Configure the root logger for the worker (idempotent)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # httpx logs every request at INFO; keep it for debugging only.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
