"""What a session can see of its worker: not the worker's environment (the account token), but the proxy.

Sessions run as the worker's user. Without ``prctl(PR_SET_DUMPABLE, 0)`` any process of that user reads
``/proc/<worker pid>/environ``; these tests run a real ``devin-outposts worker start`` as ``nobody`` and
read that file as ``nobody``, next to a control process that did not hide its environment.

Start-up (issue 24, point 2): the environment was hidden only after the imports, 216 to 247 ms after the
start of the worker and 318 to 334 ms after that of ``orchestrate``. A reader of the same user, started
before the process and reading ``/proc/<pid>/maps`` and ``/proc/<pid>/environ`` in a tight loop from the
moment it exists, now finds:

* with the token in the environment: never the token once a slow import (pydantic's or ssl's extension
  module) is mapped, because the command line hides the environment before it imports anything slow;
  what remains is the interpreter's own start-up;
* with the token given on a file descriptor (``DEVIN_OUTPOSTS_TOKEN_FD``, the file root's and 0600):
  never the token at all, while the process does use it (it serves the simulator's outpost).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from devin_outposts.core import platform
from devin_outposts_sim.testing import run_sim

TOKEN = "cog_privacy_test_token_5c1f"
NOBODY = 65534
# The venv's interpreter lives under /root (pyenv) on our machines, which nobody cannot enter; Debian's own
# Python 3.11 can run the same code with the venv's site-packages (the package is installed editable).
SYSTEM_PYTHON = "/usr/bin/python3.11"


def _read_as_nobody(pid: int) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["/bin/cat", f"/proc/{pid}/environ"], capture_output=True, user=NOBODY, group=NOBODY, check=False
    )


def _wait(predicate: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def nobody_home() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root, to run the worker and the reader as nobody")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} (Debian's python3.11) is not installed")
    home = Path(tempfile.mkdtemp(prefix="devin-privacy-"))
    os.chown(home, NOBODY, NOBODY)
    yield home
    shutil.rmtree(home, ignore_errors=True)


def test_a_process_of_the_workers_user_cannot_read_the_workers_environment(nobody_home: Path) -> None:
    site_packages = sysconfig.get_paths()["purelib"]
    boot = (
        "import site, sys; site.addsitedir(sys.argv.pop(1)); "
        "from devin_outposts.cli import main; sys.argv[0] = 'devin-outposts'; sys.exit(main())"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(nobody_home),
        "DEVIN_OUTPOSTS_TOKEN": TOKEN,
        "DEVIN_API_URL": "http://127.0.0.1:9",  # nothing listens: the worker keeps retrying
    }
    log_path = nobody_home / "worker.log"
    args = ["worker", "start", "--outpost", "rhel", "--cache-dir", str(nobody_home / "data" / "cache"),
            "--workdir", str(nobody_home / "work"), "--backoff-max-secs", "0.3"]  # fmt: skip
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [SYSTEM_PYTHON, "-c", boot, site_packages, *args], env=env, stdout=log, stderr=subprocess.STDOUT,
            user=NOBODY, group=NOBODY,
        )  # fmt: skip
    control = subprocess.Popen(["/bin/sleep", "60"], env=env, user=NOBODY, group=NOBODY)
    try:
        _wait(lambda: "retrying in" in log_path.read_text(errors="replace"), "the worker to start and retry")
        assert worker.poll() is None, log_path.read_text(errors="replace")
        status = Path(f"/proc/{worker.pid}/status").read_text()
        assert f"Uid:\t{NOBODY}\t" in status  # the worker really runs as nobody

        # The control: a process of the same user that did not hide its environment is readable, token too.
        seen = _read_as_nobody(control.pid)
        assert seen.returncode == 0 and TOKEN.encode() in seen.stdout

        # The worker: the same reader is refused, and the file now belongs to root.
        refused = _read_as_nobody(worker.pid)
        assert refused.returncode != 0, "a process of the worker's user read its environment"
        assert b"Permission denied" in refused.stderr
        assert TOKEN.encode() not in refused.stdout
        assert os.stat(f"/proc/{worker.pid}/environ").st_uid == 0
    finally:
        for proc in (worker, control):
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert TOKEN not in log_path.read_text(errors="replace")


#: Reads ``/proc/<pid>/maps`` and then ``/proc/<pid>/environ`` in a tight loop (as ``nobody``), from the
#: moment it is given the pid until a stop file exists, and prints what it saw as JSON. A token read after a
#: slow module was seen mapped means the environment was still readable when that import had happened.
READER = r"""
import json, os, sys
print("ready", flush=True)
pid = int(sys.stdin.readline())
marker, stop = sys.argv[1].encode(), sys.argv[2]
names = ("loops", "maps_reads", "environ_reads", "token_reads", "token_reads_after_slow_imports")
seen = dict.fromkeys(names, 0)
while not os.path.exists(stop):
    seen["loops"] += 1
    slow = False
    try:
        with open("/proc/%d/maps" % pid, "rb") as f:
            maps = f.read()
        seen["maps_reads"] += 1
        slow = b"_pydantic_core" in maps or b"/_ssl." in maps
    except OSError:
        pass
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            environ = f.read()
    except OSError:
        continue
    seen["environ_reads"] += 1
    if marker in environ:
        seen["token_reads"] += 1
        seen["token_reads_after_slow_imports"] += slow
print(json.dumps(seen), flush=True)
"""
BOOT = (
    "import site, sys; site.addsitedir(sys.argv.pop(1)); "
    "from devin_outposts.cli import main; sys.argv[0] = 'devin-outposts'; sys.exit(main())"
)


def watched_start(
    home: Path, marker: str, args: list[str], env: dict[str, str], stdin: Optional[int] = None
) -> tuple[subprocess.Popen[bytes], Path, Any]:
    """Start ``devin-outposts ARGS`` as nobody, watched from its first moment by :data:`READER` (as nobody
    too). Returns the process, its log and a function that stops the reader and returns what it saw."""
    stop = home / "stop-reader"
    reader = subprocess.Popen(
        [SYSTEM_PYTHON, "-I", "-S", "-c", READER, marker, str(stop)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, user=NOBODY, group=NOBODY,
    )  # fmt: skip
    assert reader.stdin is not None and reader.stdout is not None
    assert reader.stdout.readline().strip() == b"ready"
    log_path = home / "process.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [SYSTEM_PYTHON, "-c", BOOT, sysconfig.get_paths()["purelib"], *args], env=env, stdin=stdin,
            stdout=log, stderr=subprocess.STDOUT, user=NOBODY, group=NOBODY,
        )  # fmt: skip
    reader.stdin.write(f"{process.pid}\n".encode())
    reader.stdin.flush()

    def seen() -> dict[str, int]:
        stop.touch()
        out = reader.communicate(timeout=30)[0]
        return dict(json.loads(out.decode().splitlines()[-1]))

    return process, log_path, seen


def wait_running(process: subprocess.Popen[bytes], log_path: Path, text: str, what: str) -> None:
    """Wait until ``text`` is in the log; fail at once, with the log, if the process exits."""
    try:
        _wait(lambda: process.poll() is not None or text in log_path.read_text(errors="replace"), what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n{log_path.read_text(errors='replace')[-3000:]}") from None
    log = log_path.read_text(errors="replace")[-3000:]
    assert process.poll() is None, f"exit {process.returncode}:\n{log}"


def stop_process(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def command_args(command: str, home: Path, sim_url: str) -> list[str]:
    if command == "worker":
        return ["worker", "start", "--outpost", "rhel", "--cache-dir", str(home / "data" / "cache"),
                "--workdir", str(home / "work"), "--backoff-max-secs", "0.3"]  # fmt: skip
    return ["orchestrate", "--outpost", "rhel", "--driver", "process", "--state-dir", str(home / "state"),
            "--backoff-max-secs", "0.3", "--static-base-url", f"{sim_url}/static/"]  # fmt: skip


@pytest.mark.parametrize("command", ["worker", "orchestrate"])
def test_the_environment_is_hidden_before_anything_slow_is_imported(nobody_home: Path, command: str) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(nobody_home),
        "DEVIN_OUTPOSTS_TOKEN": TOKEN,
        "DEVIN_API_URL": "http://127.0.0.1:9",
    }  # fmt: skip  (nothing listens: it keeps retrying)
    args = command_args(command, nobody_home, "http://127.0.0.1:9")
    process, log_path, seen = watched_start(nobody_home, TOKEN, args, env)
    try:
        wait_running(process, log_path, "retrying in", f"{command} to start and retry")
    finally:
        saw = seen()
        stop_process(process)
    # The reader was running before the process and read its files from the moment it existed.
    assert saw["token_reads_after_slow_imports"] == 0, f"{command}: readable after slow imports: {saw}"
    assert TOKEN not in log_path.read_text(errors="replace")


@pytest.mark.parametrize("command", ["worker", "orchestrate"])
def test_a_token_given_on_a_file_descriptor_is_never_in_the_environment(
    nobody_home: Path, command: str
) -> None:
    with run_sim(claim_ttl=20, keepalive_interval=0.5, sweep_interval=0.05) as sim:
        sim.admin.create_outpost("rhel", "linux")
        token = sim.create_token("machine" if command == "worker" else "orchestrator")
        token_file = nobody_home.parent / f"{nobody_home.name}.token"  # root's, 0600: nobody cannot open it
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(nobody_home), "DEVIN_API_URL": sim.url,
               "DEVIN_OUTPOSTS_TOKEN_FD": "0"}  # fmt: skip
        with open(token_file, "rb") as stdin:  # opened here, as root: what systemd's StandardInput=file: does
            process, log_path, seen = watched_start(
                nobody_home, token, command_args(command, nobody_home, sim.url), env, stdin=stdin.fileno()
            )
        try:
            wait_running(process, log_path, "serving outpost rhel", f"{command} to serve")
            cat = ["/bin/cat", str(token_file)]
            refused = subprocess.run(cat, capture_output=True, user=NOBODY, check=False)
            assert refused.returncode != 0 and token.encode() not in refused.stdout
        finally:
            saw = seen()
            stop_process(process)
            token_file.unlink()
    assert saw["token_reads"] == 0, f"{command}: the token was in its environment: {saw}"
    log = log_path.read_text(errors="replace")
    assert token not in log
    assert "Traceback" not in log


def test_hide_environment_is_linux_only() -> None:
    assert platform.Posix("darwin", "arm64").hide_environment() is False


def test_sessions_get_proxy_settings_without_credentials() -> None:
    source = {
        "PATH": "/usr/bin",
        "HTTPS_PROXY": "http://proxy.corp.example:3128",
        "no_proxy": "localhost,.corp.example",
        "HTTP_PROXY": "http://alice:s3cret@proxy.corp.example:3128",
        "http_proxy": "alice:s3cret@proxy.corp.example:3128",
        "ALL_PROXY": "",
        "DEVIN_OUTPOSTS_TOKEN": TOKEN,
    }
    env = platform.Posix("linux", "x86_64").inherited_env(source)
    assert env == {
        "PATH": "/usr/bin",
        "HTTPS_PROXY": "http://proxy.corp.example:3128",
        "no_proxy": "localhost,.corp.example",
    }
