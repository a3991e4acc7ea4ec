"""The launcher's own exit codes (:mod:`.sandbox` is their seam; :mod:`.launcher` exits with them)."""

from __future__ import annotations

from enum import IntEnum


class SandboxExit(IntEnum):
    """The launcher's own exit codes (a session's exit status passes through unchanged).

    Chosen above what shells use (126, 127, 128 + signal up to 192) and below 255.
    """

    #: The command line or the policy file cannot be used.
    BAD_USAGE = 240
    #: ``ip`` (iproute2) or ``nft`` (nftables) is not installed.
    MISSING_TOOL = 241
    #: The namespace could not be set up (``ip``/``nft`` or a mount refused), or the view not be built.
    SETUP_FAILED = 242
    #: The preflight found a way out of the namespace (another link, no drop, no redirect).
    NOT_ISOLATED = 243
    #: The shim or the stub DNS could not listen.
    SHIM_FAILED = 244
    #: The session's program could not be started (not found, not executable, no user namespace for it).
    SESSION_NOT_STARTED = 245
    #: The session's namespaces could not be made (user namespaces disabled, a seccomp filter, no map).
    NAMESPACES = 246
