r"""The Windows service host: one worker instance as a native Windows service (docs/windows-worker.md).

The role installs a service ``devin-outposts-worker-<instance>`` whose ImagePath is the venv's *base*
``python.exe`` running ``<instance dir>\service_host.py``, a few lines that put the venv's site-packages
and ``pywin32_system32`` on the paths and call :func:`main` with ``--instance`` and ``--env-file``. The
token is in ``worker.env`` (ACL'd to the service account and Administrators), never in the ImagePath.

:func:`main` reads ``worker.env`` with the strict parser (:mod:`~devin_outposts.worker.windows.envfile`),
builds the :class:`~devin_outposts.worker.options.WorkerConfig` from it the way ``worker start`` builds it
from its environment (:mod:`~devin_outposts.worker.windows.setup`), and hands the SCM a
``win32serviceutil.ServiceFramework`` subclass (made by :func:`service_class`, so that tests can build it
on a fake framework) whose ``SvcRun`` runs the worker:

* ``SERVICE_CONTROL_STOP`` and ``SERVICE_CONTROL_PRESHUTDOWN`` are the first SIGTERM on Linux: no new
  claims, running sessions get ``--drain-timeout``, then their remotes are stopped and their claims
  released. The host reports ``SERVICE_STOP_PENDING`` every :data:`STOP_TICK` seconds with a growing
  checkpoint and a wait hint until the worker is done, and makes it stop at once (the second SIGTERM)
  when it has not finished ``drain + stop grace + 15 s`` after the stop;
* ``SERVICE_CONTROL_SHUTDOWN`` (the machine goes down, and the preshutdown phase is over) is the second
  SIGTERM straight away: stop the remotes and release the claims while there is time;
* :data:`SERVICE_CONTROL_STOP_NOW` (128, a user-defined control: ``sc control <service> 128``) is both
  SIGTERMs at once: stop without draining. It only works *instead of* a STOP: once the service reports
  ``SERVICE_STOP_PENDING`` the SCM refuses every control with ``ERROR_SERVICE_CANNOT_ACCEPT_CTRL`` (1061;
  Microsoft's ``ControlService`` documentation, and Wine 8's SCM, tried), so there is no "second STOP" on
  Windows;
* ``SERVICE_CONTROL_INTERROGATE`` reports the state as it is (pywin32's default says RUNNING always).

How the worker's exit code becomes the service's final status is :func:`service_exit_for`. Everything in
this module runs on Linux in tests, against fakes of pywin32 and the SCM, and as a real service under Wine in
the windows stage; none of it has run on a real Windows host.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from devin_outposts.core.config import ConfigError
from devin_outposts.core.exits import ExitCode, ProgramExit
from devin_outposts.worker.options import WorkerConfig
from devin_outposts.worker.windows.setup import HostArgs, Prepared, parse_host_args, prepare

log = logging.getLogger("devin_outposts.worker.service")

SERVICE_PREFIX = "devin-outposts-worker-"

# The values of winsvc.h and winerror.h, so that this module imports, and its logic is tested, without
# pywin32 (the same numbers as win32service's constants).
SERVICE_STOPPED = 1
SERVICE_START_PENDING = 2
SERVICE_STOP_PENDING = 3
SERVICE_RUNNING = 4
SERVICE_CONTROL_STOP = 0x1
SERVICE_CONTROL_INTERROGATE = 0x4
SERVICE_CONTROL_SHUTDOWN = 0x5
SERVICE_CONTROL_PRESHUTDOWN = 0xF
#: A user-defined control (128 to 255): stop now, without the drain. See the module docstring.
SERVICE_CONTROL_STOP_NOW = 128
SERVICE_ACCEPT_STOP = 0x1
SERVICE_ACCEPT_SHUTDOWN = 0x4
SERVICE_ACCEPT_PRESHUTDOWN = 0x100
NO_ERROR = 0
ERROR_CALL_NOT_IMPLEMENTED = 120
#: What the SCM answers any control sent to a service that reports START_PENDING or STOP_PENDING.
ERROR_SERVICE_CANNOT_ACCEPT_CTRL = 1061
ERROR_SERVICE_SPECIFIC_ERROR = 1066

#: Seconds between two STOP_PENDING reports while the worker drains, and the wait hint each one gives
#: (the SCM expects the next report, with a higher checkpoint, within the hint).
STOP_TICK = 2.0
STOP_WAIT_HINT_MS = 10_000
#: Like the Linux unit's ``TimeoutStopSec = drain + stop grace + 15``: then the host stops the sessions.
STOP_MARGIN = 15.0

# --- the final status ---------------------------------------------------------------------------------

#: The Linux unit's ``RestartPreventExitStatus=2 3 4 6 9``: a restart cannot help, a person must act.
NO_RESTART: dict[int, str] = {
    ExitCode.USAGE: "the configuration is unusable (usage)",
    ExitCode.AUTH: "the API token was refused",
    ExitCode.NOT_FOUND: "the outpost was not found",
    ExitCode.PLATFORM: "the outpost's platform is not this machine's",
    ExitCode.NETWORK_POLICY: "the session's network policy cannot be enforced on this machine",
}
_MEANING: dict[int, str] = {
    ExitCode.ERROR: "unexpected error",
    ExitCode.CONFLICT: "the session is claimed by another worker",
    ExitCode.SESSION_FAILED: "the session failed",
    ExitCode.LOCKED: "another worker holds the data or working directory",
}


@dataclass(frozen=True)
class ServiceExit:
    """The status the service ends with, for one exit code of the worker."""

    code: int
    win32_exit_code: int  # SERVICE_STATUS.dwWin32ExitCode
    service_exit_code: int  # SERVICE_STATUS.dwServiceSpecificExitCode
    #: A failure: the SCM's recovery actions apply (with "failure actions on non-crash failures", which
    #: the role turns on). False is a clean stop, which they leave alone.
    failed: bool
    reason: str


def service_exit_for(code: int, *, stop_requested: bool) -> ServiceExit:
    """How the worker's exit ``code`` ends the service (docs/windows-worker.md, "Exit codes").

    * 0, and a stop the SCM asked for that interrupted a session (128+N): a clean stop;
    * 2, 3, 4, 6 and 9 (the Linux unit's ``RestartPreventExitStatus``): a clean stop too, so that recovery
      does not restart a worker that cannot work, with the reason in the event log and the log file;
    * anything else: ``ERROR_SERVICE_SPECIFIC_ERROR`` with the code, so that recovery restarts it.
    """
    if code == ExitCode.OK:
        return ServiceExit(code, NO_ERROR, 0, False, "the worker stopped")
    if code in NO_RESTART:
        return ServiceExit(
            code,
            NO_ERROR,
            0,
            False,
            f"the worker exited with code {code}: {NO_RESTART[code]}; not restarting it (fix the cause, then "
            "start the service)",
        )
    if stop_requested and code > 128:
        return ServiceExit(
            code, NO_ERROR, 0, False, f"the worker stopped its session on request (code {code})"
        )
    meaning = _MEANING.get(code, f"signal {code - 128}" if code > 128 else "unexpected error")
    return ServiceExit(
        code,
        ERROR_SERVICE_SPECIFIC_ERROR,
        max(code, 1),
        True,
        f"the worker exited with code {code} ({meaning}); the service's recovery actions apply",
    )


# --- the worker inside the service ---------------------------------------------------------------------


class StatusSink(Protocol):
    """Reports a service status to the SCM (``SetServiceStatus``)."""

    def __call__(
        self, state: int, *, wait_hint_ms: int = 0, win32_exit_code: int = 0, service_exit_code: int = 0
    ) -> None:
        """Report ``state`` (a ``SERVICE_*`` state) with its wait hint and exit codes."""


def _default_worker(config: WorkerConfig) -> Any:
    from devin_outposts.worker.runner import Worker  # the worker's modules only once the service runs

    worker = Worker(config)
    # A second STOP never reaches a stopping service (the SCM answers 1061): say what happens instead.
    worker.stop_now_hint = (
        "no control reaches a stopping service; the host stops them itself "
        f"{STOP_MARGIN:.0f}s after drain and stop grace"
    )
    return worker


class WorkerService:
    """Runs one worker and turns service controls into its drain. Knows nothing of pywin32.

    :meth:`run` is called on the service's thread (pywin32's ``SvcRun``), :meth:`control` on the SCM's
    dispatcher thread; the stop reaches the worker's event loop through ``call_soon_threadsafe``.
    """

    def __init__(
        self,
        config: Optional[WorkerConfig],
        report: StatusSink,
        *,
        startup_error: Optional[str] = None,
        worker_factory: Callable[[WorkerConfig], Any] = _default_worker,
        tick: float = STOP_TICK,
    ) -> None:
        if config is None and startup_error is None:
            raise ValueError("WorkerService needs a config or a startup error")
        self.config = config
        self.report = report
        self.startup_error = startup_error
        self.tick = tick
        self._factory = worker_factory
        self._lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._worker: Any = None
        self._pending: list[bool] = []  # stops that came before the loop ran (True: stop now)
        self._heartbeat: Optional[asyncio.Task[None]] = None
        self._stop_started = 0.0
        self._stopped_now = False  # the worker had its second SIGTERM
        self._done = False
        self.stop_requested = False
        #: Why the worker ended, when it failed: for the event log.
        self.last_error: Optional[str] = None

    # --- the service thread ------------------------------------------------------------------------

    def run(self) -> int:
        """Run the worker until it ends; its exit code."""
        try:
            if self.startup_error is not None or self.config is None:
                self.last_error = f"cannot start the worker: {self.startup_error}"
                log.error("%s", self.last_error)
                return ExitCode.USAGE
            try:
                return asyncio.run(self._main(self.config))
            except ProgramExit as exc:  # one line, never a token (the worker's rule for these)
                self.last_error = str(exc)
                log.error("%s", exc)
                return exc.code
            except Exception as exc:
                self.last_error = f"the worker failed: {type(exc).__name__}"
                log.exception("the worker failed")
                return ExitCode.ERROR
        finally:
            with self._lock:
                self._done = True

    async def _main(self, config: WorkerConfig) -> int:
        worker = self._factory(config)
        with self._lock:
            self._loop, self._worker = asyncio.get_running_loop(), worker
            pending, self._pending = self._pending, []
        for now in pending:
            self._deliver(now)
        try:
            code: int = await worker.run()
            return code
        finally:
            with self._lock:
                self._loop = None
            if self._heartbeat is not None:
                self._heartbeat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._heartbeat

    # --- the SCM's thread ----------------------------------------------------------------------------

    def control(self, control: int) -> int:
        """Handle one service control; the value the control handler returns to the SCM."""
        if control in (SERVICE_CONTROL_STOP, SERVICE_CONTROL_PRESHUTDOWN):
            name = "STOP" if control == SERVICE_CONTROL_STOP else "PRESHUTDOWN"
            self.request_stop(now=False, why=f"service control {name}")
        elif control == SERVICE_CONTROL_SHUTDOWN:
            self.request_stop(now=True, why="service control SHUTDOWN")
        elif control == SERVICE_CONTROL_STOP_NOW:
            self.request_stop(now=True, why=f"service control {SERVICE_CONTROL_STOP_NOW} (stop now)")
        elif control == SERVICE_CONTROL_INTERROGATE:
            self.report_state()
        else:
            return ERROR_CALL_NOT_IMPLEMENTED
        return NO_ERROR

    def request_stop(self, *, now: bool, why: str) -> None:
        """Drain (the first SIGTERM on Linux), or with ``now`` stop at once (both SIGTERMs). A drain asked
        for again changes nothing: the SCM sends no control while the service is STOP_PENDING, and the
        host's own budget (:meth:`_beat`) ends a drain that runs too long."""
        with self._lock:
            if self._done:
                return
            if not self.stop_requested:
                self.stop_requested = True
                self._stop_started = time.monotonic()
            loop = self._loop
            if loop is None:
                self._pending.append(now)
        log.info("%s: %s", why, "stopping the sessions now" if now else "draining, as on SIGTERM")
        self.report(SERVICE_STOP_PENDING, wait_hint_ms=STOP_WAIT_HINT_MS)
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: the worker is done
                loop.call_soon_threadsafe(self._deliver, now)

    def report_state(self) -> None:
        with self._lock:
            stopping = self.stop_requested or self._done
        if stopping:
            self.report(SERVICE_STOP_PENDING, wait_hint_ms=STOP_WAIT_HINT_MS)
        else:
            self.report(SERVICE_RUNNING)

    # --- the worker's loop -----------------------------------------------------------------------------

    def _deliver(self, now: bool) -> None:
        worker = self._worker
        if not worker.draining:
            worker.on_signal(signal.SIGTERM)  # drain
        if now and not self._stopped_now:
            self._stopped_now = True
            worker.on_signal(signal.SIGTERM)  # the second SIGTERM: stop the sessions now
        if self._heartbeat is None:
            self._heartbeat = asyncio.get_running_loop().create_task(self._beat())

    async def _beat(self) -> None:
        """STOP_PENDING with a growing checkpoint until the worker is done; past the budget, stop now."""
        config = self.config
        assert config is not None
        budget = config.drain_timeout + config.stop_grace + STOP_MARGIN
        escalated = False
        while True:
            await asyncio.sleep(self.tick)
            self.report(SERVICE_STOP_PENDING, wait_hint_ms=STOP_WAIT_HINT_MS)
            if not escalated and time.monotonic() - self._stop_started > budget:
                escalated = True
                log.warning("still not stopped %.0fs after the stop: stopping the sessions now", budget)
                self._deliver(now=True)


# --- pywin32 --------------------------------------------------------------------------------------------


class EventLog(Protocol):
    """The Windows event log, as far as the service host writes to it."""

    def info(self, message: str) -> None:
        """Write an information entry."""

    def error(self, message: str) -> None:
        """Write an error entry."""


class ServicemanagerEventLog:
    """The Application event log, through pywin32's ``servicemanager`` (source: the service's name)."""

    def __init__(self, servicemanager: Any) -> None:
        self._sm = servicemanager

    def info(self, message: str) -> None:
        with contextlib.suppress(Exception):
            self._sm.LogInfoMsg(message)

    def error(self, message: str) -> None:
        with contextlib.suppress(Exception):
            self._sm.LogErrorMsg(message)


def finish(
    outcome: ServiceExit,
    report: StatusSink,
    events: EventLog,
    exit_process: Callable[[int], Any],
    detail: Optional[str] = None,
) -> None:
    """End the service with ``outcome``: log it, and for a failure report it and end the process.

    pywin32 reports ``SERVICE_STOPPED`` with exit code 0 when ``SvcRun`` returns, which the SCM's recovery
    leaves alone: right for a clean stop. A failure is reported here (``ERROR_SERVICE_SPECIFIC_ERROR`` and
    the worker's code), and the process ends at once, so that pywin32 cannot overwrite it: after
    ``SERVICE_STOPPED`` the SCM allows the process to end at any time. ``detail`` (the worker's one-line
    error) goes to the event log with the reason; the log file has it already.
    """
    message = f"{outcome.reason}: {detail}" if detail else outcome.reason
    if outcome.failed:
        log.error("%s", outcome.reason)
        events.error(message)
        report(
            SERVICE_STOPPED,
            win32_exit_code=outcome.win32_exit_code,
            service_exit_code=outcome.service_exit_code,
        )
        logging.shutdown()
        exit_process(outcome.code)
        return
    if outcome.code == ExitCode.OK:
        log.info("%s", outcome.reason)
        events.info(outcome.reason)
    else:
        log.error("%s", outcome.reason)
        events.error(message)
    report(SERVICE_STOP_PENDING, wait_hint_ms=STOP_WAIT_HINT_MS)  # pywin32 reports STOPPED (0) next


def service_class(
    framework: Any,
    instance: str,
    make_service: Callable[[StatusSink], WorkerService],
    events: EventLog,
    exit_process: Callable[[int], Any] = os._exit,
) -> type:
    """A ``win32serviceutil.ServiceFramework`` subclass (``framework``) that runs ``make_service``'s worker.

    Built with ``type()`` so that the framework is a parameter: pywin32's on Windows, a fake in tests.
    """

    def __init__(self: Any, args: Sequence[str]) -> None:
        framework.__init__(self, args)
        self._status_lock = threading.Lock()
        self.core = make_service(self.report_status)

    def report_status(
        self: Any, state: int, *, wait_hint_ms: int = 0, win32_exit_code: int = 0, service_exit_code: int = 0
    ) -> None:
        with self._status_lock:  # the SCM's thread and the worker's both report; the checkpoint is shared
            self.ReportServiceStatus(
                state, waitHint=wait_hint_ms, win32ExitCode=win32_exit_code, svcExitCode=service_exit_code
            )

    def get_accepted_controls(self: Any) -> int:
        return SERVICE_ACCEPT_STOP | SERVICE_ACCEPT_SHUTDOWN | SERVICE_ACCEPT_PRESHUTDOWN

    def svc_stop(self: Any) -> int:
        return int(self.core.control(SERVICE_CONTROL_STOP))

    def svc_shutdown(self: Any) -> int:
        return int(self.core.control(SERVICE_CONTROL_SHUTDOWN))

    def svc_interrogate(self: Any) -> int:
        return int(self.core.control(SERVICE_CONTROL_INTERROGATE))

    def svc_other_ex(self: Any, control: int, event_type: int, data: Any) -> int:
        return int(self.core.control(control))  # PRESHUTDOWN and the user-defined controls come this way

    def svc_run(self: Any) -> None:
        self.report_status(SERVICE_RUNNING)
        events.info(f"{SERVICE_PREFIX}{instance}: the worker is starting (pid {os.getpid()})")
        code = self.core.run()
        outcome = service_exit_for(code, stop_requested=self.core.stop_requested)
        finish(outcome, self.report_status, events, exit_process, self.core.last_error)

    namespace: dict[str, Any] = {
        "_svc_name_": SERVICE_PREFIX + instance,
        "_svc_display_name_": f"Devin Outposts worker {instance}",
        "_svc_description_": f"Serves Devin Outposts sessions (instance {instance})",
        "__init__": __init__,
        "report_status": report_status,
        "GetAcceptedControls": get_accepted_controls,
        "SvcStop": svc_stop,
        "SvcShutdown": svc_shutdown,
        "SvcInterrogate": svc_interrogate,
        "SvcOtherEx": svc_other_ex,
        "SvcRun": svc_run,
    }
    return type("DevinOutpostsWorkerService", (framework,), namespace)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The service host's entry point (``service_host.py`` calls it); ``--debug`` runs in the console."""
    try:
        host = parse_host_args(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"devin-outposts service host: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    prepared = prepare(host)
    if host.debug:
        core = WorkerService(
            prepared.config, _console_status, startup_error=prepared.startup_error
        )  # the worker's own Ctrl-C/Ctrl-Break handlers drain it (the main thread)
        code = core.run()
        log.info("%s", service_exit_for(code, stop_requested=False).reason)
        return code
    try:
        return _dispatch(host, prepared)
    except ProgramExit as exc:
        log.error("%s", exc)
        return exc.code


def _console_status(
    state: int, *, wait_hint_ms: int = 0, win32_exit_code: int = 0, service_exit_code: int = 0
) -> None:
    log.debug(
        "service status %d (wait hint %d ms, exit %d/%d)",
        state,
        wait_hint_ms,
        win32_exit_code,
        service_exit_code,
    )


def _dispatch(host: HostArgs, prepared: Prepared) -> int:
    """Hand the service class to the SCM (pywin32); returns when the service has stopped."""
    if sys.platform == "win32":
        import pywintypes
        import servicemanager
        import win32serviceutil

        name = SERVICE_PREFIX + host.instance
        events = ServicemanagerEventLog(servicemanager)
        klass = service_class(
            win32serviceutil.ServiceFramework,
            host.instance,
            lambda report: WorkerService(prepared.config, report, startup_error=prepared.startup_error),
            events,
        )
        servicemanager.Initialize(name, servicemanager.__file__)
        servicemanager.PrepareToHostSingle(klass)
        dispatch: Callable[[], Any] = servicemanager.StartServiceCtrlDispatcher  # blocks until stopped
        try:
            dispatch()
        except pywintypes.error as exc:  # 1063: started from a console, not by the SCM
            raise ProgramExit(
                ExitCode.USAGE,
                f"could not connect to the service control manager ({exc}); use --debug in a console",
            ) from exc
        return ExitCode.OK
    raise ProgramExit(
        ExitCode.USAGE, "the service host runs on Windows only; use --debug to run it in this console"
    )
