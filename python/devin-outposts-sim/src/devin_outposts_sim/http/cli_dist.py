"""The routes of the simulated Devin CLI distribution (:mod:`devin_outposts_sim.state.cli_dist`).

Public (no auth, like a CDN): ``GET /cli/<version>/devin-<platform>`` (``devin-windows-x64.exe``) and its
``.sha256``; anything else under ``/cli/`` is ``404 {"detail": ...}``.

Admin (``Authorization: Bearer <admin token>``):

* ``GET /_sim/cli``: ``{"prefix", "platforms", "artifacts": [...]}`` (no bytes).
* ``POST /_sim/cli/artifacts`` ``{"version", "platforms"?, "content_b64"?, "published_sha256"?,
  "tampered"?}``: publish (default content: the stand-in ``devin`` of that version; ``tampered``
  serves a ``.sha256`` that does not match); ``201 {"version", "artifacts"}``.
"""

from __future__ import annotations

import base64
import binascii

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from devin_outposts_sim.errors import Invalid, NotFound
from devin_outposts_sim.http.admin import PREFIX as ADMIN_PREFIX
from devin_outposts_sim.http.admin import admin
from devin_outposts_sim.http.runtime import body_of, runtime_of
from devin_outposts_sim.state.cli_dist import PREFIX, check_platforms, check_version, parse_name, sha256_hex


async def cli_file(request: Request) -> Response:
    sim = runtime_of(request)
    version, name = request.path_params["version"], request.path_params["name"]
    parsed = parse_name(name)
    if parsed is None:
        raise NotFound(f"No such file: {version}/{name}")
    platform, is_sha256 = parsed
    artifact = await run_in_threadpool(sim.store.cli_dist.cli_artifact, version, platform)
    if artifact is None:
        raise NotFound(f"No such file: {version}/{name}")
    if is_sha256:
        return PlainTextResponse(artifact.published_sha256 + "\n")
    return Response(artifact.content, media_type="application/octet-stream")


async def cli_state(request: Request) -> Response:
    sim = admin(request)
    return JSONResponse(await run_in_threadpool(sim.store.cli_dist.cli_state))


async def publish_cli(request: Request) -> Response:
    sim = admin(request)
    body = await body_of(request)
    version = check_version(body.get("version"))
    content = None
    raw = body.get("content_b64")
    if raw is not None:
        if not isinstance(raw, str):
            raise Invalid("content_b64 must be the artifact's bytes in base64")
        try:
            content = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise Invalid("content_b64 is not valid base64") from None
    digest = body.get("published_sha256")
    if digest is not None and not isinstance(digest, str):
        raise Invalid("published_sha256 must be a string")
    tampered = body.get("tampered", False)
    if not isinstance(tampered, bool):
        raise Invalid("tampered must be true or false")
    if tampered and digest is not None:
        raise Invalid("give at most one of tampered and published_sha256")
    platforms = check_platforms(body.get("platforms"), has_content=content is not None)

    def publish() -> list[dict[str, object]]:
        # A tampered artifact's .sha256 is the digest of other bytes: it can never match.
        published = sha256_hex(b"tampered:" + version.encode()) if tampered else digest
        artifacts = sim.store.cli_dist.publish_cli(
            version, content=content, platforms=platforms, published_sha256=published
        )
        return [artifact.describe() for artifact in artifacts]

    artifacts = await run_in_threadpool(publish)
    return JSONResponse({"version": version, "artifacts": artifacts}, status_code=201)


def cli_dist_routes() -> list[BaseRoute]:
    return [
        Route(f"{PREFIX}/{{version}}/{{name}}", cli_file, methods=["GET"]),
        Route(f"{ADMIN_PREFIX}/cli", cli_state, methods=["GET"]),
        Route(f"{ADMIN_PREFIX}/cli/artifacts", publish_cli, methods=["POST"]),
    ]
