"""A strict reader for the Windows service's ``worker.env`` (``KEY=VALUE`` lines, as the role writes them).

The file holds the API token, so an error names the file and the line, never a value or the text of the
line (a line without ``=`` might be a pasted token). The format is the one the role's
``worker_windows_env_lines`` filter writes:

* blank lines and lines whose first non-blank character is ``#`` are skipped;
* ``NAME=VALUE``, where ``NAME`` is ``[A-Za-z_][A-Za-z0-9_]*`` (blanks around it are allowed);
* ``VALUE`` is everything after the first ``=`` up to the end of the line, verbatim: no quotes, no escapes
  (Windows paths keep their backslashes), nothing expanded (no ``%VAR%``, no ``$VAR``, no command);
* Windows compares variable names without regard to case, so a name given twice in different cases
  (``HTTP_PROXY`` and ``http_proxy``, which the role writes for curl's sake) must have the same value;
  any other repetition is an error;
* UTF-8, with or without the byte-order mark that Windows PowerShell 5.1 writes; CRLF or LF.
"""

from __future__ import annotations

import re
from pathlib import Path

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_BYTES = 1 << 20


class EnvFileError(ValueError):
    """The env file cannot be read or parsed; the message never holds a value from it."""


def parse_env_text(text: str, source: str) -> dict[str, str]:
    """The variables of an env file's text; ``source`` names the file in errors."""
    env: dict[str, str] = {}
    first_line: dict[str, tuple[str, int]] = {}  # upper-case name -> (name, line)
    if text.startswith("\ufeff"):
        text = text[1:]
    # Lines end at LF alone (CR LF too): str.splitlines would also split at characters such as U+2028,
    # which the role does not take out of values, and a value must never become two lines.
    for number, text_line in enumerate(text.split("\n"), start=1):
        line = text_line.removesuffix("\r")
        where = f"{source} line {number}"
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if "\x00" in line:
            raise EnvFileError(f"{where}: the line holds a NUL character")
        name, sep, raw = line.lstrip().partition("=")
        if not sep:
            raise EnvFileError(f"{where}: expected NAME=VALUE (the line has no '=')")
        name = name.strip()
        if not NAME.fullmatch(name):
            raise EnvFileError(f"{where}: the text before '=' is not a variable name")
        value = raw
        upper = name.upper()
        if upper in first_line:
            earlier, earlier_line = first_line[upper]
            if earlier == name:
                raise EnvFileError(f"{where}: {name} is set again (first on line {earlier_line})")
            if env[earlier] != value:
                raise EnvFileError(
                    f"{where}: {name} and {earlier} (line {earlier_line}) are one variable on Windows but "
                    "have different values"
                )
        else:
            first_line[upper] = (name, number)
        env[name] = value
    return env


def read_env_file(path: Path) -> dict[str, str]:
    """The variables of the env file at ``path``."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise EnvFileError(
            f"Could not read the worker environment file {path}: {exc.strerror or exc}"
        ) from exc
    if len(data) > MAX_BYTES:
        raise EnvFileError(f"{path}: larger than {MAX_BYTES} bytes; this is not a worker environment file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise EnvFileError(f"{path} line {line}: not UTF-8 text") from None
    return parse_env_text(text, str(path))
