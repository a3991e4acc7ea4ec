# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""The options of the event source ``devin.outposts.outpost_queue``, read and checked before any request.

Part of the source (``extensions/eda/plugins/event_source/outpost_queue.py``), which loads it by path, as it
loads the fleet API's shared modules (docs/eda.md, "What the source shares"); standard library only. The
source's DOCUMENTATION describes each option; ``tests/eda/test_outpost_queue.py`` checks that the documented
defaults are these. The values shared with the other clients (the default API URL and timeout, the phases,
the outpost name rule, the API URL rule, the words of a boolean) are bound by ``python/contract/cases.yaml``.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping
from typing import Any, Optional, Union

# The values of plugins/module_utils/_fleet_api.py and of the worker: python/contract/cases.yaml pins them.
DEFAULT_API_URL = "https://api.devin.ai"
DEFAULT_TIMEOUT = 30.0
PHASES = ("pending", "claimed")
OUTPOST_ID_PREFIX = "outpost_env-"
OUTPOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")
#: The words of a boolean option given as text (any case, around spaces), the worker's
#: (devin_outposts/core/config.py); the case "boolean-words" of python/contract/cases.yaml binds the two.
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
#: The default of backoff_max: the worker's cap for its watch reconnects (FEED_BACKOFF_CAP).
DEFAULT_BACKOFF_MAX = 5.0
OPTIONS = frozenset(
    (
        "api_url",
        "token",
        "validate_certs",
        "ca_path",
        "timeout",
        "outpost",
        "phase",
        "cursor_file",
        "emit_listed",
        "queue_depth_interval",
        "backoff_initial",
        "backoff_max",
    )
)


class OptionError(ValueError):
    """An option of the source is wrong; raised before anything is sent."""


def parse_boolean(name: str, value: Any) -> bool:
    """A boolean option: a YAML boolean, or one of TRUE_WORDS or FALSE_WORDS."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise OptionError(f"{name} must be true or false, got {value!r}")


def _bool(args: Mapping[str, Any], name: str, default: bool) -> bool:
    value = args.get(name)
    return default if value is None else parse_boolean(name, value)


def _number(args: Mapping[str, Any], name: str, default: float, minimum: float) -> float:
    value = args.get(name)
    if value is None:
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise OptionError(f"{name} must be a number, got {value!r}") from None
    if not number >= minimum or number == float("inf"):
        raise OptionError(f"{name} must be a number of at least {minimum:g}, got {value!r}")
    return number


def normalize_api_url(url: str) -> str:
    text = url.strip().rstrip("/")
    if not text.startswith(("http://", "https://")):
        raise OptionError(f"api_url must start with https:// or http://, got {url!r}")
    for suffix in ("/opbeta/outposts", "/opbeta"):
        if text.endswith(suffix):
            text = text[: -len(suffix)]
    return text


def _token(args: Mapping[str, Any], env: Mapping[str, str]) -> str:
    # A separate client from the worker's (which reads the token once, in core/tokenfile.py): the source runs
    # in a decision environment, where ansible-rulebook's own environment or the rulebook gives it.
    token = args.get("token") or env.get("DEVIN_OUTPOSTS_TOKEN") or ""
    if not isinstance(token, str) or not token.strip():
        raise OptionError("no token: set the token option or the DEVIN_OUTPOSTS_TOKEN environment variable")
    if any(c.isspace() for c in token.strip()) or not token.isprintable():
        raise OptionError("the token holds whitespace or control characters; check how it was pasted")
    return token.strip()


def _outpost(args: Mapping[str, Any]) -> Optional[str]:
    if args.get("outpost") is None:
        return None
    outpost = str(args["outpost"]).strip()
    if not outpost.startswith(OUTPOST_ID_PREFIX) and not OUTPOST_NAME.match(outpost):
        raise OptionError(
            f"outpost must be an outpost id ({OUTPOST_ID_PREFIX}...) or a name of 1 to 63 letters, "
            f"digits, '.', '_' or '-', got {args['outpost']!r}"
        )
    return outpost


def _phases(args: Mapping[str, Any]) -> Optional[frozenset[str]]:
    phases = args.get("phase")
    if phases is None:
        return None
    listed = [phases] if isinstance(phases, str) else phases
    if not isinstance(listed, (list, tuple)) or not listed:
        raise OptionError(f"phase must be one of {', '.join(PHASES)} or a list of them, got {phases!r}")
    bad = [p for p in listed if p not in PHASES]
    if bad:
        raise OptionError(f"phase must be one of {', '.join(PHASES)}, got {bad[0]!r}")
    return frozenset(listed)


class Options:
    """The source's validated options: ``args`` as the rulebook gives them, ``environ`` for the fallbacks
    (``os.environ`` unless given)."""

    def __init__(self, args: Mapping[str, Any], environ: Optional[Mapping[str, str]] = None) -> None:
        env = os.environ if environ is None else environ
        unknown = sorted(k for k in args if k not in OPTIONS and not k.startswith("eda_"))
        if unknown:
            raise OptionError(
                f"unknown option(s) {', '.join(unknown)}; the options are {', '.join(sorted(OPTIONS))}"
            )
        api_url = args.get("api_url") or env.get("DEVIN_API_URL") or DEFAULT_API_URL
        self.api_url = normalize_api_url(str(api_url))
        self.token = _token(args, env)
        self.validate_certs = _bool(args, "validate_certs", True)
        self._ssl: Optional[ssl.SSLContext] = None
        self.ca_path: Optional[str] = None
        if args.get("ca_path"):
            self.ca_path = os.path.expanduser(str(args["ca_path"]))
            if not os.path.isfile(self.ca_path) or not os.access(self.ca_path, os.R_OK):
                raise OptionError(f"ca_path {self.ca_path} is not a readable file")
        self.timeout = _number(args, "timeout", DEFAULT_TIMEOUT, 0.1)
        self.outpost = _outpost(args)
        self.phases = _phases(args)
        self.cursor_file = os.path.expanduser(str(args["cursor_file"])) if args.get("cursor_file") else None
        if self.cursor_file and os.path.isdir(self.cursor_file):
            raise OptionError(f"cursor_file {self.cursor_file} is a directory; name a file")
        self.emit_listed = _bool(args, "emit_listed", True)
        interval = _number(args, "queue_depth_interval", 60.0, 0.0)
        if 0 < interval < 1:
            raise OptionError(f"queue_depth_interval must be 0 (off) or at least 1 second, got {interval:g}")
        self.queue_depth_interval = interval
        self.backoff_initial = _number(args, "backoff_initial", 1.0, 0.01)
        # Not set, it follows a larger backoff_initial up rather than refusing it.
        default_max = max(DEFAULT_BACKOFF_MAX, self.backoff_initial)
        self.backoff_max = _number(args, "backoff_max", default_max, 0.01)
        if self.backoff_max < self.backoff_initial:
            raise OptionError(
                f"backoff_max ({self.backoff_max:g}) must not be smaller than "
                f"backoff_initial ({self.backoff_initial:g})"
            )

    def __repr__(self) -> str:  # never show the token
        return f"Options(api_url={self.api_url!r}, outpost={self.outpost!r}, phases={self.phases!r})"

    def ssl_context(self) -> Union[bool, ssl.SSLContext]:
        """What aiohttp's ``ssl`` argument takes: False (no verification) or a context, made once."""
        if not self.validate_certs:
            return False
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=self.ca_path)
        return self._ssl
