"""What the admin mixins (:mod:`~devin_outposts_sim.admin_remote`, :mod:`~devin_outposts_sim.cli_dist`) need
from :class:`~devin_outposts_sim.admin_client.SimAdmin`, which mixes them in: declared, not defined, so the
one definition of each is SimAdmin's."""

from __future__ import annotations

from typing import Any, Callable


class AdminMixin:
    """Base of the ``SimAdmin`` mixins: ``url``, ``_call`` and ``_error`` are SimAdmin's."""

    url: str
    #: ``SimAdmin._call(method, path, operation, *, body=None, params=None, timeout=None)``
    _call: Callable[..., Any]
    #: ``SimAdmin._error(operation, detail)``
    _error: Callable[[str, str], Exception]
