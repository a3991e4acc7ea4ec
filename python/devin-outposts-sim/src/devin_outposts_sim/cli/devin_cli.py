"""The ``devin-outposts-sim devin-cli`` verbs (registered by :mod:`devin_outposts_sim.cli`): the simulated
distribution of the official Devin CLI (:mod:`devin_outposts_sim.state.cli_dist`).

* ``sim devin-cli show``: the base URL and every artifact (path, size, sha256, tampered).
* ``sim devin-cli publish VERSION [--file FILE] [--platform P]... [--tampered]``: publish the stand-in
  ``devin`` of VERSION (or FILE's bytes); prints each artifact's path and SHA-256.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

from devin_outposts_sim.admin_client import SimAdmin
from devin_outposts_sim.cli.common import EXIT_OK, print_json
from devin_outposts_sim.state.cli_dist import ALL_PLATFORMS

Action = Callable[[SimAdmin, argparse.Namespace], int]
AdminParser = Callable[[Any, str, str, Action], Any]


def _show(admin: SimAdmin, args: argparse.Namespace) -> int:
    state = admin.cli_dist()
    if args.json:
        print_json({**state, "base_url": admin.cli_base_url})
        return EXIT_OK
    print(f"base URL: {admin.cli_base_url}")
    for item in state["artifacts"]:
        mark = "\ttampered" if item["tampered"] else ""
        print(f"{item['path']}\t{item['size']}\t{item['sha256']}{mark}")
    return EXIT_OK


def _publish(admin: SimAdmin, args: argparse.Namespace) -> int:
    content = Path(args.file).read_bytes() if args.file else None
    artifacts = admin.publish_cli(
        args.version, content=content, platforms=args.platform, tampered=args.tampered
    )
    if args.json:
        print_json(artifacts)
    else:
        for item in artifacts:
            print(f"{item['path']}\t{item['sha256']}")
    return EXIT_OK


def add_cli_dist_verbs(verbs: Any, admin_parser: AdminParser) -> None:
    group = verbs.add_parser("devin-cli", help="the official Devin CLI distribution").add_subparsers(
        dest="devin_cli_command", metavar="VERB"
    )
    group.required = True
    admin_parser(group, "show", "print the base URL and the published CLI artifacts", _show)
    publish = admin_parser(
        group, "publish", "publish a devin CLI version (the stand-in by default)", _publish
    )
    publish.add_argument("version", help="e.g. 1.2.3")
    publish.add_argument("--file", default=None, help="the artifact's content (default: the stand-in devin)")
    publish.add_argument(
        "--platform", action="append", choices=ALL_PLATFORMS,
        help="repeatable; default every POSIX one (windows-x64 needs --file)",
    )  # fmt: skip
    publish.add_argument("--tampered", action="store_true", help="serve a .sha256 that does not match")
