"""Decoding a reply: the one path from bytes off the network to a wire model, or one error.

Every reply is data from the network, and data from the network can be anything: not JSON, JSON nested
100,000 deep (``json.loads`` raises ``RecursionError``), a number past a float's range or an integer of
400 digits (turning those into a timestamp raised ``OverflowError``), a list where an object belongs
(``TypeError`` in code that trusts the shape). None of those is a ``ValueError``, so code that caught
only that let them through and the worker died with a traceback (issue 24).

So nothing in the client calls ``json.loads`` or ``model_validate`` itself: it calls :func:`json_body`
and :func:`validate` (or :func:`decode`, both at once), which turn *any* decoding failure into one
:class:`UndecodableReply` with a short reason. The client raises it as
:class:`~devin_outposts.api.errors.FleetProtocolError`, which the worker and the orchestrator log in one
line and retry like any other answer that breaks the contract.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar, Union

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)

#: Everything decoding untrusted JSON into our models may raise. ``ValueError`` covers
#: ``json.JSONDecodeError``, ``UnicodeDecodeError`` and pydantic's ``ValidationError``;
#: ``ArithmeticError`` covers ``OverflowError``. ``MemoryError`` is not here: the size limits
#: (:mod:`.limits`) come first, and a process out of memory has bigger problems than one reply.
DECODE_ERRORS: tuple[type[BaseException], ...] = (ValueError, ArithmeticError, RecursionError, TypeError)
#: The most characters of a reply or of a problem quoted in an error message.
SHOWN = 120


class UndecodableReply(Exception):
    """A reply that is not JSON, or not the JSON the contract describes. ``reason`` is one short line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def shown(text: Union[str, bytes], limit: int = SHOWN) -> str:
    """At most ``limit`` characters of ``text`` (a reply's start), quoted, for an error message."""
    if isinstance(text, bytes):
        text = text[: limit * 4].decode("utf-8", errors="replace")
    return repr(text[:limit] + ("…" if len(text) > limit else ""))


def _why(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "it is nested too deeply"
    if isinstance(exc, ArithmeticError):
        return "a number in it is out of range"
    return f"{type(exc).__name__}: {str(exc)[:SHOWN]}"


def json_body(content: Union[bytes, str]) -> Any:
    """The JSON value of a reply's body, or :class:`UndecodableReply`."""
    try:
        return json.loads(content)
    except json.JSONDecodeError as exc:
        raise UndecodableReply(f"the API answered with a body that is not JSON: {shown(content)}") from exc
    except DECODE_ERRORS as exc:
        raise UndecodableReply(f"the API answered with a body that cannot be decoded: {_why(exc)}") from exc


def validate(model: type[M], body: Any) -> M:
    """``body`` (decoded JSON) as ``model``, or :class:`UndecodableReply` naming up to three problems."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])[:SHOWN] or 'body'}: {str(error['msg'])[:SHOWN]}"
            for error in exc.errors(include_url=False, include_input=False)[:3]
        )
        raise UndecodableReply(f"unexpected response: {problems}") from exc
    except DECODE_ERRORS as exc:
        raise UndecodableReply(f"unexpected response: {_why(exc)}") from exc


def decode(model: type[M], content: Union[bytes, str]) -> M:
    """A reply's body as ``model``: :func:`json_body`, then :func:`validate`."""
    return validate(model, json_body(content))


def error_detail(content: bytes, fallback: str) -> str:
    """The server's ``detail`` in an error reply (FastAPI style), else the start of the body, else
    ``fallback`` (the reason phrase): one line for an error message, whatever the body holds.

    A list-shaped ``detail`` (FastAPI's validation errors) becomes ``loc.path: msg; ...``.
    """
    text = content.decode("utf-8", errors="replace").strip()
    try:
        body = json_body(content)
        if isinstance(body, dict) and "detail" in body:
            detail = body["detail"]
            if isinstance(detail, list):
                return "; ".join(_validation_error(item) for item in detail)[:300]
            return detail[:300] if isinstance(detail, str) else json.dumps(detail)[:300]
        return json.dumps(body)[:200]
    except UndecodableReply:
        pass
    except DECODE_ERRORS:  # json.dumps of something json.loads could only just read (deep, huge)
        pass
    return text[:200] if text else fallback


def _validation_error(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)[:SHOWN]
    message = str(item["msg"]) if "msg" in item else json.dumps(item)
    loc = item.get("loc")
    if isinstance(loc, list) and loc:
        return ".".join(str(part) for part in loc) + ": " + message
    return message
