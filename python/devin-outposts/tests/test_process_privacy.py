"""What a session can see of its worker: not the worker's environment (the account token), but the proxy.

Sessions run as the worker's user. Without ``prctl(PR_SET_DUMPABLE, 0)`` any process of that user reads
``/proc/<worker pid>/environ``; these tests run a real ``devin-outposts worker start`` as ``nobody`` and
read that file as ``nobody``, next to a control process that did not hide its environment.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devin_outposts.worker import platform

TOKEN = "cog_privacy_test_token_5c1f"
NOBODY = 65534
# The venv's interpreter lives under /root (pyenv) on our machines, which nobody cannot enter; Debian's own
# Python 3.11 can run the same code with the venv's site-packages (the package is installed editable).
SYSTEM_PYTHON = "/usr/bin/python3.11"


def _read_as_nobody(pid: int) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["cat", f"/proc/{pid}/environ"], capture_output=True, user=NOBODY, group=NOBODY, check=False)


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
    os.chmod(home, 0o755)
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
    control = subprocess.Popen(["sleep", "60"], env=env, user=NOBODY, group=NOBODY)
    try:
        _wait(lambda: "retrying in" in log_path.read_text(errors="replace"), "the worker to start and retry")
        assert worker.poll() is None, log_path.read_text(errors="replace")
        status = Path(f"/proc/{worker.pid}/status").read_text()
        assert f"Uid:\t{NOBODY}\t" in status  # the worker really runs as nobody

        # The control: a process of the same user that did not hide its environment is readable, token and all.
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
