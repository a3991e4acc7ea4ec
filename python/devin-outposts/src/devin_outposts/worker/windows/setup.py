r"""Setting up the Windows service host: its arguments, the worker's config from ``worker.env``, its log.

The service host (:mod:`~devin_outposts.worker.windows.service`) is started as ``service_host.py --instance
NAME --env-file PATH [--debug] [-- worker start flags]``. This module turns that, and the variables of
``worker.env`` (read by :mod:`~devin_outposts.worker.windows.envfile`), into a
:class:`~devin_outposts.worker.options.WorkerConfig` the way ``worker start`` builds one from its
environment, and points the log at ``<instance dir>\logs\worker.log``. Nothing here needs Windows.
"""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Optional

from devin_outposts.core.config import ConfigError
from devin_outposts.core.logs import JsonFormatter, RedactingFilter, TextFormatter, register_secret
from devin_outposts.core.tokenfile import ENV_TOKEN
from devin_outposts.worker.options import WorkerConfig, add_start_arguments, build_config
from devin_outposts.worker.windows.envfile import EnvFileError, read_env_file

INSTANCE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: What the Linux unit passes as ``--outpost ${DEVIN_OUTPOSTS_WORKER_OUTPOST}``.
ENV_OUTPOST = "DEVIN_OUTPOSTS_WORKER_OUTPOST"
ENV_CACHE_DIR = "DEVIN_WORKER_CACHE_DIR"
ENV_WORKDIR = "DEVIN_WORKER_WORKDIR"
LOG_FILE = "worker.log"
LOG_MAX_BYTES = 10 << 20
LOG_BACKUPS = 5


class _Parser(argparse.ArgumentParser):
    """An argument parser that raises :class:`ConfigError` instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def worker_config(
    env: Mapping[str, str], instance_dir: Path, worker_args: Sequence[str] = ()
) -> WorkerConfig:
    r"""The worker's config from ``worker.env``'s variables, as ``worker start`` builds it from its env.

    ``--outpost`` comes from ``DEVIN_OUTPOSTS_WORKER_OUTPOST`` (the Linux unit's ``--outpost``); the state
    directory defaults to ``<instance dir>\state`` (the cache in ``state\cache``) and the working directory
    to ``<instance dir>\work``, because a service's current directory is ``C:\Windows\System32``.
    ``worker_args`` are more ``worker start`` flags (no secrets: ``--token`` is refused).
    """
    parser = _Parser(prog="devin-outposts worker service", add_help=False)
    add_start_arguments(parser)
    args = parser.parse_args(list(worker_args))
    if args.token is not None:
        raise ConfigError(f"--token is not accepted by the service host: put {ENV_TOKEN} in the env file")
    if args.outpost is None and env.get(ENV_OUTPOST, "").strip():
        args.outpost = env[ENV_OUTPOST].strip()
    effective = dict(env)
    if not effective.get(ENV_CACHE_DIR, "").strip():
        effective[ENV_CACHE_DIR] = str(instance_dir / "state" / "cache")
    if not effective.get(ENV_WORKDIR, "").strip():
        effective[ENV_WORKDIR] = str(instance_dir / "work")
    return build_config(args, effective)


def setup_service_logging(
    log_dir: Path, fmt: str = "text", level: str = "info", *, console: bool = False
) -> Path:
    r"""The worker's log to ``<log_dir>\worker.log`` (10 MiB, 5 old files kept), redacted like stderr's."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / LOG_FILE
    handlers: list[logging.Handler] = [
        logging.handlers.RotatingFileHandler(
            path, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS, encoding="utf-8"
        )
    ]
    if console:
        handlers.append(logging.StreamHandler(sys.stderr))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    for handler in handlers:
        handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
        handler.addFilter(RedactingFilter())
        root.addHandler(handler)
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return path


@dataclass
class HostArgs:
    instance: str
    env_file: Path
    debug: bool
    worker_args: list[str]


def parse_host_args(argv: Sequence[str]) -> HostArgs:
    """``--instance NAME --env-file PATH [--debug] [-- worker start flags]``."""
    argv = list(argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = _Parser(prog="devin-outposts worker service", add_help=False)
    parser.add_argument("--instance", required=True)
    parser.add_argument("--env-file", required=True)
    parser.add_argument(
        "--debug", action="store_true", help="run in this console; Ctrl-C or Ctrl-Break drains"
    )
    args = parser.parse_args(argv)
    if not INSTANCE_RE.fullmatch(args.instance):
        raise ConfigError(
            f"--instance {args.instance!r}: use 1-64 letters, digits and . _ -, starting with a letter or "
            "digit"
        )
    return HostArgs(args.instance, Path(args.env_file), args.debug, extra)


@dataclass
class Prepared:
    config: Optional[WorkerConfig]
    startup_error: Optional[str]
    log_path: Path


def prepare(host: HostArgs, environ: Optional[Any] = None) -> Prepared:
    """Read ``worker.env``, build the config, start logging. A bad file or value is kept as the startup
    error, which the service reports as a clean stop with exit code 2 (it would fail again on restart)."""
    instance_dir = host.env_file.parent
    config: Optional[WorkerConfig] = None
    error: Optional[str] = None
    try:
        file_env = read_env_file(host.env_file)
        config = worker_config(file_env, instance_dir, host.worker_args)
    except (EnvFileError, ConfigError) as exc:
        error = str(exc)
    else:
        register_secret(config.token)
        register_secret(config.direct_token)
        # httpx reads the proxy and CA variables from the process environment, as on Linux where systemd
        # puts the env file there; sessions never see them (platform.windows_session_env).
        (os.environ if environ is None else environ).update(file_env)
    fmt, level = (config.log_format, config.log_level) if config is not None else ("text", "info")
    try:
        log_path = setup_service_logging(instance_dir / "logs", fmt, level, console=host.debug)
    except OSError as exc:
        # Without its log the service would still have to tell the SCM (and the event log) why it stops,
        # rather than die before it connects (error 1053, no reason anywhere).
        log_path = instance_dir / "logs" / LOG_FILE
        error = error or f"Could not open the log {log_path}: {exc.strerror or exc}"
        config = None
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    return Prepared(config, error, log_path)
