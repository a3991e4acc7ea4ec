"""A stand-in ``devin-remote`` for the fleet simulator: one file, Python 3 standard library only.

The simulator publishes this file, with a ``#!/usr/bin/env python3`` line prepended, as
``devin-remote_<sha>_<suffix>`` (see docs/simulator.md), so a worker downloads, verifies and runs it
exactly like the real binary::

    devin-remote serve      # in the session's working directory

Environment (the spawn contract, docs/fleet-api.md §6.2):

* ``DEVIN_OUTPOST_GATEWAY_URL``, ``DEVIN_OUTPOST_CONNECT_TOKEN``, ``DEVIN_OUTPOST_SESSION_ID``: all three
  are required. ``ws://``/``wss://`` URLs are spoken to as ``http://``/``https://``: the simulator's
  gateway is HTTP long-poll under the claim's ``gateway_url``.
* ``DEVIN_REMOTE_STATE_DIR``: created (0700) and used for ``state.json``, ``calls.jsonl`` and the
  temporary output files of commands. Without it, ``~/.devin`` (a warning is printed).
* ``DEVIN_STANDIN_RETRY_SECONDS`` (default 60) and ``DEVIN_STANDIN_POLL_WAIT`` (default 20, on Windows
  2): how long gateway failures are retried, and how long one long poll waits. Stand-in only. Windows
  does not interrupt a blocking socket read for Ctrl-C (the worker's stop request there): the handler
  runs when the read returns, so a short poll keeps the stop prompt.

It connects with the connect token as a Bearer token and reports its pid, cwd, argv, version and the
environment it was started with (``/proc/self/environ`` on Linux; the connect token's value masked),
then asks for tool calls one at a time, runs each in its working directory and posts the result.
Tools: ``run`` (a shell command or an argv, with a timeout), ``write``, ``edit`` (replace text; an error
when it is not there), ``read`` and ``git_clone`` (a local path or ``file://`` URL into ``repos/<name>``,
reused when already there). Paths must stay inside the working directory. The agent's commands get this
process's environment without the connect token.

Exit codes: 0 the session ended (suspended or terminated); 1 an unexpected error; 2 usage (a missing
variable, a wrong argument); 3 the gateway rejected the connect token (401/403); 4 the gateway stayed
unreachable (connection errors, 5xx) for the retry window; 5 a newer connection of the session took
over; 143 SIGTERM and 130 SIGINT (a running command is killed first).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Optional

EXIT_ENDED, EXIT_ERROR, EXIT_USAGE, EXIT_REJECTED, EXIT_UNREACHABLE, EXIT_SUPERSEDED = 0, 1, 2, 3, 4, 5
REQUIRED = ("DEVIN_OUTPOST_GATEWAY_URL", "DEVIN_OUTPOST_CONNECT_TOKEN", "DEVIN_OUTPOST_SESSION_ID")
TOKEN_VAR = "DEVIN_OUTPOST_CONNECT_TOKEN"  # noqa: S105 - a variable name
MASK = "***"
MAX_OUTPUT = 1024 * 1024
DEFAULT_TIMEOUT = 60.0
CLONE_TIMEOUT = 300.0
REPO_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,99}$")
PROG = "devin-remote"


class Stop(BaseException):
    """SIGTERM or SIGINT arrived: unwind (killing a running command) and exit ``128 + signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.code = 128 + signum
        self.name = signal.Signals(signum).name


class Fatal(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Superseded(Exception):
    pass


class ToolError(Exception):
    """A call that cannot be done as asked; reported as its result, never fatal."""


def say(message: str, *, error: bool = False) -> None:
    print(f"{PROG}: {message}", file=sys.stderr if error else sys.stdout, flush=True)


def version() -> str:
    """The first 12 hex digits of the SHA-1 of this file as published: the SHA the simulator serves it
    under. The package's copy has no shebang (the simulator prepends one), so it is hashed with it."""
    with open(os.path.abspath(__file__), "rb") as handle:
        data = handle.read()
    if not data.startswith(b"#!"):
        data = b"#!/usr/bin/env python3\n" + data
    try:
        digest = hashlib.sha1(data, usedforsecurity=False)  # type: ignore[call-arg,unused-ignore]
    except TypeError:  # pragma: no cover - Python < 3.9
        digest = hashlib.sha1(data)  # noqa: S324
    return digest.hexdigest()[:12]


# --- the gateway --------------------------------------------------------------------------------------


def http_url(url: str) -> str:
    for ws, http in (("ws://", "http://"), ("wss://", "https://")):
        if url.lower().startswith(ws):
            return http + url[len(ws) :]
    return url


class Gateway:
    """HTTP long-poll client of the simulator's gateway; retries transient failures for a window."""

    def __init__(self, url: str, token: str, session_id: str, retry_seconds: float) -> None:
        self.base = http_url(url).rstrip("/") + "/sessions/" + urllib.parse.quote(session_id, safe="")
        self.token = token
        self.retry_seconds = retry_seconds

    def call(
        self, method: str, path: str, body: Optional[dict[str, Any]] = None, timeout: float = 30.0
    ) -> Any:
        deadline = time.monotonic() + self.retry_seconds
        delay = 0.1
        while True:
            try:
                return self._once(method, path, body, timeout)
            except urllib.error.HTTPError as exc:
                detail = _detail(exc)
                if exc.code in (401, 403):
                    raise Fatal(
                        EXIT_REJECTED, f"the gateway rejected the connect token ({exc.code} {detail})"
                    ) from None
                if exc.code == 409 and path.startswith("/next"):
                    raise Superseded(detail) from None
                if exc.code < 500:
                    raise Fatal(
                        EXIT_ERROR, f"the gateway refused {method} {path}: {exc.code} {detail}"
                    ) from None
                problem = f"{exc.code} {detail}"
            except (urllib.error.URLError, OSError, ValueError) as exc:  # refused, reset, timeout, bad JSON
                problem = str(getattr(exc, "reason", exc)) or type(exc).__name__
            if time.monotonic() + delay > deadline:
                raise Fatal(
                    EXIT_UNREACHABLE, f"the gateway stayed unreachable for {self.retry_seconds:g}s: {problem}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    def _once(self, method: str, path: str, body: Optional[dict[str, Any]], timeout: float) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method)  # noqa: S310
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return json.loads(response.read() or b"{}")


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read()).get("detail", exc.reason))
    except (ValueError, AttributeError, OSError):
        return str(exc.reason)


# --- tools --------------------------------------------------------------------------------------------


def confine(root: str, path: Any) -> str:
    """``path`` (relative to ``root``, or absolute) resolved, if it stays inside ``root``."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise ToolError("path must be a non-empty string")
    full = os.path.realpath(os.path.join(root, path))
    inside = os.path.normcase(full) == os.path.normcase(root) or os.path.normcase(full).startswith(
        os.path.normcase(root.rstrip(os.sep) + os.sep)
    )
    if not inside:
        raise ToolError(f"path {path!r} is outside the working directory")
    return full


def _descendants(pid: int) -> list[int]:
    """Every descendant of ``pid`` (Linux ``/proc``; elsewhere none are found)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    for pid in [*_descendants(proc.pid), proc.pid]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL if hasattr(signal, "SIGKILL") else signal.SIGTERM)
    proc.wait()


def _read_capped(handle: Any) -> tuple[str, bool]:
    handle.seek(0)
    data = handle.read(MAX_OUTPUT + 1)
    return data[:MAX_OUTPUT].decode("utf-8", "replace"), len(data) > MAX_OUTPUT


def execute(argv: Any, *, cwd: str, timeout: float, state_dir: str) -> dict[str, Any]:
    """Run ``argv`` (a string runs in the shell); output goes to files, so a lingering child never
    blocks the collection. On timeout or SIGTERM the command and its descendants are killed."""
    env = {key: value for key, value in os.environ.items() if key != TOKEN_VAR}
    env.setdefault("GIT_TERMINAL_PROMPT", "0")
    timed_out = False
    with tempfile.TemporaryFile(dir=state_dir) as out, tempfile.TemporaryFile(dir=state_dir) as err:
        _Signals.spawning = True
        try:
            proc = subprocess.Popen(  # noqa: S603 - running the brain's commands is the point
                argv,
                shell=isinstance(argv, str),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )
        except BaseException:
            _Signals.spawning = False
            raise
        try:
            _raise_pending_stop()  # a signal that came while spawning: kill the command, below
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(proc)
            code = proc.returncode
        except BaseException:
            kill_tree(proc)
            raise
        stdout, cut_out = _read_capped(out)
        stderr, cut_err = _read_capped(err)
    exit_code = 124 if timed_out else (128 - code if code < 0 else code)
    return {
        "exit_code": exit_code,
        "output": stdout,
        "stderr": stderr,
        "error": f"timed out after {timeout:g}s" if timed_out else None,
        "data": {"timed_out": timed_out, "truncated": cut_out or cut_err},
    }


def tool_run(args: dict[str, Any], root: str, state_dir: str) -> dict[str, Any]:
    cwd = confine(root, args.get("cwd") or ".")
    if not os.path.isdir(cwd):
        raise ToolError(f"cwd {args.get('cwd')!r} is not a directory")
    timeout = float(args.get("timeout") or DEFAULT_TIMEOUT)
    try:
        return execute(args["command"], cwd=cwd, timeout=timeout, state_dir=state_dir)
    except OSError as exc:
        raise ToolError(f"could not start the command: {exc}") from None


def tool_write(args: dict[str, Any], root: str, state_dir: str) -> dict[str, Any]:
    path = confine(root, args.get("path"))
    data = str(args.get("content", "")).encode("utf-8")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)
    return _ok(f"wrote {len(data)} bytes to {args['path']}", bytes=len(data))


def tool_edit(args: dict[str, Any], root: str, state_dir: str) -> dict[str, Any]:
    path = confine(root, args.get("path"))
    old, new = str(args.get("old", "")), str(args.get("new", ""))
    if not old:
        raise ToolError("old must not be empty")
    with open(path, encoding="utf-8", newline="") as handle:
        text = handle.read()
    found = text.count(old)
    if not found:
        raise ToolError(f"the text to replace is not in {args['path']}")
    count = int(args["count"]) if args.get("count") else found
    with open(path, "w", encoding="utf-8", newline="") as handle:
        handle.write(text.replace(old, new, count))
    done = min(count, found)
    return _ok(f"replaced {done} occurrence(s) in {args['path']}", replacements=done)


def tool_read(args: dict[str, Any], root: str, state_dir: str) -> dict[str, Any]:
    path = confine(root, args.get("path"))
    with open(path, "rb") as handle:
        data = handle.read(MAX_OUTPUT + 1)
    result = _ok(data[:MAX_OUTPUT].decode("utf-8", "replace"), bytes=min(len(data), MAX_OUTPUT))
    result["data"]["truncated"] = len(data) > MAX_OUTPUT
    return result


def _local_source(url: str) -> str:
    if url.startswith("file://"):
        return urllib.request.url2pathname(urllib.parse.urlparse(url).path)
    if "://" in url or re.match(r"^[\w.-]+@[\w.-]+:", url):
        raise ToolError("the stand-in clones local repositories only (a path or a file:// URL)")
    return url


def tool_git_clone(args: dict[str, Any], root: str, state_dir: str) -> dict[str, Any]:
    url = str(args.get("url", ""))
    source = _local_source(url)
    if not os.path.isdir(os.path.join(root, source)):
        raise ToolError(f"no repository at {url!r}")
    name = args.get("name") or os.path.basename(source.rstrip("/\\"))
    if name.endswith(".git") and not args.get("name"):
        name = name[: -len(".git")]
    if not isinstance(name, str) or not REPO_NAME.match(name) or name in (".", ".."):
        raise ToolError(f"repository name {name!r} must be one path component of letters, digits, . _ -")
    dest = confine(root, os.path.join("repos", name))
    relative = f"repos/{name}"
    if os.path.exists(os.path.join(dest, ".git")):
        return _ok(f"reused {relative}", path=relative, reused=True)
    if os.path.exists(dest) and os.listdir(dest):
        raise ToolError(f"{relative} exists and is not a git checkout")
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    result = execute(
        ["git", "clone", "--quiet", "--", url, dest], cwd=root, timeout=CLONE_TIMEOUT, state_dir=state_dir
    )
    result["data"].update(path=relative, reused=False)
    if result["exit_code"] == 0 and not result["output"]:
        result["output"] = f"cloned {url} into {relative}"
    return result


def _ok(output: str, **data: Any) -> dict[str, Any]:
    return {"exit_code": 0, "output": output, "stderr": "", "error": None, "data": data}


TOOLS = {
    "run": tool_run,
    "write": tool_write,
    "edit": tool_edit,
    "read": tool_read,
    "git_clone": tool_git_clone,
}


def run_call(call: dict[str, Any], root: str, state_dir: str) -> dict[str, Any]:
    started = time.monotonic()
    tool = TOOLS.get(str(call.get("tool")))
    raw_args = call.get("args")
    args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
    try:
        if tool is None:
            raise ToolError(f"unknown tool {call.get('tool')!r}")
        result = tool(args, root, state_dir)
    except (ToolError, OSError, KeyError, TypeError, ValueError) as exc:
        message = str(exc) if isinstance(exc, ToolError) else f"{type(exc).__name__}: {exc}"
        result = {"exit_code": 1, "output": "", "stderr": "", "error": message, "data": {}}
    result["ok"] = result["exit_code"] == 0 and result["error"] is None
    result["duration"] = round(time.monotonic() - started, 6)
    return result


# --- state and the main loop --------------------------------------------------------------------------


class State:
    """``state.json`` (rewritten atomically) and ``calls.jsonl`` (appended) in the state directory."""

    def __init__(self, path: str, session_id: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {
            "session_id": session_id,
            "pid": os.getpid(),
            "version": version(),
            "started_at": time.time(),
            "phase": "connecting",
            "connection_id": None,
            "calls_done": 0,
            "last_call": None,
        }

    def update(self, **changes: Any) -> None:
        self.data.update(changes, updated_at=time.time())
        tmp = os.path.join(self.path, ".state.json.tmp")
        with open(tmp, "w") as handle:
            json.dump(self.data, handle)
        os.replace(tmp, os.path.join(self.path, "state.json"))

    def log_call(self, call_id: str, tool: str, result: dict[str, Any]) -> None:
        line = {"id": call_id, "tool": tool, "exit_code": result["exit_code"], "duration": result["duration"]}
        with open(os.path.join(self.path, "calls.jsonl"), "a") as handle:
            handle.write(json.dumps(line) + "\n")
        self.update(calls_done=self.data["calls_done"] + 1, last_call=call_id)


def _number(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value > 0 else default


def exec_environment() -> tuple[dict[str, str], str]:
    """The environment this process was started with, and where it was read from.

    On Linux ``/proc/self/environ`` holds exactly what the parent passed to exec; ``os.environ`` may
    already have more (Python's own locale coercion adds ``LC_CTYPE`` when no locale is set).
    """
    try:
        with open("/proc/self/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return dict(os.environ), "os.environ"
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
    return env, "/proc/self/environ"


def connection_info(state_dir: str) -> dict[str, Any]:
    started_with, source = exec_environment()
    env = {key: (MASK if key == TOKEN_VAR else value) for key, value in started_with.items()}
    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "cwd": os.getcwd(),
        "argv": sys.argv,
        "env": env,
        "env_source": source,
        "version": version(),
        "state_dir": state_dir,
        "platform": sys.platform,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "hostname": socket.gethostname(),
    }


def serve() -> int:
    missing = [name for name in REQUIRED if not os.environ.get(name)]
    if missing:
        say(f"error: {', '.join(REQUIRED)} must all be set (missing: {', '.join(missing)})", error=True)
        return EXIT_USAGE
    session_id = os.environ["DEVIN_OUTPOST_SESSION_ID"]
    state_dir = os.environ.get("DEVIN_REMOTE_STATE_DIR") or os.path.join(os.path.expanduser("~"), ".devin")
    if not os.environ.get("DEVIN_REMOTE_STATE_DIR"):
        say(f"warning: DEVIN_REMOTE_STATE_DIR is not set; using the shared {state_dir}", error=True)
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    state = State(state_dir, session_id)
    state.update()
    root = os.path.realpath(os.getcwd())
    gateway = Gateway(
        os.environ["DEVIN_OUTPOST_GATEWAY_URL"],
        os.environ[TOKEN_VAR],
        session_id,
        _number("DEVIN_STANDIN_RETRY_SECONDS", 60.0),
    )
    wait = _number("DEVIN_STANDIN_POLL_WAIT", 2.0 if os.name == "nt" else 20.0)  # see the module docstring
    try:
        return _loop(gateway, state, root, state_dir, wait)
    except Fatal as exc:
        state.update(phase="failed", exit_code=exc.code, error=str(exc))
        raise
    except Stop as stop:
        state.update(phase="stopped", exit_code=stop.code)
        raise


def _loop(gateway: Gateway, state: State, root: str, state_dir: str, wait: float) -> int:
    hello = gateway.call("POST", "/connect", connection_info(state_dir))
    connection = int(hello["connection_id"])
    state.update(phase="serving", connection_id=connection)
    session_id = state.data["session_id"]
    say(f"stand-in {version()} connected to the gateway as connection {connection} (session {session_id})")
    while True:
        if hello.get("end"):
            answer: dict[str, Any] = {"type": "end", "session_status": hello.get("session_status")}
        else:
            asked = time.monotonic()
            try:
                answer = gateway.call(
                    "GET", f"/next?connection_id={connection}&wait={wait:g}", timeout=wait + 30
                )
            except Superseded as exc:
                raise Fatal(
                    EXIT_SUPERSEDED, f"a newer connection of this session took over ({exc})"
                ) from None
            if answer.get("type") == "idle" and time.monotonic() - asked < 0.1:
                time.sleep(0.2)  # a server that answers at once (shutting down): do not spin
        kind = answer.get("type")
        if kind == "end":
            state.update(phase="ended", exit_code=EXIT_ENDED, session_status=answer.get("session_status"))
            say(f"the session is {answer.get('session_status')}; exiting")
            return EXIT_ENDED
        if kind != "call":  # "idle" (nothing to do yet) or something newer: ask again
            continue
        call = answer["call"]
        result = run_call(call, root, state_dir)
        state.log_call(str(call["id"]), str(call.get("tool")), result)
        say(f"call {call['id']} ({call.get('tool')}) -> exit {result['exit_code']}")
        path = f"/calls/{urllib.parse.quote(str(call['id']), safe='')}/result?connection_id={connection}"
        try:
            gateway.call("POST", path, result)
        except Fatal as exc:
            if exc.code != EXIT_ERROR:
                raise
            say(f"warning: the result of {call['id']} was not accepted: {exc}", error=True)


class _Signals:
    """While a command is being spawned, a stop signal is held back until the code that kills the command on
    a stop is in place: a Stop raised between the fork and that point would leave the command running."""

    spawning = False
    pending: Optional[int] = None


def _on_signal(signum: int, frame: Any) -> None:
    if _Signals.spawning:
        _Signals.pending = signum
        return
    raise Stop(signum)


def _raise_pending_stop() -> None:
    _Signals.spawning = False
    signum, _Signals.pending = _Signals.pending, None
    if signum is not None:
        raise Stop(signum)


def main(argv: list[str]) -> int:
    if argv[:1] != ["serve"] or len(argv) > 1:
        if argv[:1] in (["version"], ["--version"]):
            print(f"{PROG} stand-in {version()}")
            return 0
        say("usage: devin-remote serve   (or: devin-remote version)", error=True)
        return EXIT_USAGE
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        return serve()
    except Fatal as exc:
        say(f"error: {exc}", error=True)
        return exc.code
    except Stop as stop:
        say(f"stopped by {stop.name}", error=True)
        return stop.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
