"""The tool calls the simulated brain can script for a session, and builders for tests.

A call is a flat JSON object: ``{"tool": "run", "command": "make test", "timeout": 30}``. The brain API
(``POST /_sim/sessions/{id}/calls``) checks the tool name and the argument types here; the stand-in
``devin-remote`` (:mod:`devin_outposts_sim.remote.standin`) checks the rest (paths stay inside its
working directory, the text to edit is there, the repository is local) and reports a failure as the
call's result. See docs/simulator.md.

::

    from devin_outposts_sim.remote import tools

    sim.admin.add_calls(session_id, [
        tools.git_clone(repo_path),                 # into repos/<name>, reused when already there
        tools.edit("repos/app/README.md", "old", "new"),
        tools.run("make test", cwd="repos/app", timeout=60),
        tools.write("notes.txt", "done\\n"),
        tools.read("notes.txt"),
    ])
"""

from __future__ import annotations

from typing import Any, Optional, Union

from devin_outposts_sim.errors import Invalid

#: tool -> {argument: (types, required)}. ``bool`` is excluded from numbers explicitly below.
TOOLS: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    "run": {"command": ((str, list), True), "timeout": ((int, float), False), "cwd": ((str,), False)},
    "write": {"path": ((str,), True), "content": ((str,), True)},
    "edit": {
        "path": ((str,), True),
        "old": ((str,), True),
        "new": ((str,), True),
        "count": ((int,), False),
    },
    "read": {"path": ((str,), True)},
    "git_clone": {"url": ((str,), True), "name": ((str,), False)},
}
MAX_CALLS = 500
MAX_ARG_CHARS = 1_000_000
MAX_TIMEOUT = 3600.0


def validate_call(raw: Any) -> tuple[str, dict[str, Any]]:
    """``(tool, args)`` of one call, or :class:`Invalid` naming what is wrong."""
    if not isinstance(raw, dict):
        raise Invalid("each call must be a JSON object with a tool field")
    tool = raw.get("tool")
    if tool not in TOOLS:
        raise Invalid(f"tool must be one of {', '.join(TOOLS)}")
    spec = TOOLS[tool]
    args = {key: value for key, value in raw.items() if key != "tool"}
    for name in args:
        if name not in spec:
            raise Invalid(f"{tool}: unknown argument {name!r} (known: {', '.join(spec)})")
    for name, (types, required) in spec.items():
        if name not in args or args[name] is None:
            if required:
                raise Invalid(f"{tool}: {name} is required")
            args.pop(name, None)
            continue
        value = args[name]
        if isinstance(value, bool) or not isinstance(value, types):
            raise Invalid(f"{tool}: {name} has the wrong type")
        if isinstance(value, str) and len(value) > MAX_ARG_CHARS:
            raise Invalid(f"{tool}: {name} is longer than {MAX_ARG_CHARS} characters")
    command = args.get("command")
    if isinstance(command, list) and (not command or not all(isinstance(a, str) for a in command)):
        raise Invalid("run: command must be a string or a non-empty list of strings")
    if isinstance(command, str) and not command.strip():
        raise Invalid("run: command must not be empty")
    timeout = args.get("timeout")
    if timeout is not None and not 0 < float(timeout) <= MAX_TIMEOUT:
        raise Invalid(f"run: timeout must be between 0 and {MAX_TIMEOUT:g} seconds")
    if tool == "edit":
        if not args["old"]:
            raise Invalid("edit: old must not be empty")
        if "count" in args and args["count"] < 1:
            raise Invalid("edit: count must be at least 1")
    return str(tool), args


def validate_calls(raw: Any) -> list[tuple[str, dict[str, Any]]]:
    if not isinstance(raw, list) or not raw:
        raise Invalid("calls must be a non-empty list of tool calls")
    if len(raw) > MAX_CALLS:
        raise Invalid(f"at most {MAX_CALLS} calls at a time")
    return [validate_call(item) for item in raw]


# --- builders -----------------------------------------------------------------------------------------


def _call(tool: str, **args: Any) -> dict[str, Any]:
    return {"tool": tool, **{key: value for key, value in args.items() if value is not None}}


def run(
    command: Union[str, list[str]], *, timeout: Optional[float] = None, cwd: Optional[str] = None
) -> dict[str, Any]:
    """Run a shell command (a string) or an argv (a list) in the working directory (or ``cwd`` in it)."""
    return _call("run", command=command, timeout=timeout, cwd=cwd)


def write(path: str, content: str) -> dict[str, Any]:
    """Write ``content`` to ``path`` (parent directories are created)."""
    return _call("write", path=path, content=content)


def edit(path: str, old: str, new: str, *, count: Optional[int] = None) -> dict[str, Any]:
    """Replace ``old`` by ``new`` in ``path`` (every occurrence, or the first ``count``)."""
    return _call("edit", path=path, old=old, new=new, count=count)


def read(path: str) -> dict[str, Any]:
    return _call("read", path=path)


def git_clone(url: str, *, name: Optional[str] = None) -> dict[str, Any]:
    """Clone a local repository (a path or ``file://`` URL) into ``repos/<name>``."""
    return _call("git_clone", url=url, name=name)
