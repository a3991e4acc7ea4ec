"""``devin-outposts outpost create|delete|list``: mirrors ``devin worker outpost create|delete``.

``create`` prints the new outpost's id (``outpost_env-...``) and ``delete`` prints the deleted id, so the
output can be captured by scripts exactly like the official CLI's; ``--json`` prints the API object.
"""

from __future__ import annotations

import argparse

from devin_outposts.api.client import FleetClient
from devin_outposts.api.models import KNOWN_PLATFORMS, Outpost
from devin_outposts.cli.common import (
    add_api_options,
    add_json_option,
    guarded,
    print_json,
    run_with_client,
)
from devin_outposts.core.exits import ExitCode


@guarded
def _create(args: argparse.Namespace) -> int:
    async def action(client: FleetClient) -> Outpost:
        return await client.create_outpost(args.name, platform=args.platform, description=args.description)

    outpost = run_with_client(args, action)
    if args.json:
        print_json(outpost.to_wire())
    else:
        print(outpost.outpost_id)
    return ExitCode.OK


@guarded
def _delete(args: argparse.Namespace) -> int:
    async def action(client: FleetClient) -> bool:
        return await client.delete_outpost(args.outpost_id, missing_ok=args.missing_ok)

    deleted = run_with_client(args, action)
    if args.json:
        print_json({"outpost_id": args.outpost_id, "deleted": deleted})
    else:
        print(args.outpost_id if deleted else f"{args.outpost_id} (already absent)")
    return ExitCode.OK


@guarded
def _list(args: argparse.Namespace) -> int:
    async def action(client: FleetClient) -> list[Outpost]:
        return await client.list_all_outposts()

    outposts = run_with_client(args, action)
    if args.json:
        print_json([outpost.to_wire() for outpost in outposts])
        return ExitCode.OK
    rows = [("ID", "NAME", "PLATFORM", "QUEUED", "CLAIMED")]
    for outpost in outposts:
        platform = outpost.spec.platform.value if outpost.spec.platform else "default"
        rows.append(
            (
                outpost.outpost_id,
                outpost.name,
                platform,
                str(outpost.status.queue_depth),
                str(outpost.status.active_claims),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return ExitCode.OK


def add_outpost_commands(parser: argparse.ArgumentParser) -> None:
    """Add create/delete/list under ``parser`` (used by ``outpost`` and ``worker outpost``)."""
    verbs = parser.add_subparsers(dest="outpost_command", metavar="VERB")
    verbs.required = True

    create = verbs.add_parser("create", help="register a new outpost and print its id")
    create.add_argument("name", help="outpost name, unique in the account")
    create.add_argument("--platform", choices=KNOWN_PLATFORMS, default=None, help="outpost OS platform")
    create.add_argument("--description", default=None, help="text shown in the Devin web app")
    add_api_options(create)
    add_json_option(create)
    create.set_defaults(handler=_create)

    delete = verbs.add_parser("delete", help="delete an outpost by id")
    delete.add_argument("outpost_id", help="outpost id (outpost_env-...)")
    delete.add_argument("--missing-ok", action="store_true", help="succeed when the outpost does not exist")
    add_api_options(delete)
    add_json_option(delete)
    delete.set_defaults(handler=_delete)

    listing = verbs.add_parser("list", help="list the account's outposts")
    add_api_options(listing)
    add_json_option(listing)
    listing.set_defaults(handler=_list)


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("outpost", help="create, delete and list outposts")
    add_outpost_commands(parser)
