"""Running the stand-in ``devin-remote`` in tests without a worker (re-exported by ``testing``).

::

    claimed = claim_session(sim.url, machine_token, sid)  # connect token and gateway_url
    with standin_process(workdir, claimed, state_dir=tmp_path / "state") as remote:
        sim.admin.add_calls(sid, [tools.run("echo hi")])
        sim.admin.wait_calls(sid)
        sim.admin.end_session(sid)
        assert remote.wait(10) == 0
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional, Union

import httpx

from devin_outposts.api.models import QueueEntry
from devin_outposts_sim.remote import standin_path


def claim_session(url: str, token: str, session_id: str, acceptor_id: str = "test-acceptor") -> QueueEntry:
    """Claim (or renew) ``session_id`` through the fleet API; the answer holds the connect token and the
    ``gateway_url``. Raises ``httpx.HTTPStatusError`` on a refusal."""
    response = httpx.post(
        f"{url}/opbeta/outposts/devins/{session_id}/claim",
        json={"acceptor_id": acceptor_id},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    response.raise_for_status()
    return QueueEntry.model_validate(response.json())


#: What a worker passes through to ``devin-remote`` besides the ``DEVIN_*`` variables
#: (docs/fleet-api.md §6.2).
PASSTHROUGH = ("PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "LANG", "TZ")


class StandinProcess:
    """The stand-in ``devin-remote serve`` as a subprocess, with the spawn-contract environment.

    ``binary`` is an executable (a downloaded artifact, run through its shebang); by default the
    package's ``remote/standin.py`` is run with ``sys.executable``. stdout and stderr go to files.
    """

    def __init__(self, workdir: Union[str, Path], env: dict[str, str], binary: Optional[Path] = None) -> None:
        self.workdir = Path(workdir)
        self.env = env
        self.argv = [str(binary), "serve"] if binary else [sys.executable, str(standin_path()), "serve"]
        self._logs = Path(tempfile.mkdtemp(prefix="devin-standin-"))
        self._proc: Optional[subprocess.Popen[bytes]] = None

    def start(self) -> StandinProcess:
        with open(self._logs / "stdout", "wb") as out, open(self._logs / "stderr", "wb") as err:
            self._proc = subprocess.Popen(  # noqa: S603
                self.argv, cwd=self.workdir, env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=err
            )
        return self

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    @property
    def returncode(self) -> Optional[int]:
        return None if self._proc is None else self._proc.poll()

    def wait(self, timeout: float = 30.0) -> int:
        """The exit code; raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        assert self._proc is not None
        return self._proc.wait(timeout=timeout)

    def stop(self, timeout: float = 10.0) -> Optional[int]:
        """SIGTERM and wait (SIGKILL after ``timeout``); the exit code (None if never started)."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=timeout)
        return self._proc.returncode

    @property
    def stdout(self) -> str:
        return (self._logs / "stdout").read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return (self._logs / "stderr").read_text(errors="replace")


def standin_env(
    claimed: QueueEntry,
    *,
    state_dir: Optional[Union[str, Path]] = None,
    extra: Optional[dict[str, str]] = None,
) -> dict[str, str]:
    """The environment a worker gives ``devin-remote`` for a claim response (``extra`` overrides)."""
    env = {name: os.environ[name] for name in PASSTHROUGH if name in os.environ}
    env["DEVIN_OUTPOST_GATEWAY_URL"] = claimed.status.gateway_url or ""
    env["DEVIN_OUTPOST_CONNECT_TOKEN"] = claimed.connect_token_value() or ""
    env["DEVIN_OUTPOST_SESSION_ID"] = claimed.session_id
    if state_dir is not None:
        env["DEVIN_REMOTE_STATE_DIR"] = str(state_dir)
    env.update(extra or {})
    return env


@contextmanager
def standin_process(
    workdir: Union[str, Path],
    claimed: Optional[QueueEntry] = None,
    *,
    state_dir: Optional[Union[str, Path]] = None,
    env: Optional[dict[str, str]] = None,
    binary: Optional[Path] = None,
) -> Iterator[StandinProcess]:
    """Run the stand-in for a claim (or with exactly ``env``) for the block; stopped at its end."""
    if env is None:
        assert claimed is not None, "give a claim response or the whole environment"
        env = standin_env(claimed, state_dir=state_dir)
    remote = StandinProcess(workdir, env, binary).start()
    try:
        yield remote
    finally:
        remote.stop()
