"""What every ``devin-outposts-sim`` verb shares: exit codes, the one-line error, JSON output.

The exit codes are the worker's (docs/worker.md, "Exit codes"), so scripts treat both commands alike;
they are written out here because the simulator does not import the worker.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_AUTH = 3
EXIT_NOT_FOUND = 4
EXIT_CONFLICT = 5
PROG = "devin-outposts-sim"


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of plain text")


def fail(message: str, code: int = EXIT_ERROR) -> int:
    """Print one error line to stderr and return the exit code."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return code


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))
