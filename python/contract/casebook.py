# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""How the runners read the contract tables: one reading of a case's words, whichever client runs it.

The runners of cases.yaml, stream.yaml and listwatch.yaml live beside their clients (the worker's under
python/devin-outposts/tests, the event source's under tests/eda) and load this file by its path, so a case
means the same to each: who runs it, what an ``@+N`` header is, and the bytes a stream's parts make and the
pieces they are fed in. Standard library and PyYAML only.
"""

from __future__ import annotations

import email.utils
import time
from pathlib import Path
from typing import Any, Optional

import yaml

CONTRACT_DIR = Path(__file__).resolve().parent
#: Who runs a case that names no ``clients:``, per table.
DEFAULT_CLIENTS = {
    "cases.yaml": ("module", "worker"),
    "listwatch.yaml": ("worker", "eda"),
}


def load(table: str) -> Any:
    """The cases of one table of this folder (``cases.yaml``, ``stream.yaml`` or ``listwatch.yaml``)."""
    return yaml.safe_load((CONTRACT_DIR / table).read_text(encoding="utf-8"))


def cases_for(table: str, client: str) -> list[dict[str, Any]]:
    """The cases of a table that ``client`` runs (a case's ``clients:``, else the table's default)."""
    default = DEFAULT_CLIENTS[table]
    return [case for case in load(table) if client in case.get("clients", default)]


def header_value(value: Any) -> str:
    """A scripted header's text: ``@+N`` is an HTTP date N seconds from now, anything else itself."""
    text = str(value)
    if text.startswith("@+"):
        return email.utils.formatdate(time.time() + float(text[2:]), usegmt=True)
    return text


def assemble(parts: list[Any]) -> bytes:
    """The bytes of a stream given as parts (strings, ``{repeat, times}`` or ``{hex}``)."""
    out = bytearray()
    for part in parts:
        if isinstance(part, str):
            out += part.encode("utf-8")
        elif "hex" in part:
            out += bytes.fromhex(part["hex"])
        else:
            out += part["repeat"].encode("utf-8") * part["times"]
    return bytes(out)


def feedings(case: dict[str, Any]) -> dict[str, list[bytes]]:
    """Every way the case's stream is fed: whole, in small pieces (or 64 KiB ones), and its own chunks."""
    data = assemble(case["stream"])
    sizes = (1, 2, 3, 7) if len(data) < 4096 else (65536,)
    ways = {"whole": [data]}
    ways.update(
        {f"{size} bytes at a time": [data[i : i + size] for i in range(0, len(data), size)] for size in sizes}
    )
    if "chunks" in case:
        ways["its chunks"] = [chunk.encode("utf-8") for chunk in case["chunks"]]
        if b"".join(ways["its chunks"]) != data:
            raise ValueError(f"case {case['id']}: its chunks do not make up its stream")
    return ways


def pending_entry(session_id: str, outpost_id: str = "outpost_env-contract") -> dict[str, Any]:
    """A pending queue entry as the API sends it (the list-then-watch cases name sessions only)."""
    return {
        "metadata": {"session_id": session_id, "outpost_id": outpost_id, "created_at": 1, "updated_at": 1},
        "spec": {"kind": "new", "platform": "linux"},
        "status": {"phase": "pending", "session_status": "pending"},
    }


def expectation(case: dict[str, Any], client: str) -> dict[str, Any]:
    """What the case expects of ``client``: its ``expect``, with the client's ``dialects:`` over it."""
    return {**case["expect"], **(case.get("dialects") or {}).get(client, {})}


def judge_call(
    case: dict[str, Any],
    client: str,
    *,
    result: Any,
    error: Optional[dict[str, Any]],
    requests: list[dict[str, Any]],
    sleeps: list[float],
    unasked: int,
) -> None:
    """Fail unless a client's call went as a cases.yaml case says.

    The runner gives the call's outcome in the case's terms: ``result`` (plain data), or ``error`` as
    ``{status, message}``; each request sent as ``{method, path, query}`` (the query's values as text) with
    ``body`` when it sent one; the waits between retries; and how many scripted answers were never asked for.
    """
    expect = expectation(case, client)
    if "error" in expect:
        assert error is not None, f"expected an error, got the result {result!r}"
        assert error["status"] == expect["error"]["status"], error
        assert expect["error"]["message"] in error["message"], error["message"]
        assert "\n" not in error["message"], "an error is one line"
    else:
        assert error is None, f"expected {expect.get('result')!r}, got the error {error}"
        assert result == expect["result"]
    assert not unasked, f"{unasked} scripted answer(s) were never asked for"
    if "requests" in expect:
        assert len(requests) == len(expect["requests"]), requests
        for sent, wanted in zip(requests, expect["requests"]):
            assert sent["method"] == wanted["method"], sent
            assert sent["path"] == wanted["path"], sent
            for key, value in (wanted.get("query") or {}).items():
                assert sent["query"].get(key) == str(value), (key, sent)
            if "body" in wanted:
                assert sent.get("body") == wanted["body"], sent
    if "sleeps" in expect:
        assert len(sleeps) == len(expect["sleeps"]), sleeps
        for slept, wanted in zip(sleeps, expect["sleeps"]):
            low, high = (wanted, wanted) if not isinstance(wanted, list) else wanted
            assert low - 0.01 <= slept <= high + 0.01, (slept, wanted)


def judge_reader(case: dict[str, Any], reader_class: Any, too_large: type[Exception]) -> None:
    """Fail unless the reader ``reader_class`` does what a stream.yaml ``sse`` case says, fed every way.

    The reader is built with the case's ``limits`` as ``max_<part>``; it is fed with ``feed(bytes)``, which
    returns events (with ``data`` and ``event``), and it refuses a stream over a cap with ``too_large``
    (carrying the cap's ``part``).
    """
    expect = case["expect"]
    limits = case.get("limits") or {}
    for way, chunks in feedings(case).items():
        reader = reader_class(**{f"max_{part}": limit for part, limit in limits.items()})
        events: list[Any] = []
        failure = None
        try:
            for chunk in chunks:
                events.extend(reader.feed(chunk))
        except too_large as exc:
            failure = (getattr(exc, "part", None), str(exc))
        if "error" in expect:
            part = expect["error"]
            limit = limits.get(part, 1 << 20)
            assert failure == (part, f"a watch {part} is larger than {limit} bytes"), (way, failure)
            continue
        assert failure is None, (way, failure)
        wanted = [assemble([x]).decode("utf-8") for x in expect["events"]]
        assert [e.data for e in events] == wanted, way
        if "types" in expect:
            assert [e.event for e in events] == expect["types"], way
        if "last_event_id" in expect:
            assert reader.last_event_id == expect["last_event_id"], way
        if "comments" in expect:
            assert reader.comments == expect["comments"], way
