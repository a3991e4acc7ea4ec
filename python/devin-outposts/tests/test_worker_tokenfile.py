"""The account token from a file descriptor or a 0600 file (core/tokenfile.py; docs/security.md, "What a
session can reach").

test_process_privacy.py shows, with real processes as ``nobody``, that a token given this way is never in
the environment; these tests hold the rules: which files are refused, that a descriptor is read once and
closed (a standard one pointed at /dev/null), that the variables are dropped from the environment, and that
direct-serve mode never reads a descriptor meant for something else.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devin_outposts.core.config import ConfigError
from devin_outposts.core.tokenfile import TokenSourceError, token_from_source
from devin_outposts.worker.options import parse_start_args

TOKEN = "cog_token_from_a_file_0123"


def token_file(tmp_path: Path, text: str = TOKEN + "\n", mode: int = 0o600) -> Path:
    path = tmp_path / "worker.token"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_0600_or_0400_file_is_read(tmp_path: Path) -> None:
    for mode in (0o600, 0o400):
        path = token_file(tmp_path, mode=mode)
        assert token_from_source({"DEVIN_OUTPOSTS_TOKEN_FILE": str(path)}) == TOKEN
        path.chmod(0o600)
        path.unlink()


@pytest.mark.parametrize(
    ("text", "mode", "message"),
    [
        (TOKEN, 0o644, "other users may read or write it \\(mode 0644\\); chmod 600 it"),
        (TOKEN, 0o620, "mode 0620"),
        ("", 0o600, "it holds no token"),
        (f"{TOKEN} second", 0o600, "more than one word"),
        ("x" * (70 << 10), 0o600, "cannot read it"),
    ],
)
def test_unsafe_or_unusable_files_are_refused(tmp_path: Path, text: str, mode: int, message: str) -> None:
    path = token_file(tmp_path, text, mode)
    with pytest.raises(TokenSourceError, match=message) as caught:
        token_from_source({"DEVIN_OUTPOSTS_TOKEN_FILE": str(path)})
    assert f"DEVIN_OUTPOSTS_TOKEN_FILE={path}" in str(caught.value)
    assert TOKEN not in str(caught.value)


def test_a_symlink_and_a_directory_are_refused(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(token_file(tmp_path))
    with pytest.raises(TokenSourceError, match="cannot open it"):
        token_from_source({"DEVIN_OUTPOSTS_TOKEN_FILE": str(link)})
    with pytest.raises(TokenSourceError, match="not a regular file"):
        token_from_source({"DEVIN_OUTPOSTS_TOKEN_FILE": str(tmp_path)})


@pytest.mark.parametrize(
    "extra",
    [{"DEVIN_OUTPOSTS_TOKEN": "cog_other"}, {"DEVIN_OUTPOSTS_TOKEN_FD": "9"}],
)
def test_only_one_source_may_be_set(tmp_path: Path, extra: dict[str, str]) -> None:
    env = {"DEVIN_OUTPOSTS_TOKEN_FILE": str(token_file(tmp_path)), **extra}
    with pytest.raises(TokenSourceError, match="set only one of"):
        token_from_source(env)
    with pytest.raises(ConfigError, match="set only one of"):
        parse_start_args(["--outpost", "o"], env)


def test_a_descriptor_is_read_to_its_end_and_closed() -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, f"  {TOKEN}\n".encode())
    os.close(write_end)
    config = parse_start_args(["--outpost", "o"], {"DEVIN_OUTPOSTS_TOKEN_FD": str(read_end)})
    assert config.token == TOKEN
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(read_end)


@pytest.mark.parametrize("text", ["x", "-1", "3.5"])
def test_a_descriptor_must_be_a_number(text: str) -> None:
    with pytest.raises(TokenSourceError, match="must be a file descriptor number"):
        token_from_source({"DEVIN_OUTPOSTS_TOKEN_FD": text})


def test_a_closed_descriptor_is_refused() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    os.close(write_end)
    with pytest.raises(TokenSourceError, match=f"DEVIN_OUTPOSTS_TOKEN_FD={read_end}: cannot read it"):
        token_from_source({"DEVIN_OUTPOSTS_TOKEN_FD": str(read_end)})


def test_standard_input_is_read_then_pointed_at_dev_null_and_the_variables_dropped(tmp_path: Path) -> None:
    """As systemd's ``StandardInput=file:`` gives it: the token on fd 0, ``DEVIN_OUTPOSTS_TOKEN_FD=0``."""
    code = (
        "import json, os, sys\n"
        "from devin_outposts.worker.options import parse_start_args\n"
        "config = parse_start_args(['--outpost', 'o'])\n"
        "print(json.dumps({'token': config.token, 'stdin': os.readlink('/proc/self/fd/0'),\n"
        "                  'left': sorted(k for k in os.environ if k.startswith('DEVIN_OUTPOSTS_TOKEN'))}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVIN_")}
    env["DEVIN_OUTPOSTS_TOKEN_FD"] = "0"
    with open(token_file(tmp_path), "rb") as stdin:
        argv = [sys.executable, "-c", code]
        out = subprocess.run(argv, stdin=stdin, env=env, capture_output=True, check=True)
    assert json.loads(out.stdout) == {"token": TOKEN, "stdin": "/dev/null", "left": []}


def test_direct_serve_mode_never_reads_the_descriptor() -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, f"{TOKEN}\n".encode())
    env = {
        "DEVIN_OUTPOSTS_TOKEN_FD": str(read_end),
        "DEVIN_REMOTE_SESSION_TOKEN": "ct_direct_0123456789",
        "DEVIN_OUTPOST_GATEWAY_URL": "wss://gateway.example/g",
    }
    try:
        config = parse_start_args(["--session", "devin-1"], env)
        assert config.direct and config.token is None
        os.fstat(read_end)  # still open, not read
        os.close(write_end)
        assert os.read(read_end, 100) == f"{TOKEN}\n".encode()
    finally:
        os.close(read_end)
