# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""docs/troubleshooting.md stays true: every message it quotes still occurs in the source tree.

The guide's tables quote each message in their first column, as a code span; ``…`` stands for a part that
varies. A message is found when one source file holds its pieces (the text between the ``…``) in that order.
Whitespace is compared collapsed, since YAML folds long ``fail_msg`` lines. A renamed or reworded message
fails here, by name, until the guide follows.

Run: ``.venv/bin/pytest tests/integration/test_troubleshooting.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "troubleshooting.md"
#: Where the messages a user sees are written: the collection's plugins and roles, the worker's package.
SOURCES = [ROOT / "plugins", ROOT / "roles", ROOT / "python" / "devin-outposts" / "src"]
SUFFIXES = {".py", ".yml", ".yaml", ".j2"}
ELLIPSIS = "…"
CODE_SPAN = re.compile(r"`([^`]+)`")


def collapse(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def quoted_messages(markdown: str) -> list[str]:
    """The code spans of the first column of every table row (header and separator rows excluded)."""
    messages = []
    for line in markdown.splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        first = line.split("|")[1]
        messages.extend(CODE_SPAN.findall(first))
    return messages


def source_texts() -> dict[Path, str]:
    texts = {}
    for base in SOURCES:
        for path in base.rglob("*"):
            if path.suffix in SUFFIXES and path.is_file() and "__pycache__" not in path.parts:
                texts[path] = collapse(path.read_text(errors="replace"))
    return texts


def found_in(message: str, text: str) -> bool:
    """Whether the pieces of ``message`` occur in ``text`` in order."""
    position = 0
    for piece in (collapse(p).strip() for p in message.split(ELLIPSIS)):
        if not piece:
            continue
        position = text.find(piece, position)
        if position < 0:
            return False
        position += len(piece)
    return True


GUIDE_TEXT = GUIDE.read_text()
MESSAGES = [m for m in quoted_messages(GUIDE_TEXT) if not m.isdigit()]
TEXTS = source_texts()


def test_the_guide_quotes_messages() -> None:
    # The parser must see the tables: a guide rewritten into another shape would otherwise pass empty.
    assert len(MESSAGES) >= 50, MESSAGES
    assert len(set(MESSAGES)) == len(MESSAGES), sorted(m for m in MESSAGES if MESSAGES.count(m) > 1)


@pytest.mark.parametrize("message", MESSAGES)
def test_message_occurs_in_the_source(message: str) -> None:
    where = [path.relative_to(ROOT) for path, text in TEXTS.items() if found_in(message, text)]
    assert where, f"docs/troubleshooting.md quotes {message!r}, which no file under plugins/, roles/ or the worker's package writes"


def test_the_exit_codes_are_the_workers() -> None:
    """The exit-code table lists exactly the codes core/exits.py defines, with the same numbers."""
    exits = (ROOT / "python" / "devin-outposts" / "src" / "devin_outposts" / "core" / "exits.py").read_text()
    members = exits[exits.index("class ExitCode") :].split("\n\n\n")[0]
    defined = {int(value) for value in re.findall(r"^    [A-Z_]+ = (\d+)$", members, re.MULTILINE)}
    assert len(defined) >= 9, members
    listed = {int(code) for code in re.findall(r"^\| (\d+) \|", GUIDE_TEXT, re.MULTILINE)}
    assert listed == defined
