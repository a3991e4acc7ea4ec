# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""The worker role's CA bundle step under Wine: roles/worker/files/windows/ca_bundle.py run by the Windows CPython
the venvs are made from, its source on standard input, as the role's win_command task runs it."""

from __future__ import annotations

import json
import zipfile

from prerequisites import ROOT  # type: ignore[import-not-found]
from wine import BASE_PYTHON, Wine  # type: ignore[import-not-found]

SCRIPT = (ROOT / "roles" / "worker" / "files" / "windows" / "ca_bundle.py").read_bytes()
PRIVATE = "-----BEGIN CERTIFICATE-----\nMIIBwine\n-----END CERTIFICATE-----\n"
CA_FILE = r"C:\ProgramData\devin-outposts-ca-test\ca.pem"
BUNDLE = r"C:\ProgramData\devin-outposts-ca-test\ca-bundle.pem"
#: The base Python of scripts/windows/setup.sh has no pip of its own (its venvs get pip from ensurepip): the public
#: CAs come from ensurepip's pip wheel, the fallback of ca_bundle.py.
BUNDLED = r"C:\Python311\Lib\ensurepip\_bundled"


def test_the_ca_bundle_is_built_by_the_windows_python_and_a_rerun_changes_nothing(wine: Wine) -> None:
    wine.path(CA_FILE).parent.mkdir(parents=True, exist_ok=True)
    wine.path(CA_FILE).write_text(PRIVATE, encoding="utf-8")
    code, out = wine.run(BASE_PYTHON, "-", CA_FILE, BUNDLE, stdin=SCRIPT, check=False)
    assert (code, json.loads(out.splitlines()[-1])) == (0, {"changed": True}), out
    (wheel,) = wine.path(BUNDLED).glob("pip-*.whl")
    with zipfile.ZipFile(wheel) as bundled:
        public = bundled.read("pip/_vendor/certifi/cacert.pem").decode("utf-8")
    assert wine.path(BUNDLE).read_bytes() == (public.rstrip() + "\n" + PRIVATE).encode()
    code, out = wine.run(BASE_PYTHON, "-", CA_FILE, BUNDLE, stdin=SCRIPT, check=False)
    assert (code, json.loads(out.splitlines()[-1])) == (0, {"changed": False}), out
    code, out = wine.run(BASE_PYTHON, "-", CA_FILE + ".absent", BUNDLE, stdin=SCRIPT, check=False)
    assert code == 1 and "Could not build the CA bundle" in out, out
