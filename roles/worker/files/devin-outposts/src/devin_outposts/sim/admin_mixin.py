"""What the admin mixins (:mod:`~devin_outposts.sim.admin_remote`, :mod:`~devin_outposts.sim.cli_dist`) need
from :class:`~devin_outposts.sim.admin_client.SimAdmin`, which mixes them in and overrides these."""

from __future__ import annotations

from typing import Any, Optional


class AdminMixin:
    """Base of the ``SimAdmin`` mixins: ``url``, ``_call`` and ``_error`` come from ``SimAdmin``."""

    url: str

    def _call(
        self,
        method: str,
        path: str,
        operation: str,
        *,
        body: Optional[dict[str, Any]] = None,
        params: Optional[dict[str, Any]] = None,
        timeout: Optional[float] = None,
    ) -> Any:  # pragma: no cover - SimAdmin overrides it
        raise NotImplementedError("the admin mixins are used through SimAdmin")

    def _error(self, operation: str, detail: str) -> Exception:  # pragma: no cover - SimAdmin overrides it
        raise NotImplementedError("the admin mixins are used through SimAdmin")
