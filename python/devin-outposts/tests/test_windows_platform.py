"""The worker's Windows code paths on Linux, with the platform switched (core/platform/windows.py and what
uses it).

Environment building, path checks and spelling, session-id sanitising against Windows' naming rules, the
``windows_x64.exe`` remote's URLs, the ``msvcrt`` lock (with a fake ``msvcrt`` that keeps byte-range locks
the way Windows does), and the stop signals. How a remote is stopped is in test_windows_stop.py. The real
Windows APIs never run here (docs/windows-worker.md, "What has run, and what has not").
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import re
import signal
import types
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from devin_outposts.core import platform
from devin_outposts.core.config import ConfigError
from devin_outposts.core.identity import FileLock, LockedError
from devin_outposts.core.paths import safe_component
from devin_outposts.core.platform import windows as windows_platform
from devin_outposts.worker import spawn
from devin_outposts.worker.binary import BinaryStore, VerificationError, platform_suffix
from devin_outposts.worker.options import parse_start_args

TOKEN = "cog_windows_account_token_value"
SYSTEM_ROOT = "C:\\Windows"


def windows(machine_env: dict[str, str] | None = None, **kwargs: Any) -> platform.Windows:
    return platform.Windows(machine="AMD64", machine_env=lambda: dict(machine_env or {}), **kwargs)


# --- the session's environment -------------------------------------------------------------------------

MACHINE_ENV = {
    "ComSpec": "C:\\Windows\\system32\\cmd.exe",
    "Path": "C:\\Windows\\system32;C:\\Windows;C:\\Program Files\\Git\\cmd",
    "PATHEXT": ".COM;.EXE;.BAT;.CMD",
    "JAVA_HOME": "C:\\Program Files\\Java\\jdk-21",
    "TEMP": "C:\\Windows\\TEMP",
    "GITHUB_TOKEN": "ghp_machine_wide_secret",
    "AWS_SECRET_ACCESS_KEY": "machine-secret",
    "DEVIN_WORKER_MAX_SESSIONS": "4",
    "HTTPS_PROXY": "http://proxy.corp:3128",
    "HTTP_PROXY": "http://user:pa55@proxy.corp:3128",
    "Empty": "",
}
#: The service's process: the per-process variables, plus what the service host loaded from worker.env.
PROCESS_ENV = {
    "SystemRoot": SYSTEM_ROOT,
    "COMPUTERNAME": "WIN-BOX",
    "USERPROFILE": "C:\\Windows\\ServiceProfiles\\devin-outposts-worker-a",
    "TEMP": "C:\\Windows\\ServiceProfiles\\devin-outposts-worker-a\\AppData\\Local\\Temp",
    "PATH": "C:\\ProgramData\\devin-outposts\\a\\venv\\Lib\\site-packages\\pywin32_system32;"
    "C:\\Windows\\system32;C:\\Windows;C:\\Program Files\\Git\\cmd",
    "DEVIN_OUTPOSTS_TOKEN": TOKEN,
    "DEVIN_OUTPOSTS_WORKER_OUTPOST": "win",
    "DEVIN_API_URL": "https://api.devin.ai",
    "WORKER_EXTRA_FROM_ENV_FILE": "not system",
    "http_proxy": "http://proxy.worker:3128",
}


def test_a_windows_session_gets_the_system_environment_without_secrets(tmp_path: Path) -> None:
    with platform.use(windows(MACHINE_ENV)):
        env = spawn.build_session_env(
            gateway_url="wss://gw.example",
            connect_token="ct_connect",
            session_id="devin-1",
            state_dir=tmp_path,
            pty_bridge_port=4242,
            chrome_path="C:\\Program Files\\Google\\Chrome\\Application\\chrome.exe",
            source=PROCESS_ENV,
        )
    upper = {name.upper(): value for name, value in env.items()}
    assert len(upper) == len(env)  # one spelling per variable, as Windows has it
    # The machine-wide variables, and the per-process ones from the worker's process (which win).
    assert upper["JAVA_HOME"] == MACHINE_ENV["JAVA_HOME"]
    assert upper["COMSPEC"] == MACHINE_ENV["ComSpec"]
    assert upper["PATHEXT"] == MACHINE_ENV["PATHEXT"]
    assert upper["SYSTEMROOT"] == SYSTEM_ROOT
    assert upper["COMPUTERNAME"] == "WIN-BOX"
    assert upper["TEMP"] == PROCESS_ENV["TEMP"]
    assert upper["HTTPS_PROXY"] == "http://proxy.corp:3128"
    # PATH without the launcher's pywin32 DLL directory.
    assert upper["PATH"] == "C:\\Windows\\system32;C:\\Windows;C:\\Program Files\\Git\\cmd"
    # Never: the token, credential-looking names, the worker's options, a proxy with a password, what the
    # service host loaded from worker.env, empty values.
    for gone in (
        "DEVIN_OUTPOSTS_TOKEN", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "DEVIN_WORKER_MAX_SESSIONS",
        "DEVIN_OUTPOSTS_WORKER_OUTPOST", "DEVIN_API_URL", "HTTP_PROXY", "WORKER_EXTRA_FROM_ENV_FILE", "EMPTY",
    ):  # fmt: skip
        assert gone not in upper, gone
    assert TOKEN not in env.values() and "ghp_machine_wide_secret" not in env.values()
    assert "pa55" not in " ".join(env.values())
    # The spawn contract's variables, set by the worker.
    assert env["DEVIN_OUTPOST_GATEWAY_URL"] == "wss://gw.example"
    assert env["DEVIN_OUTPOST_CONNECT_TOKEN"] == "ct_connect"
    assert env["DEVIN_OUTPOST_SESSION_ID"] == "devin-1"
    assert env["DEVIN_REMOTE_STATE_DIR"] == str(tmp_path)
    assert env["DEVIN_PTY_BRIDGE_PORT"] == "4242"
    assert env["DEVIN_CHROME_PATH"].endswith("chrome.exe")
    devin = {name for name in env if name.upper().startswith("DEVIN_")}
    assert devin == {
        "DEVIN_OUTPOST_GATEWAY_URL", "DEVIN_OUTPOST_CONNECT_TOKEN", "DEVIN_OUTPOST_SESSION_ID",
        "DEVIN_REMOTE_STATE_DIR", "DEVIN_PTY_BRIDGE_PORT", "DEVIN_CHROME_PATH",
    }  # fmt: skip


def test_a_session_variable_in_the_machine_env_cannot_override_the_spawn_contract(tmp_path: Path) -> None:
    machine = {"devin_outpost_session_id": "forged", "DEVIN_REMOTE_STATE_DIR": "C:\\shared", "Path": "C:\\x"}
    with platform.use(windows(machine)):
        env = spawn.build_session_env(
            gateway_url="wss://gw", connect_token="ct", session_id="real", state_dir=tmp_path,
            pty_bridge_port=1, source={},
        )  # fmt: skip
    assert [name for name in env if name.upper() == "DEVIN_OUTPOST_SESSION_ID"] == [
        "DEVIN_OUTPOST_SESSION_ID"
    ]
    assert env["DEVIN_OUTPOST_SESSION_ID"] == "real"
    assert env["DEVIN_REMOTE_STATE_DIR"] == str(tmp_path)


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("GITHUB_TOKEN", True), ("NPM_TOKEN", True), ("DB_PASSWORD", True), ("MY_SECRET", True),
        ("OPENAI_API_KEY", True), ("AZURE_CLIENT_SECRET", True), ("SSH_PRIVATE_KEY", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True), ("AWS_ACCESS_KEY_ID", True),
        ("PATH", False), ("JAVA_HOME", False), ("PROCESSOR_IDENTIFIER", False), ("TOKENIZERS", True),
    ],
)  # fmt: skip
def test_secret_names(name: str, secret: bool) -> None:
    assert platform.is_secret_name(name) is secret
    assert platform.is_secret_name(name.lower()) is secret


def test_the_registry_reader_is_empty_off_windows() -> None:
    assert windows_platform._read_machine_env() == {}


class FakeRegistryKey:
    """An open registry key: a context manager and nothing else."""

    def __enter__(self) -> FakeRegistryKey:
        return self

    def __exit__(self, *args: object) -> None:
        return None


def fake_winreg(values: list[tuple[str, object, int]], *, readable: bool = True) -> types.ModuleType:
    """``winreg`` as far as the reader uses it: one key, its values in order, %VAR% expansion."""
    module = types.ModuleType("winreg")
    module.HKEY_LOCAL_MACHINE = 0x80000002  # type: ignore[attr-defined]
    module.REG_SZ, module.REG_EXPAND_SZ, module.REG_DWORD = 1, 2, 4  # type: ignore[attr-defined]
    opened: list[tuple[int, str]] = []

    def open_key(root: int, path: str) -> FakeRegistryKey:
        opened.append((root, path))
        if not readable:
            raise PermissionError(5, "Access is denied")
        return FakeRegistryKey()

    def enum_value(key: FakeRegistryKey, index: int) -> tuple[str, object, int]:
        if index >= len(values):
            raise OSError(259, "No more data is available")
        return values[index]

    def expand(text: str) -> str:
        return text.replace("%SystemRoot%", SYSTEM_ROOT)

    module.OpenKey = open_key  # type: ignore[attr-defined]
    module.EnumValue = enum_value  # type: ignore[attr-defined]
    module.ExpandEnvironmentStrings = expand  # type: ignore[attr-defined]
    module.opened = opened  # type: ignore[attr-defined]
    return module


def test_the_registry_reader_expands_reg_expand_sz_and_skips_other_types() -> None:
    registry = fake_winreg(
        [
            ("Path", "%SystemRoot%\\system32;%SystemRoot%", 2),
            ("ComSpec", "%SystemRoot%\\system32\\cmd.exe", 2),
            ("JAVA_HOME", "C:\\Java\\%NOT_EXPANDED%", 1),
            ("NUMBER_OF_PROCESSORS", 8, 4),
        ]
    )
    env = windows_platform._read_machine_env(registry)
    assert env == {
        "Path": "C:\\Windows\\system32;C:\\Windows",
        "ComSpec": "C:\\Windows\\system32\\cmd.exe",
        "JAVA_HOME": "C:\\Java\\%NOT_EXPANDED%",  # REG_SZ is taken as it is
    }
    assert registry.opened == [(0x80000002, platform.WINDOWS_ENVIRONMENT_KEY)]  # type: ignore[attr-defined]
    assert platform.WINDOWS_ENVIRONMENT_KEY.endswith("\\Control\\Session Manager\\Environment")
    assert windows_platform._read_machine_env(fake_winreg([], readable=False)) == {}


# --- session ids as Windows file names -----------------------------------------------------------------

_WINDOWS_FORBIDDEN = re.compile(r'[<>:"/\\|?*\x00-\x1f]')
_RESERVED = {"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"} | {
    f"{p}{i}" for p in ("COM", "LPT") for i in range(10)
}


def windows_accepts(name: str) -> bool:
    """Windows' own rules for one path component (what CreateFileW would take as an ordinary file)."""
    return (
        0 < len(name) <= 255
        and not _WINDOWS_FORBIDDEN.search(name)
        and not name.endswith((".", " "))
        and name.split(".", 1)[0].rstrip(" ").upper() not in _RESERVED
        and name not in (".", "..")
    )


@pytest.mark.parametrize(
    "hostile",
    [
        "CON", "con", "Con.txt", "NUL", "nul.tar.gz", "COM1", "com9.log", "LPT1", "lpt0", "AUX", "PRN",
        "CONIN$", "CONOUT$", "devin-1.", "devin-1 ", "devin-1. .", "a:b", "C:", "C:\\Windows", "a<b>c", 'a"b',
        "a|b", "a?b", "a*b", "a\tb", " leading", "..", "...", "COM¹", "\\\\?\\C:\\x", "x" * 300,
        "devin-1:stream",
    ],
)  # fmt: skip
def test_session_ids_become_names_windows_accepts(hostile: str) -> None:
    component = safe_component(hostile)
    assert windows_accepts(component), component
    assert component.startswith("_")  # encoded, so no two ids share it
    assert len(component) <= 100


def test_real_ids_are_kept_and_reserved_lookalikes_are_not() -> None:
    assert safe_component("devin-0123abcd") == "devin-0123abcd"
    assert safe_component("CONSOLE") == "CONSOLE"  # not a device name
    assert safe_component("COM10") == "COM10"
    assert safe_component("CON") != safe_component("con")


# --- configured directories: drive letters, UNC shares, long paths -------------------------------------


@pytest.mark.parametrize(
    ("raw", "spelt"),
    [
        (
            "C:\\ProgramData\\devin-outposts\\a\\state\\cache",
            "C:\\ProgramData\\devin-outposts\\a\\state\\cache",
        ),
        ("d:/devin/state/../state/./cache", "D:\\devin\\state\\cache"),
        ("  E:\\x\\  ", "E:\\x"),
        ("\\\\files\\share\\devin\\state", "\\\\files\\share\\devin\\state"),
        ("\\\\?\\C:\\already\\verbatim", "\\\\?\\C:\\already\\verbatim"),
    ],
)
def test_state_paths_with_drive_letters_and_shares(raw: str, spelt: str) -> None:
    assert platform.windows_state_path(raw) == spelt


@pytest.mark.parametrize("raw", ["D:state", "\\state", "state", "relative\\dir", "", "C:", "C:\\a\x00b"])
def test_state_paths_relative_to_a_drive_or_the_current_directory_are_refused(raw: str) -> None:
    with pytest.raises(ValueError, match=r"absolute Windows path|NUL"):
        platform.windows_state_path(raw)


def test_long_state_paths_get_the_verbatim_prefix_and_long_workdirs_are_refused() -> None:
    deep = "C:\\" + "\\".join(["d" * 20] * 6)  # 128 characters
    assert len(deep) + platform.WINDOWS_STATE_HEADROOM >= platform.WINDOWS_DIR_LIMIT
    assert platform.windows_state_path(deep) == "\\\\?\\" + deep
    assert platform.windows_state_path(deep.replace("\\", "/")) == "\\\\?\\" + deep
    share = "\\\\files\\share\\" + "\\".join(["d" * 20] * 6)
    assert platform.windows_state_path(share) == "\\\\?\\UNC\\files\\share\\" + "\\".join(["d" * 20] * 6)
    short = "C:\\devin\\state"
    assert platform.windows_state_path(short) == short
    assert (
        platform.windows_state_path(deep, headroom=platform.WINDOWS_WORKDIR_HEADROOM, verbatim=False) == deep
    )
    with pytest.raises(ValueError, match="too long"):
        platform.windows_state_path(
            "C:\\" + "w" * 240, headroom=platform.WINDOWS_WORKDIR_HEADROOM, verbatim=False
        )


def test_worker_options_on_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROGRAMDATA", "C:\\ProgramData")
    monkeypatch.setenv("USERPROFILE", "C:\\Users\\svc")
    env = {"DEVIN_OUTPOSTS_TOKEN": TOKEN}
    with platform.use(windows()):
        config = parse_start_args(
            [
                "--outpost",
                "w",
                "--cache-dir",
                "%PROGRAMDATA%\\devin-outposts\\a\\state\\cache",
                "--workdir",
                "d:/work",
            ],
            env,
        )
        assert str(config.cache_dir) == "C:\\ProgramData\\devin-outposts\\a\\state\\cache"
        assert str(config.workdir) == "D:\\work"
        home = parse_start_args(["--outpost", "w", "--cache-dir", "~\\.devin\\worker\\cache"], env)
        assert str(home.cache_dir) == "C:\\Users\\svc\\.devin\\worker\\cache"
        with pytest.raises(ConfigError, match="--cache-dir: 'D:state' is not an absolute Windows path"):
            parse_start_args(["--outpost", "w", "--cache-dir", "D:state"], env)
        with pytest.raises(ConfigError, match="--workdir"):
            parse_start_args(["--outpost", "w"], {**env, "DEVIN_WORKER_WORKDIR": "\\work"})


# --- the windows_x64.exe remote ------------------------------------------------------------------------


class Dist:
    """The distribution endpoints for httpx.MockTransport; records the paths asked for."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.asked: list[str] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        name = request.url.path.rsplit("/", 1)[1]
        self.asked.append(name)
        if name in self.files:
            return httpx.Response(200, content=self.files[name])
        return httpx.Response(404)


def published(sha: str, binary: bytes, latest_names: tuple[str, ...]) -> dict[str, bytes]:
    name = f"devin-remote_{sha}_windows_x64.exe"
    files = {name: binary, f"{name}.sha256": hashlib.sha256(binary).hexdigest().encode() + b"\n"}
    for latest in latest_names:
        files[latest] = f"{sha}\n".encode()
    return files


def fetch(tmp_path: Path, dist: Dist, call: Callable[[BinaryStore], Any]) -> Any:
    async def scenario() -> Any:
        http = httpx.AsyncClient(transport=httpx.MockTransport(dist.handle))
        store = BinaryStore(tmp_path / "cache", "https://static.example/devin-rs/remote/", http=http)
        try:
            return await call(store)
        finally:
            await http.aclose()

    with platform.use(windows()):
        return asyncio.run(scenario())


def test_the_windows_suffix() -> None:
    with platform.use(windows()):
        assert platform_suffix() == "windows_x64.exe"
    assert platform.Windows(machine="ARM64").name == "windows"


def test_latest_is_tried_with_exe_first_then_without(tmp_path: Path) -> None:
    binary = b"MZ fake windows remote"
    dist = Dist(published("abc1234", binary, ("latest_windows_x64",)))

    async def both(store: BinaryStore) -> tuple[str, Path]:
        sha = await store.latest_sha()
        return sha, await store.ensure(sha)

    sha, path = fetch(tmp_path, dist, both)
    assert sha == "abc1234"
    assert dist.asked[:2] == ["latest_windows_x64.exe", "latest_windows_x64"]
    assert path.name == "devin-remote_abc1234_windows_x64.exe"
    assert path.read_bytes() == binary
    assert "devin-remote_abc1234_windows_x64.exe.sha256" in dist.asked


def test_latest_with_the_exe_name_wins_when_published(tmp_path: Path) -> None:
    dist = Dist(published("abc1234", b"x", ("latest_windows_x64.exe",)))
    dist.files["latest_windows_x64"] = b"def5678\n"
    assert fetch(tmp_path, dist, lambda store: store.latest_sha()) == "abc1234"
    assert dist.asked == ["latest_windows_x64.exe"]


def test_a_windows_binary_that_does_not_match_its_checksum_is_refused(tmp_path: Path) -> None:
    dist = Dist(published("abc1234", b"genuine", ()))
    dist.files["devin-remote_abc1234_windows_x64.exe"] = b"tampered"
    with pytest.raises(VerificationError):
        fetch(tmp_path, dist, lambda store: store.ensure("abc1234"))
    assert not list((tmp_path / "cache").iterdir())


# --- the lock ------------------------------------------------------------------------------------------


def fake_msvcrt() -> types.ModuleType:
    """``msvcrt.locking`` as Windows behaves: byte-range locks on a file, held per open handle (here: per
    file descriptor, standing for a process), from the file's current position, refused without waiting
    under LK_NBLCK, and an unlock must name a region the same handle locked."""
    held: dict[tuple[int, int, int], int] = {}  # (device, inode, offset) -> fd

    def locking(fd: int, mode: int, nbytes: int) -> None:
        info = os.fstat(fd)
        key = (info.st_dev, info.st_ino, os.lseek(fd, 0, os.SEEK_CUR))
        if mode == module.LK_NBLCK:
            if key in held:
                raise OSError(errno.EACCES, "Permission denied")
            held[key] = fd
        elif mode == module.LK_UNLCK:
            if held.get(key) != fd:
                raise OSError(errno.EACCES, "Permission denied")
            del held[key]
        else:
            raise AssertionError(f"unexpected mode {mode}")

    module = types.ModuleType("msvcrt")
    module.LK_UNLCK, module.LK_LOCK, module.LK_NBLCK = 0, 1, 2  # type: ignore[attr-defined]
    module.locking = locking  # type: ignore[attr-defined]
    module.held = held  # type: ignore[attr-defined]
    return module


def test_the_windows_lock_refuses_a_second_holder_and_is_released_on_close(tmp_path: Path) -> None:
    msvcrt = fake_msvcrt()
    path = tmp_path / "data" / "worker.lock"
    with platform.use(windows(msvcrt_module=msvcrt)):
        first = FileLock(path, "the worker data directory").acquire()
        assert path.read_text() == f"{os.getpid()}\n"
        with pytest.raises(LockedError, match="another worker is already using the worker data directory"):
            FileLock(path, "the worker data directory").acquire()
        assert len(msvcrt.held) == 1  # type: ignore[attr-defined]
        first.release()
        assert msvcrt.held == {}  # type: ignore[attr-defined]
        with FileLock(path, "the worker data directory"):
            assert len(msvcrt.held) == 1  # type: ignore[attr-defined]
        assert msvcrt.held == {}  # type: ignore[attr-defined]


def test_the_windows_lock_needs_msvcrt() -> None:
    with pytest.raises(OSError, match="msvcrt"), open(os.devnull, "rb") as handle:
        windows().lock(handle)


# --- Ctrl-C, Ctrl-Break and the stop handler -----------------------------------------------------------


def test_ctrl_break_is_a_stop_signal_where_the_signal_module_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signal, "SIGBREAK", 21, raising=False)
    assert 21 in windows().stop_signals()
    assert signal.SIGINT in windows().stop_signals()


def test_without_loop_signal_handlers_the_stop_signals_go_through_signal_and_are_put_back() -> None:
    class ProactorLike:
        """Windows' proactor loop: no add_signal_handler."""

        def __init__(self) -> None:
            self.calls: list[tuple[Any, tuple[Any, ...]]] = []

        def add_signal_handler(self, *args: Any) -> None:
            raise NotImplementedError

        def remove_signal_handler(self, signum: int) -> bool:
            raise NotImplementedError

        def call_soon_threadsafe(self, callback: Any, *args: Any) -> None:
            self.calls.append((callback, args))

    before = signal.getsignal(signal.SIGTERM)
    host = windows()
    loop = ProactorLike()
    received: list[int] = []
    host.install_stop_handler(loop, received.append)  # type: ignore[arg-type]
    try:
        assert signal.getsignal(signal.SIGTERM) is not before
        signal.raise_signal(signal.SIGTERM)
        assert loop.calls == [(received.append, (signal.SIGTERM,))]
    finally:
        host.remove_stop_handler(loop)  # type: ignore[arg-type]
    assert signal.getsignal(signal.SIGTERM) is before
