"""Run the fleet simulator in-process (:func:`run_sim`) or as a subprocess (:func:`sim_process`) for
tests; :mod:`devin_outposts_sim.testing` re-exports everything here and describes both."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

from devin_outposts_sim.admin_client import SimAdmin
from devin_outposts_sim.http.config import SimConfig
from devin_outposts_sim.http.runtime import SimRuntime
from devin_outposts_sim.http.server import ADMIN_TOKEN_ENV, build_server
from devin_outposts_sim.state.accounts import DEFAULT_ACCOUNT
from devin_outposts_sim.state.db import DEFAULT_TOMBSTONE_AFTER
from devin_outposts_sim.state.store import Store

#: How ``--tombstone-after`` spells "ended sessions stay" (as the CLI parses it).
NEVER = "never"

START_TIMEOUT = 20.0


def wait_until(
    predicate: Callable[[], Any], *, timeout: float, interval: float = 0.05, what: str = "a condition"
) -> Any:
    """Poll ``predicate`` until it returns something truthy, and return that.

    Raises :class:`TimeoutError` after ``timeout`` seconds; tests and benchmarks turn it into their own
    failure (an assertion, ``pytest.fail``, a benchmark error).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def _new_admin_token() -> str:
    return f"simadmin_{secrets.token_urlsafe(24)}"


@dataclass
class SimHandle:
    """A running in-process simulator."""

    url: str
    admin: SimAdmin
    admin_token: str
    config: SimConfig
    store: Store
    port: int
    #: The app's shared state: ``runtime.notifier.open_streams`` counts open watch streams.
    runtime: SimRuntime

    @property
    def static_base_url(self) -> str:
        """``--static-base-url`` for a worker: ``{url}/devin-rs/remote/``."""
        return f"{self.url}/devin-rs/remote/"

    def create_token(
        self, scope: Union[str, list[str]] = "machine", *, account: str = DEFAULT_ACCOUNT
    ) -> str:
        """A fresh API token (``machine``, ``orchestrator`` or a list of scopes) of ``account``."""
        return self.admin.create_token(scope, account=account)


@contextmanager
def run_sim(
    *,
    db: str = ":memory:",
    claim_ttl: float = 300.0,
    watch_max_duration: float = 300.0,
    keepalive_interval: float = 15.0,
    sweep_interval: float = 1.0,
    gateway_url: Optional[str] = None,
    status_lag: float = 0.0,
    tombstone_after: Optional[float] = DEFAULT_TOMBSTONE_AFTER,
    host: str = "127.0.0.1",
    port: int = 0,
) -> Iterator[SimHandle]:
    """Serve the simulator on a free port in a background thread for the duration of the block."""
    config = SimConfig(
        db=db,
        claim_ttl=claim_ttl,
        watch_max_duration=watch_max_duration,
        keepalive_interval=keepalive_interval,
        sweep_interval=sweep_interval,
        gateway_url=gateway_url,
        status_lag=status_lag,
        tombstone_after=tombstone_after,
        admin_token=_new_admin_token(),
    )
    config.validate()
    store = Store(db, tombstone_after=config.tombstone_after)
    server = build_server(config, host=host, port=port, store=store, configure_logging=False)
    thread = threading.Thread(target=server.run, name="devin-outposts-sim", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT
    while server.port is None:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            store.close()
            raise RuntimeError("the in-process simulator did not start")
        time.sleep(0.01)
    url = f"http://{host}:{server.port}"
    admin = SimAdmin(url, config.admin_token)
    try:
        yield SimHandle(url, admin, config.admin_token, config, store, server.port, server.runtime)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        admin.close()
        store.close()


class SimProcess:
    """``python -m devin_outposts_sim serve`` on one database file, with start/stop/kill/restart."""

    def __init__(
        self,
        db: Union[str, Path],
        *,
        claim_ttl: float = 300.0,
        watch_max_duration: float = 300.0,
        keepalive_interval: float = 15.0,
        sweep_interval: float = 1.0,
        gateway_url: Optional[str] = None,
        status_lag: float = 0.0,
        tombstone_after: Optional[float] = DEFAULT_TOMBSTONE_AFTER,
        host: str = "127.0.0.1",
        port: int = 0,
        admin_token: Optional[str] = None,
        workdir: Optional[Union[str, Path]] = None,
        env: Optional[dict[str, str]] = None,
    ) -> None:
        self.db = str(db)
        self.options: dict[str, Any] = {
            "claim-ttl": claim_ttl,
            "watch-max-duration": watch_max_duration,
            "keepalive-interval": keepalive_interval,
            "sweep-interval": sweep_interval,
            "gateway-url": gateway_url,
            # Passed only when set, so that a SimProcess can also start an older simulator that lacks
            # the flag (benchmarks/sim_ceiling.py --baseline runs one from another revision's source).
            "status-lag": status_lag or None,
            "tombstone-after": (
                None
                if tombstone_after == DEFAULT_TOMBSTONE_AFTER
                else NEVER if tombstone_after is None else tombstone_after
            ),
        }
        #: Extra environment of the server process (e.g. ``PYTHONPATH`` naming another source tree).
        self.env = dict(env or {})
        self.host = host
        self.port = port
        self.admin_token = admin_token or _new_admin_token()
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="devin-sim-"))
        self.log_path = self.workdir / "sim.log"
        self._port_file = self.workdir / "sim.port"
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._admin: Optional[SimAdmin] = None

    @property
    def url(self) -> str:
        if not self.port:
            raise RuntimeError("the simulator has not been started")
        return f"http://{self.host}:{self.port}"

    @property
    def static_base_url(self) -> str:
        return f"{self.url}/devin-rs/remote/"

    @property
    def admin(self) -> SimAdmin:
        if self._admin is None or self._admin.url != self.url:
            if self._admin is not None:
                self._admin.close()
            self._admin = SimAdmin(self.url, self.admin_token)
        return self._admin

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    def create_token(
        self, scope: Union[str, list[str]] = "machine", *, account: str = DEFAULT_ACCOUNT
    ) -> str:
        return self.admin.create_token(scope, account=account)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start the server (on the previous port after a stop) and wait until it answers."""
        if self.running:
            raise RuntimeError("the simulator is already running")
        self._port_file.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "devin_outposts_sim", "serve", "--db", self.db]
        argv += ["--host", self.host, "--port", str(self.port), "--port-file", str(self._port_file)]
        argv += ["--log-level", "warning"]
        for flag, value in self.options.items():
            if value is not None:
                argv += [f"--{flag}", str(value)]
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        env[ADMIN_TOKEN_ENV] = self.admin_token
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)  # noqa: S603
        deadline = time.monotonic() + timeout
        while True:
            text = self._port_file.read_text().strip() if self._port_file.exists() else ""
            if text:
                self.port = int(text)
                break
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"the simulator did not start; log:\n{self.log_tail()}")
            time.sleep(0.02)
        self.admin.wait_ready(timeout=max(1.0, deadline - time.monotonic()))

    def stop(self, timeout: float = 15.0) -> Optional[int]:
        """SIGTERM (graceful shutdown) and wait; SIGKILL after ``timeout``. Returns the exit code."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._proc.terminate()  # SIGTERM on POSIX
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=timeout)
        return self._proc.returncode

    def kill(self) -> Optional[int]:
        """SIGKILL: the process gets no chance to clean up (committed state must survive)."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=15)
        return self._proc.returncode

    def restart(self, *, kill: bool = False, timeout: float = START_TIMEOUT) -> None:
        """Stop (or kill) and start again on the same database and port."""
        if kill:
            self.kill()
        else:
            self.stop()
        self.start(timeout=timeout)

    def close(self) -> None:
        self.stop()
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def __enter__(self) -> SimProcess:
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@contextmanager
def sim_process(db: Union[str, Path], **options: Any) -> Iterator[SimProcess]:
    """Start a :class:`SimProcess` on ``db`` for the duration of the block (``options`` as its init)."""
    proc = SimProcess(db, **options)
    proc.start()
    try:
        yield proc
    finally:
        proc.close()
