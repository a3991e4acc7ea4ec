# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""Wine for the windows stage: one prefix, its server, and Windows programs run the way that works.

What it takes to run services under Wine 8 (found by trying; docs/windows.md, "Under Wine in CI"):

* the prefix is made once with ``wineboot --init`` (scripts/windows/setup.sh); each run works on a copy of it;
* ``wineserver -p`` keeps the server up: without it Wine ends its services when the last ordinary Wine
  process exits. The first program then starts ``services.exe`` (only one: a ``wineboot --init`` here would
  start a second one, and the two refuse each other's requests with "service database locked" or error 1053);
* Windows programs get no terminal input, and their output through a pipe: with a plain file as its standard
  handles, CPython fails at start ("init_sys_streams: Invalid handle"). The first program's pipe is inherited by
  ``services.exe`` and every service it starts, so it is read into a log file for as long as they live; later
  programs' pipes are read until the program ends;
* ``wineserver -k`` ends it all.

The environment Wine gets is built here, from nothing but what it needs: no token, no pip settings (pip under
Wine would read this machine's ``PIP_*``), and nothing that could reach a service by accident.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path, PureWindowsPath
from typing import Any, Optional

from prerequisites import ROOT, cannot_run  # type: ignore[import-not-found]

#: The same place scripts/windows/setup.sh provisions (DEVIN_OUTPOSTS_WINDOWS_CACHE overrides both).
CACHE = Path(os.environ.get("DEVIN_OUTPOSTS_WINDOWS_CACHE") or ROOT / ".cache" / "windows")
TEMPLATE = CACHE / "prefix"
STAMP = TEMPLATE / ".devin-outposts-stamp"
WHEELS = CACHE / "wheels-cp311"
STANDIN_EXE = CACHE / "build" / "devin-remote-standin.exe"
BASE_PYTHON = r"C:\Python311\python.exe"
#: Where the stand-in launcher looks for the stand-in script (scripts/windows/setup.sh, STANDIN_SCRIPT).
STANDIN_SCRIPT = r"C:\devin-outposts-standin\standin.py"


def require_setup() -> None:
    """Skip (fail in CI) when scripts/windows/setup.sh has not run."""
    for tool in ("wine", "wineserver"):
        if shutil.which(tool) is None:
            cannot_run(f"{tool} is not installed (scripts/windows/setup.sh installs it)")
    for path in (STAMP, WHEELS, STANDIN_EXE):
        if not path.exists():
            cannot_run(f"{path} is missing: run scripts/windows/setup.sh")


def _drain(stream: Any, sink: Any, lock: threading.Lock) -> None:
    for chunk in iter(lambda: stream.read1(65536), b""):
        with lock:
            sink.write(chunk)
            sink.flush()


class Wine:
    """A Wine prefix copied from the template, with its own persistent server."""

    def __init__(self, prefix: Path, log_dir: Path) -> None:
        self.prefix = prefix
        self.log_dir = log_dir
        self.env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(prefix.parent),
            "WINEPREFIX": str(prefix),
            "WINEDEBUG": "-all",
            "LANG": "C.UTF-8",
        }
        self._boot_log: Optional[Any] = None

    @classmethod
    def copy_of_template(cls, where: Path) -> Wine:
        """A fresh prefix: a copy of the template. The Windows system and Python folders (most of its 700 MB) are
        hard links, because nothing edits them; the registry files, which the server rewrites in place, and the
        small folders a program may write to are real copies."""
        prefix = where / "prefix"
        subprocess.run(["cp", "-al", str(TEMPLATE), str(prefix)], check=True)
        for path in prefix.iterdir():
            if path.is_file():
                path.unlink()
                shutil.copy2(TEMPLATE / path.name, path)
        for name in ("users", "ProgramData", "Program Files", "Program Files (x86)"):
            shutil.rmtree(prefix / "drive_c" / name)
            shutil.copytree(TEMPLATE / "drive_c" / name, prefix / "drive_c" / name, symlinks=True)
        return cls(prefix, where)

    def path(self, windows_path: str) -> Path:
        """The Linux path of a ``C:\\...`` path in this prefix."""
        parts = PureWindowsPath(windows_path).parts
        assert parts[0].upper() == "C:\\", windows_path
        return self.prefix.joinpath("drive_c", *parts[1:])

    def start(self) -> None:
        """Start the server (persistent) and the service manager, whose output goes to services.log."""
        subprocess.run(["wineserver", "-p"], env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=True)  # fmt: skip
        self._boot_log = (self.log_dir / "services.log").open("ab")
        first = subprocess.Popen(["wine", "cmd", "/c", "exit"], env=self.env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        threading.Thread(
            target=_drain, args=(first.stdout, self._boot_log, threading.Lock()), daemon=True
        ).start()
        first.wait(timeout=120)

    def stop(self) -> None:
        subprocess.run(["wineserver", "-k"], env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)  # fmt: skip
        subprocess.run(["wineserver", "-w"], env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False, timeout=60)  # fmt: skip
        if self._boot_log is not None:
            self._boot_log.close()

    def run(
        self, *argv: str, timeout: float = 180, check: bool = True, stdin: Optional[bytes] = None
    ) -> tuple[int, str]:
        """Run a Windows program to its end: its exit code and its output (stdout and stderr). ``stdin`` is
        written to a pipe that is then closed (as ansible.windows.win_command's ``stdin`` does)."""
        proc = subprocess.Popen(["wine", *argv], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE)  # fmt: skip
        if stdin is not None and proc.stdin is not None:
            proc.stdin.write(stdin)
            proc.stdin.close()
        out = bytearray()
        reader = threading.Thread(
            target=lambda: out.extend(proc.stdout.read() if proc.stdout else b""), daemon=True
        )
        reader.start()
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        # A program that started another one hands it the pipe: what was written until now is enough.
        reader.join(5)
        text = bytes(out).decode("utf-8", "replace").replace("\r\n", "\n")
        if check and code != 0:
            raise AssertionError(f"wine {' '.join(argv)} exited with {code}:\n{text}")
        return code, text

    def python(self, *argv: str, python: str = BASE_PYTHON, **kwargs: Any) -> tuple[int, str]:
        return self.run(python, *argv, **kwargs)

    def probe(self, python: str, *argv: str, timeout: float = 180) -> list[dict[str, Any]]:
        """The JSON lines of tests/windows/scm_probe.py (copied into the prefix by the fixture)."""
        dummy, text = self.run(
            python, r"C:\devin-outposts-tests\scm_probe.py", *argv, timeout=timeout, check=False
        )
        rows = []
        for line in text.splitlines():
            if line.startswith("{"):
                rows.append(json.loads(line))
        assert rows, text
        return rows
