# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""Test-only: what the ansible.windows stand-ins share (README.md). Never shipped.

* the Wine prefix: the hidden option ``wine_prefix``, from ``DEVIN_OUTPOSTS_TEST_WINEPREFIX``;
* ``C:\\...`` paths mapped to the prefix's ``drive_c``;
* Windows programs run under Wine the way tests/windows/wine.py does (no terminal input, output through pipes, an
  environment with nothing but what Wine needs).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import ntpath
import os
import subprocess
import threading

from ansible.module_utils.basic import env_fallback

PREFIX_ENV = "DEVIN_OUTPOSTS_TEST_WINEPREFIX"
PREFIX_OPTION = {"type": "path", "fallback": (env_fallback, [PREFIX_ENV])}


def argument_spec(**options):
    """The module's own options, and ``wine_prefix``."""
    return dict(options, wine_prefix=PREFIX_OPTION)


class WinePrefix(object):
    def __init__(self, module):
        self.module = module
        prefix = module.params.get("wine_prefix")
        if not prefix or not os.path.isdir(os.path.join(prefix, "drive_c")):
            module.fail_json(msg="test-only ansible.windows stand-in: set %s to a Wine prefix" % PREFIX_ENV)
        self.prefix = prefix

    def path(self, windows_path):
        """The Linux path of ``windows_path`` (``C:\\...`` only: the role uses nothing else)."""
        drive, rest = ntpath.splitdrive(windows_path)
        if drive.upper() != "C:" or not rest.startswith("\\"):
            self.module.fail_json(
                msg="test-only stand-in: only absolute C:\\ paths are mapped, got %r" % windows_path
            )
        parts = [part for part in rest.split("\\") if part]
        return os.path.join(self.prefix, "drive_c", *parts)

    def env(self):
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": os.path.dirname(self.prefix.rstrip("/")),
            "WINEPREFIX": self.prefix,
            "WINEDEBUG": "-all",
            "LANG": "C.UTF-8",
        }

    def run(self, argv, timeout=120):
        """Run ``wine <argv>``: (rc, stdout, stderr). A program that starts another one hands it its pipes, so the
        output is what was written when the program itself ended."""
        proc = subprocess.Popen(
            ["wine"] + list(argv),
            env=self.env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = bytearray(), bytearray()
        readers = [
            threading.Thread(target=lambda: out.extend(proc.stdout.read())),
            threading.Thread(target=lambda: err.extend(proc.stderr.read())),
        ]
        for reader in readers:
            reader.daemon = True
            reader.start()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            self.module.fail_json(msg="wine %s did not end within %s s" % (" ".join(argv), timeout))
        for reader in readers:
            reader.join(5)
        return rc, bytes(out).decode("utf-8", "replace"), bytes(err).decode("utf-8", "replace")


def digest(path, algorithm):
    h = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
