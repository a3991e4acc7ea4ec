"""``devin-outposts-sim ...``: run the fleet simulator and script it through its admin API.

``devin-outposts-sim serve`` runs the simulated fleet API. The other verbs talk to a running simulator: its
URL comes from ``--url`` or ``$DEVIN_SIM_URL``; its admin token from ``--admin-token-file``,
``$DEVIN_SIM_ADMIN_TOKEN`` or ``$DEVIN_SIM_ADMIN_TOKEN_FILE`` (never from argv). They print the essential
value (a token, an id) for scripts, or the whole object with ``--json``; a failure prints one line and
exits non-zero.
The brain verbs (``call``, ``calls``, ``connections``, ``end``) and ``dist`` are in
:mod:`devin_outposts_sim.cli.remote`. See docs/simulator.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Optional

from devin_outposts_sim.admin_client import SimAdmin, SimAdminError
from devin_outposts_sim.cli.common import (
    EXIT_AUTH,
    EXIT_CONFLICT,
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    add_json_option,
    fail,
    print_json,
)
from devin_outposts_sim.cli.devin_cli import add_cli_dist_verbs
from devin_outposts_sim.cli.remote import add_remote_verbs
from devin_outposts_sim.http.config import DEFAULT_DB, DEFAULT_HOST, DEFAULT_PORT, SimConfig
from devin_outposts_sim.http.server import ADMIN_TOKEN_ENV, resolve_admin_token, serve
from devin_outposts_sim.state.accounts import DEFAULT_ACCOUNT
from devin_outposts_sim.state.db import DEFAULT_TOMBSTONE_AFTER, check_tombstone_after

URL_ENV = "DEVIN_SIM_URL"
DB_ENV = "DEVIN_SIM_DB"
TOMBSTONE_AFTER_ENV = "DEVIN_SIM_TOMBSTONE_AFTER"
#: How ``--tombstone-after`` (and its variable) spells "ended sessions stay".
NEVER = "never"
TOKEN_FILE_ENV = "DEVIN_SIM_ADMIN_TOKEN_FILE"  # noqa: S105 - a variable name
DEFAULT_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"

Handler = Callable[[argparse.Namespace], int]


# --- serve -------------------------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    try:
        token, token_file = resolve_admin_token(args.db, args.admin_token_file)
    except OSError as exc:
        return fail(f"Could not prepare the admin token file: {exc}")
    config = SimConfig(
        db=args.db,
        claim_ttl=args.claim_ttl,
        watch_max_duration=args.watch_max_duration,
        keepalive_interval=args.keepalive_interval,
        sweep_interval=args.sweep_interval,
        gateway_url=args.gateway_url,
        status_lag=args.status_lag,
        tombstone_after=args.tombstone_after,
        admin_token=token,
    )
    try:
        config.validate()
    except ValueError as exc:
        return fail(str(exc), EXIT_USAGE)
    return serve(
        config,
        host=args.host,
        port=args.port,
        port_file=args.port_file,
        admin_token_file=token_file,
        log_level=args.log_level,
        access_log=not args.no_access_log,
    )


def _tombstone_after(text: str) -> Optional[float]:
    """``--tombstone-after``: a positive number of seconds, or ``never``."""
    if text.strip().lower() == NEVER:
        return None
    try:
        return check_tombstone_after(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"tombstone_after must be a positive number of seconds, or {NEVER} (got {text!r})"
        ) from None


def _add_serve(verbs: Any) -> None:
    parser = verbs.add_parser("serve", help="run the simulated fleet API", allow_abbrev=False)
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port; 0 picks a free one ({DEFAULT_PORT})"
    )
    parser.add_argument(
        "--db",
        default=os.environ.get(DB_ENV, DEFAULT_DB),
        help=f"SQLite file, or :memory: (env {DB_ENV}, default ./{DEFAULT_DB})",
    )
    parser.add_argument("--claim-ttl", type=float, default=300.0, help="claim lifetime in seconds (300)")
    parser.add_argument(
        "--watch-max-duration", type=float, default=300.0, help="seconds before a watch stream ends (300)"
    )
    parser.add_argument(
        "--keepalive-interval",
        type=float,
        default=15.0,
        help="seconds between keepalives on idle streams (15)",
    )
    parser.add_argument(
        "--sweep-interval", type=float, default=1.0, help="seconds between expired-claim sweeps (1)"
    )
    parser.add_argument(
        "--status-lag",
        type=float,
        default=0.0,
        help="seconds between telling a remote its session ended and writing the status (0)",
    )
    parser.add_argument(
        "--tombstone-after",
        type=_tombstone_after,
        default=os.environ.get(TOMBSTONE_AFTER_ENV, f"{DEFAULT_TOMBSTONE_AFTER:g}"),
        help=f"seconds after a session's end at which its queue row is tombstoned, or {NEVER} "
        f"(env {TOMBSTONE_AFTER_ENV}, default {DEFAULT_TOMBSTONE_AFTER:g})",
    )
    parser.add_argument(
        "--gateway-url",
        default=None,
        help="gateway_url of claim responses (default ws://<host:port>/gateway)",
    )
    parser.add_argument(
        "--admin-token-file",
        default=None,
        help=f"admin token file: read if present, else created 0600 (default <db>.admin-token; "
        f"${ADMIN_TOKEN_ENV} takes precedence)",
    )
    parser.add_argument("--port-file", default=None, help="write the bound port here once listening")
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="(info)",
    )
    parser.add_argument("--no-access-log", action="store_true", help="do not log each request")
    parser.set_defaults(handler=_serve)


# --- admin verbs -------------------------------------------------------------------------------------


def _admin_token(args: argparse.Namespace) -> Optional[str]:
    path = args.admin_token_file or os.environ.get(TOKEN_FILE_ENV)
    if args.admin_token_file:
        return Path(args.admin_token_file).read_text().strip() or None
    from_env = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
    if from_env:
        return from_env
    if path:
        return Path(path).read_text().strip() or None
    return None


def _exit_code(error: SimAdminError) -> int:
    if error.status in (401, 403):
        return EXIT_AUTH
    if error.status == 404:
        return EXIT_NOT_FOUND
    if error.status == 409:
        return EXIT_CONFLICT
    if error.status in (400, 422):
        return EXIT_USAGE
    return EXIT_ERROR


def _with_admin(action: Callable[[SimAdmin, argparse.Namespace], int]) -> Handler:
    def handler(args: argparse.Namespace) -> int:
        try:
            token = _admin_token(args)
        except OSError as exc:
            return fail(f"Could not read the admin token file: {exc}", EXIT_USAGE)
        if not token:
            return fail(
                f"no admin token: set {ADMIN_TOKEN_ENV} or {TOKEN_FILE_ENV}, or pass --admin-token-file",
                EXIT_USAGE,
            )
        url = args.url or os.environ.get(URL_ENV) or DEFAULT_URL
        try:
            with SimAdmin(url, token) as admin:
                return action(admin, args)
        except SimAdminError as exc:
            return fail(str(exc), _exit_code(exc))

    return handler


def _token_create(admin: SimAdmin, args: argparse.Namespace) -> int:
    scopes = [] if args.scope == "none" else [args.scope]
    info = admin.create_token_info(scopes, account=args.account, label=args.label)
    if args.json:
        print_json(info)
    else:
        print(info["token"])
    return EXIT_OK


def _org_create(admin: SimAdmin, args: argparse.Namespace) -> int:
    org = admin.create_org_info(account=args.account, name=args.name)
    if args.json:
        print_json(org)
    else:
        print(org["org_id"])
    return EXIT_OK


def _org_list(admin: SimAdmin, args: argparse.Namespace) -> int:
    orgs = admin.orgs(account=args.account)
    if args.json:
        print_json(orgs)
    else:
        for org in orgs:
            marker = "\tdefault" if org["default"] else ""
            print(f"{org['org_id']}\t{org['account_id']}\t{org['name']}{marker}")
    return EXIT_OK


def _enqueue(admin: SimAdmin, args: argparse.Namespace) -> int:
    network_policy = None
    if args.network_policy is not None:
        try:
            network_policy = json.loads(args.network_policy)
        except ValueError as exc:
            return fail(f"--network-policy is not JSON: {exc}", EXIT_USAGE)
    entry = admin.enqueue(
        args.outpost,
        session_id=args.session_id,
        kind=args.kind,
        platform=args.platform,
        remote_binary_sha=args.remote_binary_sha,
        session_status=args.session_status,
        network_policy=network_policy,
    )
    if args.json:
        print_json(entry.to_wire())
    else:
        print(entry.session_id)
    return EXIT_OK


def _set_status(admin: SimAdmin, args: argparse.Namespace) -> int:
    entry = admin.set_status(args.session, args.status)
    if args.json:
        print_json(entry.to_wire())
    else:
        print(f"{entry.session_id} {entry.status.session_status}")
    return EXIT_OK


def _tombstone(admin: SimAdmin, args: argparse.Namespace) -> int:
    entry = admin.tombstone(args.session)
    if args.json:
        print_json(entry.to_wire())
    else:
        print(entry.session_id)
    return EXIT_OK


def _claims(admin: SimAdmin, args: argparse.Namespace) -> int:
    records = admin.claims(session_id=args.session, outpost_id=args.outpost, acceptor_id=args.acceptor_id)
    if args.json:
        print_json(records)
    else:
        for record in records:
            print(f"{record['at']:.3f}\t{record['session_id']}\t{record['action']}\t{record['acceptor_id']}")
    return EXIT_OK


def _admin_parser(
    verbs: Any, name: str, help_text: str, action: Callable[[SimAdmin, argparse.Namespace], int]
) -> Any:
    # No abbreviations: "--admin-token" must not silently mean "--admin-token-file".
    parser = verbs.add_parser(name, help=help_text, allow_abbrev=False)
    parser.add_argument("--url", default=None, help=f"simulator URL (env {URL_ENV}, default {DEFAULT_URL})")
    parser.add_argument(
        "--admin-token-file",
        default=None,
        help=f"file holding the admin token (else env {ADMIN_TOKEN_ENV} or {TOKEN_FILE_ENV})",
    )
    add_json_option(parser)
    parser.set_defaults(handler=_with_admin(action))
    return parser


def build_parser() -> argparse.ArgumentParser:
    from devin_outposts_sim import __version__

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="The local Devin Outposts fleet simulator: run it, and script it.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    verbs = parser.add_subparsers(dest="sim_command", metavar="VERB")
    verbs.required = True
    _add_serve(verbs)

    token = verbs.add_parser("token", help="issue API tokens").add_subparsers(
        dest="token_command", metavar="VERB"
    )
    token.required = True
    create = _admin_parser(token, "create", "issue an API token (prints it)", _token_create)
    create.add_argument("--scope", required=True, choices=["machine", "orchestrator", "none"])
    create.add_argument("--account", default=DEFAULT_ACCOUNT, help=f"account (default {DEFAULT_ACCOUNT})")
    create.add_argument("--label", default=None, help="a note stored with the token")

    org = verbs.add_parser("org", help="manage organizations").add_subparsers(
        dest="org_command", metavar="VERB"
    )
    org.required = True
    org_create = _admin_parser(org, "create", "create an organization (prints its id)", _org_create)
    org_create.add_argument("--account", default=DEFAULT_ACCOUNT, help=f"account (default {DEFAULT_ACCOUNT})")
    org_create.add_argument("--name", default=None, help="its name (default: Organization <n>)")
    org_list = _admin_parser(org, "list", "list organizations", _org_list)
    org_list.add_argument("--account", default=None, help="only this account")

    enqueue = _admin_parser(verbs, "enqueue", "queue a session on an outpost (prints its id)", _enqueue)
    enqueue.add_argument("--outpost", required=True, help="outpost id")
    enqueue.add_argument("--session-id", default=None, help="default devin-<hex>")
    enqueue.add_argument("--kind", default="new", help="new (default) or resume")
    enqueue.add_argument("--platform", default=None, help="default: the outpost's platform")
    enqueue.add_argument("--remote-binary-sha", default=None, help="pin a devin-remote build")
    enqueue.add_argument("--session-status", default=None, help="initial session_status (pending)")
    enqueue.add_argument("--network-policy", metavar="JSON", help="spec.network_policy, as JSON")

    status = _admin_parser(verbs, "set-status", "set a session's session_status", _set_status)
    status.add_argument("session", help="session id")
    status.add_argument("status", help="pending, running, suspended or terminated")

    tomb = _admin_parser(
        verbs, "tombstone", "remove a session from the queue (watchers see DELETED)", _tombstone
    )
    tomb.add_argument("session", help="session id")

    claims = _admin_parser(verbs, "claims", "print the claim history", _claims)
    claims.add_argument("--session", default=None, help="only this session")
    claims.add_argument("--outpost", default=None, help="only this outpost")
    claims.add_argument("--acceptor-id", default=None, help="only this acceptor")

    add_remote_verbs(verbs, _admin_parser)
    add_cli_dist_verbs(verbs, _admin_parser)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        return 130
