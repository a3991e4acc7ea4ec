"""The Windows service host (worker/windows/service.py) on Linux, with a fake SCM and pywin32 framework.

What is checked here is our side of the contract with the SCM: which status each control and each exit
code of the worker produce, that STOP and PRESHUTDOWN drain the *real* worker (against the fleet
simulator, with the session's claim released), that SHUTDOWN stops it at once, and that the env-file and
config errors name the line but never a value. pywin32 and the SCM themselves never run here
(docs/windows-worker.md, "What has run, and what has not").
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devin_outposts.core.config import ConfigError
from devin_outposts.worker.options import WorkerConfig
from devin_outposts.worker.windows import service as ws
from devin_outposts.worker.windows import setup as service_setup
from devin_outposts.worker.windows.envfile import EnvFileError, parse_env_text, read_env_file
from devin_outposts_sim.testing import run_sim

from worker_fakes import DistServer, FakeRemote, alive, kill_pids, wait_for

SECRET = "cog_service_secret_value_do_not_print"


class FakeScm:
    """Records every ``SetServiceStatus`` as (state, accepted, win32 exit, service exit, checkpoint, hint)."""

    def __init__(self) -> None:
        self.statuses: list[tuple[int, int, int, int, int, int]] = []
        self.lock = threading.Lock()

    def states(self) -> list[int]:
        with self.lock:
            return [status[0] for status in self.statuses]

    def last(self) -> tuple[int, int, int, int, int, int]:
        with self.lock:
            return self.statuses[-1]

    def send(self, service: Any, control: int) -> int:
        """``ControlService`` as the SCM answers it (Microsoft's documentation, and Wine's SCM): no control
        at all, user-defined ones included, reaches a service that reports START_PENDING or STOP_PENDING
        (1061), or one that has stopped (1062); the rest go to the service's handler."""
        with self.lock:
            state = self.statuses[-1][0] if self.statuses else ws.SERVICE_START_PENDING
        if state in (ws.SERVICE_START_PENDING, ws.SERVICE_STOP_PENDING):
            return ws.ERROR_SERVICE_CANNOT_ACCEPT_CTRL
        if state == ws.SERVICE_STOPPED:
            return 1062  # ERROR_SERVICE_NOT_ACTIVE
        return int(service.ServiceCtrlHandlerEx(control, 0, None))


def fake_framework(scm: FakeScm) -> type:
    """A stand-in for ``win32serviceutil.ServiceFramework``: the same method names and dispatch (STOP to
    SvcStop, INTERROGATE to SvcInterrogate, SHUTDOWN to SvcShutdown, anything else to SvcOtherEx), the
    same checkpoint rule (0 for RUNNING and STOPPED, else one more each report), statuses into ``scm``."""

    class Framework:
        def __init__(self, args: Any) -> None:
            self.args = list(args)
            self.checkPoint = 0

        def GetAcceptedControls(self) -> int:
            return 0

        def ReportServiceStatus(
            self,
            serviceStatus: int,
            waitHint: int = 5000,
            win32ExitCode: int = 0,
            svcExitCode: int = 0,
        ) -> None:
            accepted = 0 if serviceStatus == ws.SERVICE_START_PENDING else self.GetAcceptedControls()
            if serviceStatus in (ws.SERVICE_RUNNING, ws.SERVICE_STOPPED):
                checkpoint = 0
            else:
                self.checkPoint += 1
                checkpoint = self.checkPoint
            with scm.lock:
                scm.statuses.append(
                    (serviceStatus, accepted, win32ExitCode, svcExitCode, checkpoint, waitHint)
                )

        def ServiceCtrlHandlerEx(self, control: int, event_type: int, data: Any) -> Any:
            if control == ws.SERVICE_CONTROL_STOP:
                return self.SvcStop()  # type: ignore[attr-defined]
            if control == ws.SERVICE_CONTROL_INTERROGATE:
                return self.SvcInterrogate()  # type: ignore[attr-defined]
            if control == ws.SERVICE_CONTROL_SHUTDOWN:
                return self.SvcShutdown()  # type: ignore[attr-defined]
            return self.SvcOtherEx(control, event_type, data)  # type: ignore[attr-defined]

    return Framework


class Events:
    def __init__(self) -> None:
        self.messages: list[tuple[str, str]] = []

    def info(self, message: str) -> None:
        self.messages.append(("info", message))

    def error(self, message: str) -> None:
        self.messages.append(("error", message))


class FakeWorker:
    """Stands in for :class:`~devin_outposts.worker.runner.Worker` where only the control flow matters:
    records the signals it gets, drains until the test lets it end, and returns ``code``."""

    def __init__(self, code: int = 0) -> None:
        self.code = code
        self.signals: list[int] = []
        self.draining = False
        self.stopped_now = False
        self.finish = threading.Event()
        self.started = threading.Event()

    def on_signal(self, signum: int) -> None:
        self.signals.append(signum)
        if self.draining:
            self.stopped_now = True
        self.draining = True

    async def run(self) -> int:
        self.started.set()
        while not self.finish.is_set():  # noqa: ASYNC110 - a threading.Event, set from the test's thread
            await asyncio.sleep(0.01)
        return self.code


def config(**overrides: Any) -> WorkerConfig:
    values: dict[str, Any] = {"token": SECRET, "outpost": "win", "drain_timeout": 30.0, "stop_grace": 10.0}
    values.update(overrides)
    return WorkerConfig(**values)


def start_core(
    scm_report: Any, worker: FakeWorker, **kwargs: Any
) -> tuple[ws.WorkerService, threading.Thread, list[int]]:
    core = ws.WorkerService(config(**kwargs), scm_report, worker_factory=lambda c: worker, tick=0.05)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(core.run()), daemon=True)
    thread.start()
    assert worker.started.wait(10)
    return core, thread, codes


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int, int]] = []
        self.lock = threading.Lock()

    def __call__(
        self, state: int, *, wait_hint_ms: int = 0, win32_exit_code: int = 0, service_exit_code: int = 0
    ) -> None:
        with self.lock:
            self.calls.append((state, wait_hint_ms, win32_exit_code, service_exit_code))

    def count(self, state: int) -> int:
        with self.lock:
            return sum(1 for call in self.calls if call[0] == state)


# --- the exit-code mapping -----------------------------------------------------------------------------


@pytest.mark.parametrize("code", [2, 3, 4, 6, 9])
def test_the_linux_units_no_restart_codes_end_as_a_clean_stop_with_the_reason(code: int) -> None:
    outcome = ws.service_exit_for(code, stop_requested=False)
    assert (outcome.win32_exit_code, outcome.service_exit_code, outcome.failed) == (0, 0, False)
    assert f"code {code}" in outcome.reason and "not restarting" in outcome.reason


@pytest.mark.parametrize("code", [1, 5, 7, 8, 42])
def test_other_failures_are_a_service_specific_error_with_the_code(code: int) -> None:
    outcome = ws.service_exit_for(code, stop_requested=False)
    assert outcome.win32_exit_code == ws.ERROR_SERVICE_SPECIFIC_ERROR == 1066
    assert outcome.service_exit_code == code
    assert outcome.failed


def test_a_clean_exit_and_a_requested_interruption_are_clean_stops() -> None:
    assert not ws.service_exit_for(0, stop_requested=False).failed
    assert not ws.service_exit_for(128 + 15, stop_requested=True).failed
    unasked = ws.service_exit_for(128 + 15, stop_requested=False)
    assert unasked.failed and unasked.service_exit_code == 143


def test_no_restart_codes_match_the_linux_unit() -> None:
    unit = (
        Path(__file__).parents[3] / "roles/worker/templates/devin-outposts-worker@.service.j2"
    ).read_text()
    line = next(text for text in unit.splitlines() if text.startswith("RestartPreventExitStatus="))
    assert sorted(ws.NO_RESTART) == sorted(int(code) for code in line.split("=", 1)[1].split())


# --- the env file -------------------------------------------------------------------------------------------


def test_env_file_parses_comments_bom_and_crlf_and_keeps_values_verbatim(tmp_path: Path) -> None:
    path = tmp_path / "worker.env"
    path.write_bytes(
        "\ufeff# managed\r\n\r\n   # indented comment\r\nDEVIN_OUTPOSTS_TOKEN=a\"b'c\\d\r\n"
        "  DEVIN_WORKER_CACHE_DIR=C:\\ProgramData\\x\\state\\cache\r\n"
        "HTTP_PROXY=http://proxy:3128\r\nhttp_proxy=http://proxy:3128\r\nEQ=a=b = c \r\n"
        "PCT=%SystemRoot%$HOME\r\nODD=x\u2028Y=1\x85z\n".encode()
    )
    env = read_env_file(path)
    assert env == {
        "DEVIN_OUTPOSTS_TOKEN": "a\"b'c\\d",  # no quotes, no escapes
        "DEVIN_WORKER_CACHE_DIR": "C:\\ProgramData\\x\\state\\cache",
        "HTTP_PROXY": "http://proxy:3128",
        "http_proxy": "http://proxy:3128",
        "EQ": "a=b = c ",  # up to the end of the line
        "PCT": "%SystemRoot%$HOME",  # nothing is expanded
        "ODD": "x\u2028Y=1\x85z",  # only LF ends a line: no second variable from inside a value
    }


@pytest.mark.parametrize(
    ("text", "line", "why"),
    [
        (f"A=1\n{SECRET}\n", 2, "no '='"),
        (f"A=1\n\n{SECRET}-x=1\n", 3, "not a variable name"),
        (f"=={SECRET}\n", 1, "not a variable name"),
        (f"TOKEN={SECRET}\nTOKEN={SECRET}2\n", 2, "set again"),
        (f"HTTP_PROXY=http://{SECRET}@p\nhttp_proxy=http://other\n", 2, "different values"),
        (f"A=1\nTOKEN={SECRET}\x00\n", 2, "NUL"),
    ],
)
def test_env_file_errors_name_the_line_and_never_the_value(text: str, line: int, why: str) -> None:
    with pytest.raises(EnvFileError) as caught:
        parse_env_text(text, "worker.env")
    message = str(caught.value)
    assert f"worker.env line {line}:" in message
    assert why in message
    assert SECRET not in message


def test_env_file_that_is_not_utf8_names_the_line_only(tmp_path: Path) -> None:
    path = tmp_path / "worker.env"
    path.write_bytes(b"A=1\nTOKEN=\xff\xfe" + SECRET.encode() + b"\n")
    with pytest.raises(EnvFileError, match="line 2: not UTF-8") as caught:
        read_env_file(path)
    assert SECRET not in str(caught.value)


def test_worker_config_from_the_env_file_like_worker_start(tmp_path: Path) -> None:
    env = {
        "DEVIN_OUTPOSTS_TOKEN": SECRET,
        "DEVIN_OUTPOSTS_WORKER_OUTPOST": " win-outpost ",
        "DEVIN_API_URL": "https://api.example.test",
        "DEVIN_WORKER_DRAIN_TIMEOUT": "45",
        "DEVIN_WORKER_MAX_SESSIONS": "2",
        "DEVIN_WORKER_LOG_FORMAT": "json",
    }
    built = service_setup.worker_config(env, tmp_path, ["--stop-grace-secs", "4"])
    assert (built.outpost, built.token, built.api_url) == ("win-outpost", SECRET, "https://api.example.test")
    assert (built.drain_timeout, built.max_sessions, built.stop_grace, built.log_format) == (
        45.0,
        2,
        4.0,
        "json",
    )
    # A service's current directory is System32: state and work default into the instance directory.
    assert built.cache_dir == tmp_path / "state" / "cache"
    assert built.data_dir == tmp_path / "state"
    assert built.workdir == tmp_path / "work"
    assert SECRET not in repr(built)


def test_worker_config_refuses_a_token_argument_and_bad_values_without_the_secret(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--token is not accepted"):
        service_setup.worker_config({"DEVIN_OUTPOSTS_TOKEN": SECRET}, tmp_path, ["--token", SECRET])
    with pytest.raises(ConfigError, match="--drain-timeout") as caught:
        service_setup.worker_config(
            {"DEVIN_OUTPOSTS_TOKEN": SECRET, "DEVIN_WORKER_DRAIN_TIMEOUT": "soon"}, tmp_path
        )
    assert SECRET not in str(caught.value)
    with pytest.raises(ConfigError, match="no API token"):
        service_setup.worker_config({}, tmp_path)
    with pytest.raises(ConfigError, match="unrecognized"):
        service_setup.worker_config({"DEVIN_OUTPOSTS_TOKEN": SECRET}, tmp_path, ["--no-such-flag"])


def test_host_arguments() -> None:
    host = service_setup.parse_host_args(
        ["--instance", "gpu-1", "--env-file", "C:/x/worker.env", "--", "--max-sessions", "2"]
    )
    assert (host.instance, host.debug, host.worker_args) == ("gpu-1", False, ["--max-sessions", "2"])
    for bad in ("../x", "a b", "", "-x"):
        with pytest.raises(ConfigError):
            service_setup.parse_host_args(["--instance", bad, "--env-file", "w.env"])
    with pytest.raises(ConfigError):
        service_setup.parse_host_args(["--instance", "a"])


def test_a_bad_env_file_stops_the_service_cleanly_with_exit_2_and_logs_no_value(tmp_path: Path) -> None:
    env_file = tmp_path / "worker.env"
    env_file.write_text(f"DEVIN_OUTPOSTS_TOKEN={SECRET}\n{SECRET}\n")
    prepared = service_setup.prepare(service_setup.HostArgs("one", env_file, False, []), environ={})
    try:
        assert prepared.config is None and prepared.startup_error is not None
        scm = FakeScm()
        events = Events()
        exits: list[int] = []
        klass = ws.service_class(
            fake_framework(scm), "one",
            lambda report: ws.WorkerService(prepared.config, report, startup_error=prepared.startup_error),
            events, exits.append,
        )  # fmt: skip
        klass(["devin-outposts-worker-one"]).SvcRun()
    finally:
        logging.shutdown()
        logging.getLogger().handlers.clear()
    assert exits == []  # a clean stop: pywin32 reports STOPPED with 0, recovery leaves it alone
    assert scm.states() == [ws.SERVICE_RUNNING, ws.SERVICE_STOP_PENDING]
    assert ("error", events.messages[-1][1]) == events.messages[-1] and "code 2" in events.messages[-1][1]
    log_text = prepared.log_path.read_text()
    assert "worker.env line 2: expected NAME=VALUE" in log_text
    assert "worker.env line 2: expected NAME=VALUE" in events.messages[-1][1]
    assert SECRET not in log_text and SECRET not in repr(events.messages)


# --- controls: the pure part ----------------------------------------------------------------------------


def test_stop_drains_reports_stop_pending_and_ends_when_the_worker_does() -> None:
    report = Recorder()
    worker = FakeWorker()
    core, thread, codes = start_core(report, worker)
    assert core.control(ws.SERVICE_CONTROL_STOP) == ws.NO_ERROR
    wait_for(lambda: worker.signals == [signal.SIGTERM], timeout=10, what="the drain (SIGTERM)")
    wait_for(lambda: report.count(ws.SERVICE_STOP_PENDING) >= 3, timeout=10, what="STOP_PENDING heartbeats")
    assert not worker.stopped_now
    worker.finish.set()
    thread.join(10)
    assert codes == [0]
    beats = report.count(ws.SERVICE_STOP_PENDING)
    assert all(call[1] == ws.STOP_WAIT_HINT_MS for call in report.calls if call[0] == ws.SERVICE_STOP_PENDING)
    # Nothing reports after the worker is done (pywin32 reports STOPPED after SvcRun).
    assert report.count(ws.SERVICE_STOP_PENDING) == beats
    assert core.control(ws.SERVICE_CONTROL_STOP) == ws.NO_ERROR and worker.signals == [signal.SIGTERM]


def test_preshutdown_drains_like_stop_and_a_repeated_drain_request_does_not_escalate() -> None:
    report = Recorder()
    worker = FakeWorker()
    core, thread, codes = start_core(report, worker)
    core.control(ws.SERVICE_CONTROL_PRESHUTDOWN)
    wait_for(lambda: worker.draining, timeout=10, what="the drain")
    # A real SCM never delivers this (the service is STOP_PENDING: see the test of the pywin32 class);
    # were it delivered, it would not be the second SIGTERM.
    core.control(ws.SERVICE_CONTROL_STOP)
    worker.finish.set()
    thread.join(10)
    assert codes == [0]
    assert worker.signals == [signal.SIGTERM] and not worker.stopped_now


def test_the_stop_now_control_stops_without_draining() -> None:
    report = Recorder()
    worker = FakeWorker()
    core, thread, codes = start_core(report, worker)
    assert core.control(ws.SERVICE_CONTROL_STOP_NOW) == ws.NO_ERROR
    wait_for(lambda: worker.stopped_now, timeout=10, what="stop now")
    assert worker.signals == [signal.SIGTERM, signal.SIGTERM]
    assert report.calls[0][0] == ws.SERVICE_STOP_PENDING
    worker.finish.set()
    thread.join(10)
    assert codes == [0]
    assert core.control(ws.SERVICE_CONTROL_STOP_NOW) == ws.NO_ERROR and len(worker.signals) == 2


def test_shutdown_stops_at_once() -> None:
    report = Recorder()
    worker = FakeWorker()
    core, thread, codes = start_core(report, worker)
    core.control(ws.SERVICE_CONTROL_SHUTDOWN)
    wait_for(lambda: worker.stopped_now, timeout=10, what="stop now")
    assert worker.signals == [signal.SIGTERM, signal.SIGTERM]
    worker.finish.set()
    thread.join(10)
    assert codes == [0]


def test_interrogate_reports_the_state_as_it_is_and_unknown_controls_are_refused() -> None:
    report = Recorder()
    worker = FakeWorker()
    core, thread, codes = start_core(report, worker)
    assert core.control(ws.SERVICE_CONTROL_INTERROGATE) == ws.NO_ERROR
    assert report.calls[-1][0] == ws.SERVICE_RUNNING
    assert core.control(0x3) == ws.ERROR_CALL_NOT_IMPLEMENTED  # PAUSE: not accepted
    assert worker.signals == []
    core.control(ws.SERVICE_CONTROL_STOP)
    core.control(ws.SERVICE_CONTROL_INTERROGATE)
    assert report.calls[-1][0] == ws.SERVICE_STOP_PENDING
    worker.finish.set()
    thread.join(10)
    assert codes == [0]


def test_a_stop_before_the_worker_runs_is_kept_and_delivered() -> None:
    report = Recorder()
    worker = FakeWorker()
    core = ws.WorkerService(config(), report, worker_factory=lambda c: worker, tick=0.05)
    core.control(ws.SERVICE_CONTROL_STOP)
    assert report.calls[-1][0] == ws.SERVICE_STOP_PENDING
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(core.run()), daemon=True)
    thread.start()
    wait_for(lambda: worker.signals == [signal.SIGTERM], timeout=10, what="the pending drain")
    worker.finish.set()
    thread.join(10)
    assert codes == [0]


def test_a_drain_past_its_budget_is_made_to_stop_now() -> None:
    report = Recorder()
    worker = FakeWorker()
    core, thread, codes = start_core(report, worker, drain_timeout=0.0, stop_grace=0.0)
    core._stop_started = 0.0
    with core._lock:
        core.stop_requested = True
    core.request_stop(now=False, why="test")
    wait_for(lambda: worker.stopped_now, timeout=10, what="the escalation")
    worker.finish.set()
    thread.join(10)
    assert codes == [0]


# --- the pywin32 class ---------------------------------------------------------------------------------


def make_service(scm: FakeScm, worker: FakeWorker, exits: list[int], events: Events) -> Any:
    klass = ws.service_class(
        fake_framework(scm), "gpu",
        lambda report: ws.WorkerService(config(), report, worker_factory=lambda c: worker, tick=0.05),
        events, exits.append,
    )  # fmt: skip
    assert klass._svc_name_ == "devin-outposts-worker-gpu"
    return klass(["devin-outposts-worker-gpu"])


def run_service(service: Any) -> threading.Thread:
    thread = threading.Thread(target=service.SvcRun, daemon=True)
    thread.start()
    return thread


def test_the_service_class_accepts_stop_shutdown_and_preshutdown_and_drains_on_stop() -> None:
    scm, worker, exits, events = FakeScm(), FakeWorker(), [], Events()
    service = make_service(scm, worker, exits, events)
    thread = run_service(service)
    assert worker.started.wait(10)
    running = scm.statuses[0]
    assert running[0] == ws.SERVICE_RUNNING
    assert running[1] == ws.SERVICE_ACCEPT_STOP | ws.SERVICE_ACCEPT_SHUTDOWN | ws.SERVICE_ACCEPT_PRESHUTDOWN
    assert service.ServiceCtrlHandlerEx(ws.SERVICE_CONTROL_INTERROGATE, 0, None) == ws.NO_ERROR
    assert scm.last()[0] == ws.SERVICE_RUNNING
    assert service.ServiceCtrlHandlerEx(ws.SERVICE_CONTROL_STOP, 0, None) == ws.NO_ERROR
    wait_for(lambda: worker.draining, timeout=10, what="the drain")
    wait_for(lambda: scm.states().count(ws.SERVICE_STOP_PENDING) >= 3, timeout=10, what="heartbeats")
    pending = [status for status in scm.statuses if status[0] == ws.SERVICE_STOP_PENDING]
    checkpoints = [status[4] for status in pending]
    assert checkpoints == sorted(checkpoints) and len(set(checkpoints)) == len(checkpoints)  # always growing
    assert all(status[5] == ws.STOP_WAIT_HINT_MS for status in pending)
    worker.finish.set()
    thread.join(10)
    assert exits == []
    assert scm.last()[0] == ws.SERVICE_STOP_PENDING  # pywin32 itself reports STOPPED (0) after SvcRun
    assert events.messages[-1] == ("info", "the worker stopped")


def test_once_stop_pending_the_scm_refuses_every_control_and_the_drain_runs_its_course() -> None:
    scm, worker, exits, events = FakeScm(), FakeWorker(), [], Events()
    service = make_service(scm, worker, exits, events)
    thread = run_service(service)
    assert worker.started.wait(10)
    assert scm.send(service, ws.SERVICE_CONTROL_STOP) == ws.NO_ERROR
    wait_for(lambda: worker.draining, timeout=10, what="the drain")
    # "A second STOP while draining stops at once" cannot happen on Windows: neither a STOP, nor a
    # PRESHUTDOWN, nor the user-defined stop-now control reaches a STOP_PENDING service.
    for control in (ws.SERVICE_CONTROL_STOP, ws.SERVICE_CONTROL_PRESHUTDOWN, ws.SERVICE_CONTROL_STOP_NOW):
        assert scm.send(service, control) == ws.ERROR_SERVICE_CANNOT_ACCEPT_CTRL
    assert worker.signals == [signal.SIGTERM] and not worker.stopped_now
    worker.finish.set()
    thread.join(10)
    assert exits == [] and events.messages[-1] == ("info", "the worker stopped")


def test_the_stop_now_control_reaches_a_running_service_through_svc_other_ex() -> None:
    scm, worker, exits, events = FakeScm(), FakeWorker(), [], Events()
    service = make_service(scm, worker, exits, events)
    thread = run_service(service)
    assert worker.started.wait(10)
    assert scm.send(service, ws.SERVICE_CONTROL_STOP_NOW) == ws.NO_ERROR
    wait_for(lambda: worker.stopped_now, timeout=10, what="stop now")
    assert worker.signals == [signal.SIGTERM, signal.SIGTERM]
    assert scm.last()[0] == ws.SERVICE_STOP_PENDING
    assert scm.send(service, ws.SERVICE_CONTROL_STOP) == ws.ERROR_SERVICE_CANNOT_ACCEPT_CTRL
    worker.finish.set()
    thread.join(10)
    assert exits == [] and events.messages[-1] == ("info", "the worker stopped")


def test_preshutdown_reaches_the_worker_through_svc_other_ex() -> None:
    scm, worker, exits, events = FakeScm(), FakeWorker(), [], Events()
    service = make_service(scm, worker, exits, events)
    thread = run_service(service)
    assert worker.started.wait(10)
    assert service.ServiceCtrlHandlerEx(ws.SERVICE_CONTROL_PRESHUTDOWN, 0, None) == ws.NO_ERROR
    wait_for(lambda: worker.draining, timeout=10, what="the drain")
    assert not worker.stopped_now
    assert service.ServiceCtrlHandlerEx(ws.SERVICE_CONTROL_SHUTDOWN, 0, None) == ws.NO_ERROR
    wait_for(lambda: worker.stopped_now, timeout=10, what="stop now")
    worker.finish.set()
    thread.join(10)


def test_a_failed_worker_reports_a_service_specific_error_with_its_code_and_ends_the_process() -> None:
    scm, worker, exits, events = FakeScm(), FakeWorker(code=8), [], Events()
    service = make_service(scm, worker, exits, events)
    thread = run_service(service)
    assert worker.started.wait(10)
    worker.finish.set()
    thread.join(10)
    assert exits == [8]
    assert scm.last()[0] == ws.SERVICE_STOPPED
    assert scm.last()[2:4] == (ws.ERROR_SERVICE_SPECIFIC_ERROR, 8)
    assert events.messages[-1][0] == "error" and "code 8" in events.messages[-1][1]


def test_a_refused_token_is_a_clean_stop_with_the_reason_in_the_event_log() -> None:
    scm, worker, exits, events = FakeScm(), FakeWorker(code=3), [], Events()
    service = make_service(scm, worker, exits, events)
    thread = run_service(service)
    assert worker.started.wait(10)
    worker.finish.set()
    thread.join(10)
    assert exits == []
    assert ws.SERVICE_STOPPED not in scm.states()
    assert events.messages[-1][0] == "error" and "token was refused" in events.messages[-1][1]


def test_main_refuses_to_dispatch_off_windows(tmp_path: Path) -> None:
    env_file = tmp_path / "worker.env"
    env_file.write_text(f"DEVIN_OUTPOSTS_TOKEN={SECRET}\nDEVIN_OUTPOSTS_WORKER_OUTPOST=x\n")
    try:
        assert ws.main(["--instance", "x", "--env-file", str(env_file)]) == 2
    finally:
        logging.shutdown()
        logging.getLogger().handlers.clear()
    assert "runs on Windows only" in (tmp_path / "logs" / "worker.log").read_text()
    assert ws.main(["--instance", "../x", "--env-file", str(env_file)]) == 2


# --- the real worker, drained by a service STOP ------------------------------------------------------------


@pytest.fixture
def sim_setup(tmp_path: Path) -> Iterator[tuple[Any, DistServer, FakeRemote, Any, str]]:
    remote = FakeRemote(tmp_path / "remote")
    with run_sim(claim_ttl=10.0, watch_max_duration=3, keepalive_interval=0.5, sweep_interval=0.05) as sim, \
            DistServer("abc1234", remote.script) as dist:  # fmt: skip
        outpost = sim.admin.create_outpost("win", "linux")
        try:
            yield sim, dist, remote, outpost, sim.create_token("machine")
        finally:
            kill_pids(run["pid"] for run in remote.runs())


def test_a_service_stop_drains_the_real_worker_and_releases_its_session(
    tmp_path: Path, sim_setup: tuple[Any, DistServer, FakeRemote, Any, str]
) -> None:
    sim, dist, remote, outpost, token = sim_setup
    instance = tmp_path / "instance"
    instance.mkdir()
    env_file = instance / "worker.env"
    env_file.write_text(
        f"DEVIN_OUTPOSTS_TOKEN={token}\nDEVIN_OUTPOSTS_WORKER_OUTPOST={outpost.name}\nDEVIN_API_URL={sim.url}\n"
        f"DEVIN_WORKER_STATIC_BASE_URL={dist.url}\nDEVIN_WORKER_DRAIN_TIMEOUT=1\n"
    )
    host = service_setup.HostArgs(
        "one", env_file, False, ["--poll-interval-secs", "0.3", "--stop-grace-secs", "2"]
    )
    environ: dict[str, str] = {}
    prepared = service_setup.prepare(host, environ=environ)
    scm, exits, events = FakeScm(), [], Events()
    try:
        assert prepared.config is not None, prepared.startup_error
        assert environ["DEVIN_OUTPOSTS_TOKEN"] == token  # the process environment, as systemd would set it
        klass = ws.service_class(
            fake_framework(scm), "one",
            lambda report: ws.WorkerService(prepared.config, report, startup_error=prepared.startup_error),
            events, exits.append,
        )  # fmt: skip
        service = klass(["devin-outposts-worker-one"])
        thread = run_service(service)
        entry = sim.admin.enqueue(outpost.outpost_id)
        run = wait_for(lambda: remote.runs(entry.session_id), timeout=30, what="the remote")[0]
        assert service.ServiceCtrlHandlerEx(ws.SERVICE_CONTROL_STOP, 0, None) == ws.NO_ERROR
        thread.join(30)
        assert not thread.is_alive()
    finally:
        logging.shutdown()
        logging.getLogger().handlers.clear()
    assert exits == []  # drained: a clean stop
    assert ws.SERVICE_STOP_PENDING in scm.states()
    released = [r for r in sim.admin.claims(session_id=entry.session_id) if r["action"] == "release"]
    assert released
    assert run["pid"] in remote.stopped_pids()
    assert not alive(run["pid"])
    assert token not in run["env"].values()
    log_text = prepared.log_path.read_text()
    assert "service control STOP" in log_text and "no new claims" in log_text
    assert "no control reaches a stopping service" in log_text and "send it again" not in log_text
    assert (instance / "state" / "acceptor_id").is_file()
    assert token not in log_text


def test_debug_mode_runs_in_the_console_and_reports_a_bad_env_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env_file = tmp_path / "worker.env"
    env_file.write_text(f"DEVIN_OUTPOSTS_TOKEN={SECRET}\nDEVIN_WORKER_MAX_SESSIONS=many\n")
    try:
        assert ws.main(["--instance", "x", "--env-file", str(env_file), "--debug"]) == 2
    finally:
        logging.shutdown()
        logging.getLogger().handlers.clear()
    console = capsys.readouterr().err
    assert "--max-sessions must be an integer" in console
    assert SECRET not in console


def test_a_log_directory_that_cannot_be_made_stops_the_service_cleanly_with_the_reason(
    tmp_path: Path,
) -> None:
    env_file = tmp_path / "worker.env"
    env_file.write_text(f"DEVIN_OUTPOSTS_TOKEN={SECRET}\nDEVIN_OUTPOSTS_WORKER_OUTPOST=x\n")
    (tmp_path / "logs").write_text("a file where the directory should be")
    try:
        prepared = service_setup.prepare(service_setup.HostArgs("x", env_file, False, []), environ={})
    finally:
        logging.getLogger().handlers.clear()
    assert prepared.config is None
    assert prepared.startup_error is not None and "Could not open the log" in prepared.startup_error
    scm, events, exits = FakeScm(), Events(), []
    klass = ws.service_class(
        fake_framework(scm), "x",
        lambda report: ws.WorkerService(prepared.config, report, startup_error=prepared.startup_error),
        events, exits.append,
    )  # fmt: skip
    klass(["devin-outposts-worker-x"]).SvcRun()
    assert exits == [] and "Could not open the log" in events.messages[-1][1]
