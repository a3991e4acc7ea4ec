"""The brain and distribution verbs of ``devin-outposts-sim`` (registered by ``devin_outposts_sim.cli``).

* ``sim call SESSION --run CMD --write PATH TEXT --edit PATH OLD NEW --read PATH --clone URL
  [--calls-file FILE|-]``: script tool calls, in the order given; prints their ids.
* ``sim calls SESSION [--wait SECONDS]``: the calls and their results.
* ``sim connections SESSION [--wait SECONDS]``: what each remote connection reported.
* ``sim end SESSION [--status suspended|terminated]``: end the session; its remote exits 0.
* ``sim dist show``, ``sim dist publish FILE [--sha --suffix --latest --tampered]``,
  ``sim dist set-latest SHA [--suffix]``: the ``devin-remote`` distribution.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

from devin_outposts_sim.admin_client import SimAdmin
from devin_outposts_sim.cli.common import EXIT_OK, EXIT_USAGE, fail, print_json
from devin_outposts_sim.remote import tools
from devin_outposts_sim.state.dist import SUFFIXES, sha256_hex

Action = Callable[[SimAdmin, argparse.Namespace], int]
AdminParser = Callable[[Any, str, str, Action], Any]


class _AppendCall(argparse.Action):
    """Collect ``--run/--write/--edit/--read/--clone`` into one ordered list of calls."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        values = [values] if isinstance(values, str) else list(values)
        build: dict[str, Callable[..., dict[str, Any]]] = {
            "run": tools.run,
            "write": tools.write,
            "edit": tools.edit,
            "read": tools.read,
            "git_clone": tools.git_clone,
        }
        calls = list(getattr(namespace, "calls", None) or [])
        calls.append(build[self.const](*values))
        namespace.calls = calls


def _call(admin: SimAdmin, args: argparse.Namespace) -> int:
    calls = list(args.calls or [])
    if args.calls_file:
        text = sys.stdin.read() if args.calls_file == "-" else Path(args.calls_file).read_text()
        try:
            loaded = json.loads(text)
        except ValueError as exc:
            return fail(f"{args.calls_file} is not JSON: {exc}", EXIT_USAGE)
        calls += loaded if isinstance(loaded, list) else [loaded]
    if not calls:
        return fail(
            "give at least one call (--run, --write, --edit, --read, --clone or --calls-file)", EXIT_USAGE
        )
    added = admin.add_calls(args.session, calls)
    if args.json:
        print_json(added)
    else:
        for call in added:
            print(call["id"])
    return EXIT_OK


def _print_calls(calls: list[dict[str, Any]]) -> None:
    for call in calls:
        result = call["result"] or {}
        code = result.get("exit_code")
        print(f"{call['id']}\t{call['tool']}\t{call['state']}\t{'-' if code is None else code}")
        for stream in ("output", "stderr", "error"):
            text = result.get(stream)
            if text:
                for line in str(text).splitlines():
                    print(f"    {stream}: {line}")


def _calls(admin: SimAdmin, args: argparse.Namespace) -> int:
    calls = admin.wait_calls(args.session, args.wait) if args.wait else admin.calls(args.session)
    if args.json:
        print_json(calls)
    else:
        _print_calls(calls)
    return EXIT_OK


def _connections(admin: SimAdmin, args: argparse.Namespace) -> int:
    if args.wait:
        admin.wait_connection(args.session, timeout=args.wait)
    items = admin.connections(args.session)
    if args.json:
        print_json(items)
    else:
        for item in items:
            print(f"{item['connection_id']}\t{item.get('pid')}\t{item.get('version')}\t{item.get('cwd')}")
    return EXIT_OK


def _end(admin: SimAdmin, args: argparse.Namespace) -> int:
    entry = admin.end_session(args.session, args.status)
    if args.json:
        print_json(entry.to_wire())
    else:
        print(f"{entry.session_id} {entry.status.session_status}")
    return EXIT_OK


def _dist_show(admin: SimAdmin, args: argparse.Namespace) -> int:
    state = admin.dist()
    if args.json:
        print_json(state)
        return EXIT_OK
    print(f"static base URL: {admin.static_base_url}")
    for suffix, sha in state["latest"].items():
        print(f"latest_{suffix}\t{sha}")
    for item in state["artifacts"]:
        marks = [m for m in ("builtin", "tampered") if item[m]]
        print(f"{item['name']}\t{item['size']}\t{item['sha256']}\t{','.join(marks)}".rstrip())
    return EXIT_OK


def _dist_publish(admin: SimAdmin, args: argparse.Namespace) -> int:
    content = Path(args.file).read_bytes()
    published = sha256_hex(content + b"\0tampered") if args.tampered else None
    sha = admin.publish_remote(
        content, sha=args.sha, suffixes=args.suffix, latest=args.latest, published_sha256=published
    )
    if args.json:
        print_json({"sha": sha})
    else:
        print(sha)
    return EXIT_OK


def _dist_set_latest(admin: SimAdmin, args: argparse.Namespace) -> int:
    latest = admin.set_latest(args.sha, suffixes=args.suffix)
    if args.json:
        print_json(latest)
    else:
        for suffix, sha in latest.items():
            print(f"latest_{suffix}\t{sha}")
    return EXIT_OK


def add_remote_verbs(verbs: Any, admin_parser: AdminParser) -> None:
    call = admin_parser(verbs, "call", "script tool calls for a session (prints their ids)", _call)
    call.add_argument("session", help="session id")
    for flag, tool, nargs, metavar, text in (
        ("--run", "run", None, "COMMAND", "run a shell command"),
        ("--write", "write", 2, ("PATH", "CONTENT"), "write a file"),
        ("--edit", "edit", 3, ("PATH", "OLD", "NEW"), "replace text in a file"),
        ("--read", "read", None, "PATH", "read a file"),
        ("--clone", "git_clone", None, "REPO", "clone a local repository into repos/"),
    ):
        call.add_argument(
            flag, action=_AppendCall, const=tool, nargs=nargs, metavar=metavar, dest="calls", help=text
        )
    call.add_argument("--calls-file", default=None, help="a JSON list of calls ('-' for stdin)")

    calls = admin_parser(verbs, "calls", "print a session's tool calls and results", _calls)
    calls.add_argument("session", help="session id")
    calls.add_argument("--wait", type=float, default=0, help="first wait up to SECONDS for every call")

    conns = admin_parser(verbs, "connections", "print what a session's remotes reported", _connections)
    conns.add_argument("session", help="session id")
    conns.add_argument("--wait", type=float, default=0, help="first wait up to SECONDS for a connection")

    end = admin_parser(verbs, "end", "end a session as suspended or terminated", _end)
    end.add_argument("session", help="session id")
    end.add_argument("--status", default="terminated", choices=["suspended", "terminated"])

    dist = verbs.add_parser("dist", help="the devin-remote distribution").add_subparsers(
        dest="dist_command", metavar="VERB"
    )
    dist.required = True
    admin_parser(dist, "show", "print the latest SHAs and the artifacts", _dist_show)
    publish = admin_parser(dist, "publish", "publish a file as devin-remote (prints its SHA)", _dist_publish)
    publish.add_argument("file", help="the artifact's content")
    publish.add_argument("--sha", default=None, help="default: the first 12 hex of the content's SHA-1")
    publish.add_argument("--suffix", action="append", choices=SUFFIXES, help="repeatable; default all")
    publish.add_argument("--latest", action="store_true", help="also make it latest")
    publish.add_argument("--tampered", action="store_true", help="serve a .sha256 that does not match")
    latest = admin_parser(dist, "set-latest", "point latest_<suffix> at a SHA", _dist_set_latest)
    latest.add_argument("sha")
    latest.add_argument("--suffix", action="append", choices=SUFFIXES, help="repeatable; default all")
