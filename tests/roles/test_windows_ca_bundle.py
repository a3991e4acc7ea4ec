"""roles/worker/files/windows/ca_bundle.py on this machine's Python, the way the role runs it: the source on
standard input, ``python - <ca.pem> <ca-bundle.pem>``. (The windows stage runs it with the Windows CPython.)"""

from __future__ import annotations

import ensurepip
import json
import subprocess
import sys
import zipfile
from pathlib import Path

from pip._vendor import certifi

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = (ROOT / "roles" / "worker" / "files" / "windows" / "ca_bundle.py").read_bytes()
PRIVATE = "-----BEGIN CERTIFICATE-----\nMIIBprivate\n-----END CERTIFICATE-----\n"


def build(ca_file: Path, bundle: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-", str(ca_file), str(bundle)], input=SCRIPT, capture_output=True, check=False
    )
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def public_cas() -> str:
    return Path(certifi.where()).read_text(encoding="utf-8")


def test_the_bundle_is_pips_public_cas_then_the_private_ca_and_a_rerun_changes_nothing(tmp_path: Path) -> None:
    ca_file, bundle = tmp_path / "ca.pem", tmp_path / "ca-bundle.pem"
    ca_file.write_text("\n" + PRIVATE + "\n\n")
    first = build(ca_file, bundle)
    assert (first.returncode, json.loads(first.stdout)) == (0, {"changed": True}), first.stderr
    assert bundle.read_bytes() == (public_cas().rstrip() + "\n" + PRIVATE).encode()
    written = bundle.stat().st_mtime_ns
    again = build(ca_file, bundle)
    assert (again.returncode, json.loads(again.stdout)) == (0, {"changed": False}), again.stderr
    assert bundle.stat().st_mtime_ns == written


def test_a_new_private_ca_or_a_rewritten_bundle_is_a_change(tmp_path: Path) -> None:
    ca_file, bundle = tmp_path / "ca.pem", tmp_path / "ca-bundle.pem"
    ca_file.write_text(PRIVATE)
    assert json.loads(build(ca_file, bundle).stdout) == {"changed": True}
    ca_file.write_text(PRIVATE.replace("private", "rotated"))
    assert json.loads(build(ca_file, bundle).stdout) == {"changed": True}
    assert bundle.read_text().endswith(PRIVATE.replace("private", "rotated"))
    bundle.write_bytes(bundle.read_bytes().replace(b"\n", b"\r\n"))  # same certificates, other line ends
    assert json.loads(build(ca_file, bundle).stdout) == {"changed": True}
    assert b"\r\n" not in bundle.read_bytes()


def test_a_missing_private_ca_fails_with_one_line_and_leaves_the_bundle(tmp_path: Path) -> None:
    bundle = tmp_path / "ca-bundle.pem"
    bundle.write_text("the bundle before\n")
    done = build(tmp_path / "absent.pem", bundle)
    assert done.returncode == 1 and done.stdout == "", done
    assert done.stderr.startswith(f"Could not build the CA bundle {bundle}: ") and "absent.pem" in done.stderr
    assert len(done.stderr.splitlines()) == 1
    assert bundle.read_text() == "the bundle before\n"


def test_wrong_arguments_are_refused(tmp_path: Path) -> None:
    done = build(tmp_path / "ca.pem", tmp_path / "b.pem")
    assert done.returncode == 1  # reaches the read: the two arguments were taken
    only_one = subprocess.run([sys.executable, "-", "x"], input=SCRIPT, capture_output=True, check=False)
    assert only_one.returncode == 2 and b"usage:" in only_one.stderr


def test_a_python_without_pip_takes_the_cas_of_ensurepips_pip_wheel(tmp_path: Path) -> None:
    """``-S``: no site-packages, so no pip, as with a Python installed without it (the venvs still get pip)."""
    ca_file, bundle = tmp_path / "ca.pem", tmp_path / "ca-bundle.pem"
    ca_file.write_text(PRIVATE)
    done = subprocess.run(
        [sys.executable, "-S", "-", str(ca_file), str(bundle)], input=SCRIPT, capture_output=True, check=False
    )
    wheels = sorted(Path(ensurepip.__file__).parent.glob("_bundled/pip-*.whl"))
    if not wheels:  # a distribution that strips ensurepip's wheels (Debian's python3): a clear error, no bundle
        assert done.returncode == 1 and b"neither pip nor ensurepip's pip wheel" in done.stderr, done
        assert not bundle.exists()
        return
    assert done.returncode == 0, done.stderr
    with zipfile.ZipFile(wheels[-1]) as wheel:
        public = wheel.read("pip/_vendor/certifi/cacert.pem").decode()
    assert bundle.read_text() == public.rstrip() + "\n" + PRIVATE
