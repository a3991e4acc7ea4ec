"""Running the simulator under uvicorn: the server class, the admin token file and the port file.

:class:`SimServer` is a ``uvicorn.Server`` that reports the port it bound (so ``--port 0`` works) and ends
every open watch stream and gateway long poll when shutting down, so a stop never waits for them to
time out.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional

import uvicorn
from uvicorn.config import LOGGING_CONFIG

from devin_outposts_sim.http.app import create_app
from devin_outposts_sim.http.config import DEFAULT_HOST, DEFAULT_PORT, SimConfig
from devin_outposts_sim.http.runtime import SimRuntime
from devin_outposts_sim.state.store import Store

ADMIN_TOKEN_ENV = "DEVIN_SIM_ADMIN_TOKEN"  # noqa: S105 - a variable name


class SimServer(uvicorn.Server):
    """A uvicorn server that calls ``on_listening(port)`` once bound and closes watch streams on exit."""

    def __init__(
        self,
        config: uvicorn.Config,
        runtime: SimRuntime,
        on_listening: Optional[Callable[[int], None]] = None,
    ) -> None:
        super().__init__(config)
        self.runtime = runtime
        self.on_listening = on_listening
        self.port: Optional[int] = None

    async def startup(self, sockets: Optional[list[socket.socket]] = None) -> None:
        await super().startup(sockets)
        if not self.started or not self.servers:
            return
        self.port = int(self.servers[0].sockets[0].getsockname()[1])
        if self.on_listening is not None:
            self.on_listening(self.port)

    async def shutdown(self, sockets: Optional[list[socket.socket]] = None) -> None:
        self.runtime.close_notifiers()
        await super().shutdown(sockets)


def build_server(
    config: SimConfig,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    store: Optional[Store] = None,
    on_listening: Optional[Callable[[int], None]] = None,
    log_level: str = "warning",
    access_log: bool = False,
    configure_logging: bool = True,
) -> SimServer:
    """A server for ``config``; ``configure_logging=False`` leaves the process's logging alone."""
    app = create_app(config, store)
    uv_config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=access_log,
        lifespan="on",
        timeout_graceful_shutdown=5,
        timeout_keep_alive=5,
        log_config=LOGGING_CONFIG if configure_logging else None,
    )
    return SimServer(uv_config, app.state.sim, on_listening)


def write_private_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically with mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=f".{path.name}.")
    try:
        os.chmod(tmp, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def default_admin_token_file(db: str) -> Optional[Path]:
    """``<db>.admin-token`` next to a file database; None for ``:memory:``."""
    if db == ":memory:" or db.startswith("file:"):
        return None
    return Path(db + ".admin-token")


def resolve_admin_token(db: str, token_file: Optional[str]) -> tuple[str, Optional[Path]]:
    """The admin token and the file it lives in (None when it came from the environment).

    Order: ``$DEVIN_SIM_ADMIN_TOKEN``; the token in ``token_file`` (or the default file next to the
    database) if it exists; else a new token written to that file with mode 0600 (for ``:memory:``
    without a file, a new private temporary file).
    """
    from_env = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
    if from_env:
        return from_env, None
    path = Path(token_file) if token_file else default_admin_token_file(db)
    if path is not None and path.exists():
        existing = path.read_text().strip()
        if existing:
            return existing, path
    token = f"simadmin_{secrets.token_urlsafe(32)}"
    if path is None:
        fd, name = tempfile.mkstemp(prefix="devin-sim-admin-token-")
        os.close(fd)
        path = Path(name)
    write_private_file(path, token + "\n")
    return token, path


def serve(
    config: SimConfig,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    port_file: Optional[str] = None,
    admin_token_file: Optional[Path] = None,
    log_level: str = "info",
    access_log: bool = True,
) -> int:
    """Serve until SIGINT/SIGTERM. Writes the bound port to ``port_file`` once listening."""

    def listening(bound: int) -> None:
        if port_file:
            write_private_file(Path(port_file), f"{bound}\n")
        where = (
            f"admin token file {admin_token_file}"
            if admin_token_file
            else f"admin token from ${ADMIN_TOKEN_ENV}"
        )
        print(
            f"devin-outposts-sim: serving http://{host}:{bound} (db {config.db}; {where})",
            file=sys.stderr,
            flush=True,
        )

    server = build_server(
        config, host=host, port=port, on_listening=listening, log_level=log_level, access_log=access_log
    )
    server.run()
    return 0 if server.started else 1
