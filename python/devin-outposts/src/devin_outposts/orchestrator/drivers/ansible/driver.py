"""The ``ansible`` driver: the user's playbooks make and destroy each session's machine
(docs/orchestrator-ansible.md).

* :meth:`AnsibleDriver.provision` runs the user's **provision playbook** with the session's variables as extra
  variables; the playbook reports the host it made with ``ansible.builtin.set_stats`` of
  ``devin_outposts_machine`` = ``{host: <inventory name>, vars: {<connection variables>}}``.
* :meth:`AnsibleDriver.start` runs the collection's ``devin.outposts.orchestrator_session`` playbook (the
  ``devin.outposts.worker`` role in one-session mode) against that host, with the session's connect token in a
  0600 file outside every artifact, deleted when the run ends.
* :meth:`AnsibleDriver.status` reads the session unit's state on the host (``systemctl show``, ad hoc);
  its status source (:mod:`.status`) reads every machine's unit with one ad-hoc run per ``status_interval``.
* :meth:`AnsibleDriver.teardown` runs the user's **teardown playbook** with the same variables and the host.

Playbook-made hosts carry no labels the driver could query, so it keeps one record per machine under
``<state_dir>/ansible/machines/`` (0600 files in a 0700 directory, :mod:`.records`): that is what
:meth:`list_owned` reads. The driver does not snapshot (the ``snapshot`` resume policy is refused). Its
options are one table in :mod:`.options`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import sys
import time
from collections.abc import Container, Mapping
from pathlib import Path
from typing import Any, ClassVar, Optional

from devin_outposts.orchestrator.drivers.ansible import _run
from devin_outposts.orchestrator.drivers.ansible.options import OPTIONS, START_PLAYBOOK, TIMEOUTS
from devin_outposts.orchestrator.drivers.ansible.records import (
    MachineRecords,
    machine_of,
    private_dir,
    sweep_files,
)
from devin_outposts.orchestrator.drivers.ansible.status import UNITS_VAR, AnsibleStatusSource
from devin_outposts.orchestrator.drivers.ansible.units import (
    SESSION_UNIT,
    parse_unit_state,
    show_command,
    unit_of,
)
from devin_outposts.orchestrator.drivers.base import (
    Driver,
    DriverContext,
    DriverError,
    Machine,
    SessionSpec,
    Snapshot,
    StatusSource,
    WorkerLaunch,
    WorkerState,
    WorkerStatus,
    machine_name,
    name_taken,
)

#: What the provision playbook reports with set_stats.
MACHINE_FACT = "devin_outposts_machine"
#: Consecutive unreachable status reads after which a machine counts as gone (one may be a network blip).
UNREACHABLE_LIMIT = 3
#: Status runs kept per machine (each status read is a run with artifacts of its own), and of the status
#: source's runs (kept under STATUS_ARTIFACTS: no machine name lacks a dash).
STATUS_RUNS_KEPT = 3
STATUS_ARTIFACTS = "_status"

SNAPSHOT_REFUSAL = "the ansible driver does not snapshot; use resume policy start_fresh"


class AnsibleDriver(Driver):
    name: ClassVar[str] = "ansible"
    option_table = OPTIONS
    unreachable_limit: ClassVar[int] = UNREACHABLE_LIMIT

    def __init__(
        self,
        context: DriverContext,
        *,
        provision_playbook: Path,
        teardown_playbook: Path,
        start_playbook: str = START_PLAYBOOK,
        inventory: Optional[Path] = None,
        extra_vars_file: Optional[Path] = None,
        artifact_dir: Optional[Path] = None,
        keep_artifacts: bool = OPTIONS["keep_artifacts"].default,
        env: Optional[Mapping[str, str]] = None,
        machine_prefix: str = OPTIONS["machine_prefix"].default,
        machine_name_length: int = OPTIONS["machine_name_length"].default,
        timeouts: Optional[Mapping[str, float]] = None,
        runner_command: tuple[str, ...] = (sys.executable, "-m", "ansible_runner"),
        status_interval: float = OPTIONS["status_interval"].default,
    ) -> None:
        self.context = context
        self.provision_playbook = provision_playbook
        self.teardown_playbook = teardown_playbook
        self.start_playbook = start_playbook
        self.inventory = inventory
        self.extra_vars_file = extra_vars_file
        self.root = context.state_dir / "ansible"
        self.records = MachineRecords(self.root)
        self.artifact_dir = artifact_dir or self.root / "artifacts"
        self.keep_artifacts = keep_artifacts
        self.env = _run.runner_environment(env or {})
        self.machine_prefix = machine_prefix
        self.machine_name_length = machine_name_length
        self.timeouts = {
            **{name: OPTIONS[name].default for name in TIMEOUTS},
            "provision_timeout": context.boot_timeout,
            **(timeouts or {}),
        }
        self.runner_command = runner_command
        self.status_interval = status_interval
        self._unreachable: dict[str, int] = {}
        #: The status sources running on this driver (told of each start at once).
        self.sources: set[AnsibleStatusSource] = set()

    @classmethod
    def from_options(cls, context: DriverContext, options: Mapping[str, Any]) -> AnsibleDriver:
        values = OPTIONS.read(options)
        prefix, length = values["machine_prefix"], values["machine_name_length"]
        try:
            machine_name(prefix, "x", length)
        except ValueError:
            too_short = f"{length} is too short for prefix {prefix!r}"
            raise OPTIONS.error("machine_name_length", too_short) from None
        return cls(
            context,
            provision_playbook=values["provision_playbook"],
            teardown_playbook=values["teardown_playbook"],
            start_playbook=values["start_playbook"],
            inventory=values["inventory"],
            extra_vars_file=values["extra_vars_file"],
            artifact_dir=values["artifact_dir"],
            keep_artifacts=values["keep_artifacts"],
            env=values["env"],
            machine_prefix=prefix,
            machine_name_length=length,
            timeouts={name: values[name] for name in TIMEOUTS if values[name] is not None},
            status_interval=values["status_interval"],
        )

    def status_source(self, acceptor_id: str) -> StatusSource:
        return AnsibleStatusSource(self, acceptor_id, interval=self.status_interval)

    # --- start-up ---------------------------------------------------------------------------------------

    async def check(self) -> None:
        private_dir(self.root)
        # What a killed orchestrator left: token files of starts that never reached their `finally`, and
        # private data directories of runs. No run of this process has begun yet.
        self._sweep_files(0.0)
        for path in (self.provision_playbook, self.teardown_playbook):
            if not path.is_file():
                raise DriverError(f"the ansible driver's playbook {path} is not a file")
        result = await _run.run_version(self.runner_command, env=self.env)
        if result is None:
            raise DriverError(
                f"ansible-runner cannot be run with {' '.join(self.runner_command)}; "
                "install devin-outposts[ansible]"
            )
        if shutil.which("ansible-playbook", path=self.env.get("PATH")) is None:
            raise DriverError(
                "ansible-playbook is not on the PATH of the ansible driver's runs; install ansible-core"
            )

    # --- machines ---------------------------------------------------------------------------------------

    async def provision(self, spec: SessionSpec) -> Machine:
        name = machine_name(self.machine_prefix, spec.session_id, self.machine_name_length)
        record = self.records.read(name)
        if record is not None and record.get("session_id") != spec.session_id:
            raise name_taken(f"machine {name}", str(record.get("session_id")))
        if record is not None and record.get("host"):
            return machine_of(record)
        # Recorded before the playbook runs: a host it half made is still found (list_owned) and torn down.
        record = {
            "name": name,
            "session_id": spec.session_id,
            "outpost_id": spec.outpost_id,
            "acceptor_id": spec.acceptor_id,
            "created_at": time.time(),
            "session": self._session_vars(spec, name),
            "host": None,
            "host_vars": {},
        }
        self.records.write(record)
        result = await self._playbook(
            name, "provision", str(self.provision_playbook), record["session"], inventory=True
        )
        machine_fact = result.stats().get(MACHINE_FACT)
        problem = None if result.ok else f"the provision playbook failed: {result.failure()}"
        if problem is None:
            problem = self._check_machine_fact(machine_fact)
        if problem is not None:
            # Whatever the playbook made goes now: a failed provision must leave nothing behind.
            with contextlib.suppress(DriverError):
                await self.teardown(machine_of(record))
            raise DriverError(
                f"Could not provision machine {name} for session {spec.session_id}: {problem} (artifacts in "
                f"{result.artifact_dir})"
            )
        assert isinstance(machine_fact, dict)
        record["host"] = str(machine_fact["host"])
        record["host_vars"] = dict(machine_fact.get("vars") or {})
        self.records.write(record)
        return machine_of(record)

    async def start(self, machine: Machine, launch: WorkerLaunch) -> None:
        record = self.records.require(machine, "start the worker on")
        if unit_of(launch.session_id) is None:
            raise DriverError(
                f"session id {launch.session_id!r} cannot name a systemd unit; the ansible driver refuses it"
            )
        extravars: dict[str, Any] = {
            **record["session"],
            "devin_outposts_worker_session_id": launch.session_id,
            "devin_outposts_worker_gateway_url": launch.gateway_url,
            "devin_outposts_worker_session_remote_sha": launch.remote_binary_sha or "",
            "devin_outposts_worker_log_format": launch.log_format,
        }
        if launch.static_base_url:
            extravars["devin_outposts_worker_static_base_url"] = launch.static_base_url
        if launch.network_policy is not None:  # the worker on the host confines the session to it
            extravars["devin_outposts_worker_session_network_policy"] = dict(launch.network_policy)
        secrets_dir = private_dir(self.root / "secrets")
        token_file = secrets_dir / f"{machine.name}.{secrets.token_hex(4)}.token"
        # 0600 from its creation on, outside the artifact and private data directories; the playbook reads it
        # inside the role's no_log tasks only, and it is gone when the run ends, whatever happened.
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(launch.connect_token)
            extravars["devin_outposts_orchestrator_token_file"] = str(token_file)
            result = await self._playbook(
                machine.name,
                "start",
                self.start_playbook,
                extravars,
                hosts={record["host"]: record["host_vars"]},
            )
        finally:
            with contextlib.suppress(FileNotFoundError):
                token_file.unlink()
        if not result.ok:
            raise DriverError(
                f"Could not start the worker of session {machine.session_id} on {record['host']}: "
                f"{result.failure()} "
                f"(artifacts in {result.artifact_dir})"
            )
        for source in list(self.sources):  # the new worker's row, and a read of its unit soon
            source.started(machine.name, machine.acceptor_id)

    async def status(self, machine: Machine) -> WorkerStatus:
        record = self.records.read(machine.name)
        if record is None:
            return WorkerStatus(WorkerState.MISSING, detail="no record: torn down")
        if not record.get("host"):
            return WorkerStatus(WorkerState.STARTING, detail="provisioning")
        host = str(record["host"])
        unit = SESSION_UNIT.format(machine.session_id)
        result = await _run.run(
            self.runner_command,
            artifact_root=self.artifact_dir / machine.name / "status",
            work_root=self.root / "runs",
            ident=self._ident("status"),
            env=self.env,
            extravars={},
            cmdline=self._cmdline(),
            timeout=self.timeouts["status_timeout"],
            module="ansible.builtin.command",
            module_args=show_command(unit),
            hosts=host,
            inventory_hosts={host: record["host_vars"]},
            rotate=STATUS_RUNS_KEPT,
        )
        events = result.host_results(host)
        if any(e["event"] == "runner_on_unreachable" for e in events):
            count = self._unreachable[machine.name] = self._unreachable.get(machine.name, 0) + 1
            if count >= UNREACHABLE_LIMIT:
                return WorkerStatus(WorkerState.MISSING, detail=f"{host} unreachable {count} times in a row")
            raise DriverError(
                f"Could not read the worker of session {machine.session_id}: {result.failure()}"
            )
        self._unreachable.pop(machine.name, None)
        answers = [e for e in events if e["event"] == "runner_on_ok"]
        if not answers:
            raise DriverError(
                f"Could not read the worker of session {machine.session_id}: {result.failure()}"
            )
        return parse_unit_state(str((answers[-1].get("res") or {}).get("stdout", "")))

    async def read_units(self, hosts: Mapping[str, Mapping[str, Any]], *, forks: int) -> _run.RunResult:
        """One ad-hoc run of ``systemctl show`` on every host of ``hosts`` (host -> its connection variables
        and, in ``devin_outposts_status_units``, its session units): the status source's one read."""
        return await _run.run(
            self.runner_command,
            artifact_root=self.artifact_dir / STATUS_ARTIFACTS,
            work_root=self.root / "runs",
            ident=self._ident("status"),
            env=self.env,
            extravars={},
            cmdline=self._cmdline(),
            timeout=self.timeouts["status_timeout"],
            module="ansible.builtin.command",
            module_args=show_command(f"{{{{ {UNITS_VAR} }}}}"),
            hosts="all",
            inventory_hosts=hosts,
            rotate=STATUS_RUNS_KEPT,
            forks=forks,
        )

    async def teardown(self, machine: Machine) -> None:
        record = self.records.read(machine.name)
        if record is None:
            return
        extravars = {
            **record["session"],
            MACHINE_FACT: {"host": record["host"], "vars": record["host_vars"]} if record.get("host") else {},
        }
        result = await self._playbook(
            machine.name, "teardown", str(self.teardown_playbook), extravars, inventory=True
        )
        if not result.ok:
            raise DriverError(
                f"Could not tear down machine {machine.name} of session {machine.session_id}: "
                f"{result.failure()} "
                f"(artifacts in {result.artifact_dir})"
            )
        self.records.remove(machine.name)
        self._unreachable.pop(machine.name, None)
        if not self.keep_artifacts:
            shutil.rmtree(self.artifact_dir / machine.name, ignore_errors=True)

    async def sweep_orphans(self, acceptor_id: str, outpost_id: str, live_sessions: Container[str]) -> int:
        """Token files and run directories older than the longest run (a start in flight is younger)."""
        return self._sweep_files(max(self.timeouts.values()) + 2 * _run.STOP_GRACE + 60.0)

    def _sweep_files(self, older_than: float) -> int:
        return sweep_files((self.root / "secrets", self.root / "runs"), older_than)

    async def list_owned(self, acceptor_id: str, outpost_id: str) -> list[Machine]:
        return [machine_of(record) for record in self.records.owned(acceptor_id, outpost_id)]

    # --- snapshots: not supported ---------------------------------------------------------------------

    async def snapshot(self, machine: Machine) -> Snapshot:
        raise DriverError(SNAPSHOT_REFUSAL)

    async def restore(self, machine: Machine, snapshot: Snapshot) -> None:
        raise DriverError(SNAPSHOT_REFUSAL)

    async def list_snapshots(self, acceptor_id: str, outpost_id: str) -> list[Snapshot]:
        return []

    async def delete_snapshot(self, snapshot: Snapshot) -> None:
        return None

    # --- helpers -----------------------------------------------------------------------------------------

    def _session_vars(self, spec: SessionSpec, name: str) -> dict[str, Any]:
        """The variables every playbook of this session gets (docs/orchestrator-ansible.md)."""
        return {
            "devin_outposts_session_id": spec.session_id,
            "devin_outposts_outpost_id": spec.outpost_id,
            "devin_outposts_acceptor_id": spec.acceptor_id,
            "devin_outposts_platform": spec.platform or "",
            "devin_outposts_session_kind": spec.kind,
            "devin_outposts_network_policy": dict(spec.network_policy)
            if spec.network_policy is not None
            else None,
            "devin_outposts_remote_binary_sha": spec.remote_binary_sha or "",
            "devin_outposts_machine_name": name,
            "devin_outposts_machine_labels": spec.labels(),
        }

    async def _playbook(
        self,
        name: str,
        phase: str,
        playbook: str,
        variables: Mapping[str, Any],
        *,
        inventory: bool = False,
        hosts: Optional[Mapping[str, Mapping[str, Any]]] = None,
    ) -> _run.RunResult:
        return await _run.run(
            self.runner_command,
            artifact_root=self.artifact_dir / name,
            work_root=self.root / "runs",
            ident=self._ident(phase),
            env=self.env,
            extravars=variables,
            cmdline=self._cmdline(),
            timeout=self.timeouts[f"{phase}_timeout"],
            playbook=playbook,
            inventory=str(self.inventory) if inventory and self.inventory else None,
            inventory_hosts=hosts,
        )

    def _cmdline(self) -> Optional[str]:
        # ansible-runner puts these arguments before its own -e @env/extravars: the session's variables win.
        return f"-e @{shlex.quote(str(self.extra_vars_file))}" if self.extra_vars_file else None

    @staticmethod
    def _ident(phase: str) -> str:
        return f"{time.strftime('%Y%m%dT%H%M%S')}-{phase}-{secrets.token_hex(3)}"

    @staticmethod
    def _check_machine_fact(fact: Any) -> Optional[str]:
        if not isinstance(fact, dict) or not isinstance(fact.get("host"), str) or not fact["host"].strip():
            return (
                f"the provision playbook did not report its host: end it with ansible.builtin.set_stats of "
                f"{MACHINE_FACT}: {{host: <name>, vars: {{<connection variables>}}}}"
            )
        if not isinstance(fact.get("vars", {}), dict):
            return f"{MACHINE_FACT}.vars must be a mapping of connection variables"
        return None
