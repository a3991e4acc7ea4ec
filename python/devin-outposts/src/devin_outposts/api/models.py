"""Pydantic models of every wire object in the Outposts fleet API.

These models are shared by the client, the worker and the fleet simulator, so the simulator cannot drift
from what the client parses. They follow docs/fleet-api.md §3:

* unknown fields are kept (``extra="allow"``) so a newer server never breaks an older worker;
* enum fields accept values we do not know yet (:class:`TolerantEnum`), because the contract says
  "tolerate unknown enum values";
* timestamps are Unix seconds; ``claim_deadline`` is also accepted as milliseconds or ISO-8601, as
  some real clients have seen;
* ``connect_token`` is a :class:`pydantic.SecretStr`, so it never shows up in a ``repr`` or a log line,
  while JSON serialisation (the simulator answering a claim) still carries the real value.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import math
import sys
import types
from enum import Enum
from typing import Any, Optional, Union


def _skip_pydantic_plugin_discovery() -> None:
    """Stand in for pydantic's plugin loader before the first model is built.

    Building the first model imports ``pydantic.plugin._loader``, which imports ``importlib.metadata``
    (and with it zipfile, email, csv ...) only to scan every installed distribution for pydantic
    plugins: about 1 MiB of a long-running worker's resident memory. This package uses no pydantic
    plugins. Its sole interface is ``get_plugins()`` (pydantic 2.5 and later); if pydantic already
    loaded the real one, it is kept.
    """
    name = "pydantic.plugin._loader"
    if name in sys.modules:
        return
    stub = types.ModuleType(name, "devin_outposts: no pydantic plugins (see devin_outposts.api.models)")

    def real_attribute(attribute: str) -> Any:
        # A later pydantic that asks the loader for anything else gets the real loader, not an error.
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        del sys.modules[name]
        real = importlib.import_module(name)
        return getattr(real, attribute)

    stub.__dict__["get_plugins"] = lambda: ()
    stub.__dict__["__getattr__"] = real_attribute
    sys.modules[name] = stub


_skip_pydantic_plugin_discovery()

from pydantic import (  # noqa: E402 - after the plugin-loader stand-in
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_serializer,
    field_validator,
    model_validator,
)


class TolerantEnum(str, Enum):
    """A string enum that turns an unknown value into a pseudo-member instead of failing.

    ``Phase("frozen")`` returns a member whose ``value`` is ``"frozen"`` and whose ``known`` is False.
    """

    @classmethod
    def _missing_(cls, value: object) -> Any:
        if not isinstance(value, str):
            return None
        member = str.__new__(cls, value)
        member._name_ = f"UNKNOWN_{value}"
        member._value_ = value
        return member

    @property
    def known(self) -> bool:
        return self._name_ in type(self).__members__

    def __str__(self) -> str:
        return str(self.value)


class Phase(TolerantEnum):
    PENDING = "pending"
    CLAIMED = "claimed"


class SessionStatus(TolerantEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUSPENDED = "suspended"
    TERMINATED = "terminated"


#: Session states after which a pending row must not be claimed (docs/fleet-api.md §5).
FINISHED_SESSION_STATUSES = frozenset({SessionStatus.SUSPENDED, SessionStatus.TERMINATED})


class SessionKind(TolerantEnum):
    NEW = "new"
    RESUME = "resume"


class Platform(TolerantEnum):
    LINUX = "linux"
    MACOS = "macos"
    WINDOWS = "windows"


#: Platforms an outpost may be created with (the server validates against these).
KNOWN_PLATFORMS = tuple(p.value for p in Platform)


class WatchEventType(TolerantEnum):
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


#: The largest timestamp accepted, in seconds: the last second of the year 9999 (as far as ``datetime``
#: goes). Anything larger is refused rather than carried on: 1e400 (a float's infinity) and an integer of
#: 400 digits used to raise ``OverflowError`` out of the client (issue 24).
MAX_UNIX_SECONDS = 253_402_300_799
#: A number above this is taken as milliseconds (it would be past the year 5138 in seconds).
_MILLISECONDS_FROM = 10**11


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}… ({len(text)} characters)"


def parse_unix_seconds(value: Any) -> Optional[int]:
    """Normalise a timestamp to integer Unix seconds.

    Accepts ints/floats in seconds, ints/floats in milliseconds (anything past the year 5138 in seconds
    is taken as milliseconds) and ISO-8601 strings. ``None`` stays ``None``. Anything else, and anything
    that is not a finite number within :data:`MAX_UNIX_SECONDS` of the epoch, raises ``ValueError``
    (which pydantic reports as a validation error), never another exception.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("a timestamp cannot be a boolean")
    if isinstance(value, int):
        seconds = value // 1000 if value > _MILLISECONDS_FROM else value
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"not a timestamp: {_shown(value)}")
        seconds = int(value / 1000 if value > _MILLISECONDS_FROM else value)
    elif isinstance(value, str):
        return _parse_text_timestamp(value)
    else:
        raise ValueError(f"not a timestamp: {_shown(value)}")
    if not -MAX_UNIX_SECONDS <= seconds <= MAX_UNIX_SECONDS:
        raise ValueError(f"timestamp out of range: {_shown(value)}")
    return seconds


def _parse_text_timestamp(value: str) -> int:
    text = value.strip()
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        seconds = parse_unix_seconds(number)
        assert seconds is not None
        return seconds
    try:
        parsed = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError(f"not a timestamp: {_shown(value)}") from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=_dt.timezone.utc)
    return int(parsed.timestamp())


class WireModel(BaseModel):
    """Base of every wire object: keeps unknown fields, accepts field names or aliases."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready dict the server sends (secrets revealed, ``None`` kept)."""
        return self.model_dump(mode="json", by_alias=False)


# --- queue entries (resource type ``devins``) -------------------------------------------------------


class DevinMetadata(WireModel):
    session_id: str
    outpost_id: str
    created_at: Optional[int] = None
    updated_at: Optional[int] = None

    @model_validator(mode="before")
    @classmethod
    def _rename_pool_id(cls, data: Any) -> Any:
        # ``pool_id`` is the historical name of ``outpost_id`` (docs/fleet-api.md §3).
        if isinstance(data, dict) and "outpost_id" not in data and "pool_id" in data:
            data = dict(data)
            data["outpost_id"] = data.pop("pool_id")
        return data

    @field_validator("created_at", "updated_at", mode="before")
    @classmethod
    def _timestamps(cls, value: Any) -> Optional[int]:
        return parse_unix_seconds(value)


class NetworkRule(WireModel):
    hostname: Optional[str] = None
    ipv4: Optional[str] = None
    ipv6: Optional[str] = None


class NetworkPolicy(WireModel):
    enabled: bool = False
    allow: list[NetworkRule] = Field(default_factory=list)


class DevinSpec(WireModel):
    kind: SessionKind = SessionKind.NEW
    platform: Optional[Platform] = None
    remote_binary_sha: Optional[str] = None
    network_policy: Optional[NetworkPolicy] = None


class DevinStatus(WireModel):
    phase: Phase = Phase.PENDING
    acceptor_id: Optional[str] = None
    claim_deadline: Optional[int] = None
    session_status: SessionStatus = SessionStatus.PENDING
    # Only present in a successful claim response.
    connect_token: Optional[SecretStr] = None
    gateway_url: Optional[str] = None

    @field_validator("claim_deadline", mode="before")
    @classmethod
    def _deadline(cls, value: Any) -> Optional[int]:
        return parse_unix_seconds(value)

    @field_serializer("connect_token", when_used="json")
    def _reveal_token(self, value: Optional[SecretStr]) -> Optional[str]:
        return value.get_secret_value() if value is not None else None


class QueueEntry(WireModel):
    metadata: DevinMetadata
    spec: DevinSpec = Field(default_factory=DevinSpec)
    status: DevinStatus = Field(default_factory=DevinStatus)

    @property
    def session_id(self) -> str:
        return self.metadata.session_id

    @property
    def is_finished(self) -> bool:
        """True when the session is suspended or terminated: such pending rows must not be claimed."""
        return self.status.session_status in FINISHED_SESSION_STATUSES

    def connect_token_value(self) -> Optional[str]:
        token = self.status.connect_token
        return token.get_secret_value() if token is not None else None


class QueueList(WireModel):
    """``GET /opbeta/outposts/devins`` envelope (``cursor``-style, not the outposts envelope)."""

    items: list[QueueEntry] = Field(default_factory=list)
    cursor: Optional[str] = None
    has_next_page: bool = False
    total: Optional[int] = None


class WatchEvent(WireModel):
    """One SSE ``data:`` payload of ``GET /opbeta/outposts/devins?watch=true``."""

    type: WatchEventType
    object: QueueEntry
    cursor: Optional[str] = None


class ClaimRequest(WireModel):
    acceptor_id: str


class ReleaseRequest(WireModel):
    acceptor_id: str


# --- outposts ---------------------------------------------------------------------------------------


class OutpostMetadata(WireModel):
    outpost_id: str
    account_id: Optional[str] = None
    created_at: Optional[int] = None

    @field_validator("created_at", mode="before")
    @classmethod
    def _timestamps(cls, value: Any) -> Optional[int]:
        return parse_unix_seconds(value)


class OutpostSpec(WireModel):
    name: str
    platform: Optional[Platform] = None
    description: Optional[str] = None
    allowed_org_ids: Optional[list[str]] = None


class OutpostStatus(WireModel):
    queue_depth: int = 0
    active_claims: int = 0


class Outpost(WireModel):
    metadata: OutpostMetadata
    spec: OutpostSpec
    status: OutpostStatus = Field(default_factory=OutpostStatus)

    @property
    def outpost_id(self) -> str:
        return self.metadata.outpost_id

    @property
    def name(self) -> str:
        return self.spec.name


class OutpostList(WireModel):
    """Outposts list envelope: ``items``/``end_cursor``/``has_next_page``/``total``, paged by ``after``."""

    items: list[Outpost] = Field(default_factory=list)
    end_cursor: Optional[str] = None
    has_next_page: bool = False
    total: Optional[int] = None


class OutpostCreate(WireModel):
    name: str
    platform: Optional[Platform] = None
    description: Optional[str] = None


# --- organization default platform ------------------------------------------------------------------


class DefaultPlatform(WireModel):
    platform: Optional[str] = None
    outpost_pool_id: Optional[str] = None
    outpost_pool_name: Optional[str] = None


class DefaultPlatformUpdate(WireModel):
    """PUT body: at most one of the two may be set; both ``None`` clears the default."""

    platform: Optional[str] = None
    outpost_pool_id: Optional[str] = None


class ErrorBody(WireModel):
    detail: Union[str, list[Any], dict[str, Any]] = ""
