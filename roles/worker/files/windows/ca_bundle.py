# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""devin.outposts.worker (Windows): the CA bundle the worker (DEVIN_CA_BUNDLE) and pip (--cert) trust.

pip's public CAs (its vendored certifi) followed by the private CA, like the system bundle on Linux. pip's CAs
come from the pip installed with this Python or, when it has none (an installer run without pip, an embeddable
Python: the venvs still get pip from ensurepip), from the pip wheel that ensurepip bundles. The role
runs this with the Python it installs the venvs from, the source given on standard input
(``python.exe - <ca.pem> <ca-bundle.pem>``), before the worker package exists on the host: pip needs the bundle
to install it. It writes the bundle only when its content changes, and prints one JSON line,
``{"changed": true|false}``; on an error, a line on standard error and exit 1.

Standard library only, Python 3.9+. Run by the Windows CPython under Wine in the windows stage, and on Linux in
tests/roles/test_windows_ca_bundle.py.
"""

import glob
import json
import os
import sys
import zipfile


def bundle_text(public, private):
    """The bundle: the public CAs, then the private CA, each block ending in one newline."""
    return public.rstrip() + "\n" + private.strip() + "\n"


def read(path):
    # newline="" keeps the bytes as they are: a bundle written with CRLF is not "the same" as one with LF.
    with open(path, encoding="utf-8", newline="") as handle:
        return handle.read()


def public_cas():
    """pip's vendored certifi bundle: the installed pip's, else the one in ensurepip's bundled pip wheel."""
    try:
        from pip._vendor import certifi  # pylint: disable=import-outside-toplevel
    except ImportError:
        import ensurepip  # pylint: disable=import-outside-toplevel

        wheels = sorted(glob.glob(os.path.join(os.path.dirname(ensurepip.__file__), "_bundled", "pip-*.whl")))
        if not wheels:
            raise OSError(f"{sys.executable} has neither pip nor ensurepip's pip wheel") from None
        with zipfile.ZipFile(wheels[-1]) as wheel:
            return wheel.read("pip/_vendor/certifi/cacert.pem").decode("utf-8")
    return read(certifi.where())


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: python - <private CA file> <bundle file>\n")
        return 2
    ca_file, bundle = argv
    try:
        wanted = bundle_text(public_cas(), read(ca_file))
        try:
            current = read(bundle)
        except FileNotFoundError:
            current = None
        changed = current != wanted
        if changed:
            with open(bundle, "w", encoding="utf-8", newline="") as handle:
                handle.write(wanted)
    except (OSError, KeyError) as exc:  # KeyError: a pip wheel without certifi's bundle
        sys.stderr.write(f"Could not build the CA bundle {bundle}: {exc}\n")
        return 1
    sys.stdout.write(json.dumps({"changed": changed}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
