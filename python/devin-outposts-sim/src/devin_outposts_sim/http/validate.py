"""Input validation shared by the public routes, the admin API and the store.

Every function raises :class:`~devin_outposts_sim.errors.Invalid` (422) with a ``detail`` that names the
field, so the fleet API and the admin API reject bad input the same way.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

from devin_outposts.api.models import KNOWN_PLATFORMS
from devin_outposts_sim.errors import Invalid

#: Outpost names: a letter or digit, then letters, digits, ``.``, ``_`` or ``-``; at most 63 characters
#: (the names in the docs are ``rhel``, ``gpu-h200``, ``dev-boxes``).
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
NAME_MAX = 63
#: Organization names (the simulator's choice; the contract gives none): 1-200 characters, not only
#: spaces, no control characters (so a name is one line and one column of ``sim org list``).
ORG_NAME_MAX = 200
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
DESCRIPTION_MAX = 1000
#: Session, account and acceptor ids: printable, no whitespace or slashes.
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")
ACCEPTOR_MAX = 256
PAGE_MIN = 1
PAGE_MAX = 200
PAGE_DEFAULT = 100
#: The words a yes/no query parameter accepts (any case): the same as the worker's and the orchestrator's
#: (devin_outposts.core.config.TRUE_WORDS and FALSE_WORDS), which the simulator may not import (it uses
#: devin_outposts.api only); python/devin-outposts/tests/test_options.py holds the two to each other.
TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
FALSE_WORDS = frozenset({"false", "0", "no", "off"})


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object; an empty body is an empty object."""
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Invalid(f"Request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise Invalid("Request body must be a JSON object")
    return data


def optional_str(body: dict[str, Any], field: str, *, max_len: int = 1000) -> Optional[str]:
    value = body.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise Invalid(f"{field} must be a string or null")
    if len(value) > max_len:
        raise Invalid(f"{field} must be at most {max_len} characters")
    return value


def required_str(body: dict[str, Any], field: str, *, max_len: int = 1000) -> str:
    value = optional_str(body, field, max_len=max_len)
    if value is None or not value.strip():
        raise Invalid(f"{field} is required and must be a non-empty string")
    return value


def outpost_name(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise Invalid("name is required and must be a non-empty string")
    if len(value) > NAME_MAX:
        raise Invalid(f"name must be at most {NAME_MAX} characters")
    if not NAME_RE.match(value):
        raise Invalid(
            "name must start with a letter or digit and contain only letters, digits, '.', '_' and '-'"
        )
    return value


def org_name(value: Any) -> Optional[str]:
    """An organization's ``name``, or ``None`` (the simulator then names it)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise Invalid("name must be a non-empty string or null")
    if len(value) > ORG_NAME_MAX:
        raise Invalid(f"name must be at most {ORG_NAME_MAX} characters")
    if _CONTROL_RE.search(value):
        raise Invalid("name must not contain control characters")
    return value


def outpost_platform(value: Any) -> Optional[str]:
    """``linux``, ``macos``, ``windows`` or ``None`` (the default platform)."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in KNOWN_PLATFORMS:
        raise Invalid(f"platform must be one of {', '.join(KNOWN_PLATFORMS)} or null")
    return value


def identifier(value: Any, field: str) -> str:
    if not isinstance(value, str) or not ID_RE.match(value):
        raise Invalid(f"{field} must be 1-128 characters: letters, digits and . _ : @ -")
    return value


def acceptor_id(body: dict[str, Any]) -> str:
    value = body.get("acceptor_id")
    if not isinstance(value, str) or not value.strip():
        raise Invalid("acceptor_id is required and must be a non-empty string")
    if len(value) > ACCEPTOR_MAX:
        raise Invalid(f"acceptor_id must be at most {ACCEPTOR_MAX} characters")
    return value


def page_size(raw: Optional[str]) -> int:
    """The ``first`` query parameter: an integer from 1 to 200, default 100."""
    if raw is None:
        return PAGE_DEFAULT
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not PAGE_MIN <= value <= PAGE_MAX:
        raise Invalid(f"first must be an integer between {PAGE_MIN} and {PAGE_MAX}")
    return value


def query_bool(raw: Optional[str], field: str) -> bool:
    if raw is None:
        return False
    lowered = raw.lower()
    if lowered in TRUE_WORDS:
        return True
    if lowered in FALSE_WORDS:
        return False
    raise Invalid(f"{field} must be true or false")
