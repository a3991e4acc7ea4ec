# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""Build a reproducible wheel of the bundled devin-outposts package, with the standard library only.

Run on the Ansible controller by the devin.outposts.worker role (Python 3.11+, as ansible-core 2.19 needs)::

    python build_wheel.py SOURCE_DIR OUTPUT_DIR

SOURCE_DIR holds pyproject.toml and src/. The wheel is pure Python (py3-none-any). Its bytes depend only on
the source files: entries are sorted and dated 1980-01-01, so an unchanged source gives an identical wheel and
the role's copy to the hosts stays idempotent. The wheel is written only when its bytes differ from the file
already there. Prints one JSON line: {"path", "name", "version", "changed"}.

No build backend (setuptools) is needed on the controller or on the hosts, which matters on air-gapped sites.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import sys
import tomllib
import zipfile

EPOCH = (1980, 1, 1, 0, 0, 0)
SKIP_DIRS = {"__pycache__"}
SKIP_SUFFIXES = (".pyc", ".pyo")


def _record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
    return "sha256=" + digest


def _metadata(project):
    lines = [
        "Metadata-Version: 2.1",
        "Name: " + project["name"],
        "Version: " + project["version"],
    ]
    if project.get("description"):
        lines.append("Summary: " + project["description"])
    if project.get("requires-python"):
        lines.append("Requires-Python: " + project["requires-python"])
    for req in project.get("dependencies", []):
        lines.append("Requires-Dist: " + req)
    for extra, reqs in sorted(project.get("optional-dependencies", {}).items()):
        lines.append("Provides-Extra: " + extra)
        for req in reqs:
            lines.append('Requires-Dist: %s ; extra == "%s"' % (req, extra))
    return "\n".join(lines) + "\n"


def build(source, output):
    with open(os.path.join(source, "pyproject.toml"), "rb") as handle:
        project = tomllib.load(handle)["project"]
    dist = re.sub(r"[-_.]+", "_", project["name"]).lower()
    version = project["version"]
    info = "%s-%s.dist-info" % (dist, version)
    src = os.path.join(source, "src")
    files = []
    for top in sorted(os.listdir(src)):
        top_path = os.path.join(src, top)
        if not os.path.isdir(top_path) or top.endswith(".egg-info") or top in SKIP_DIRS:
            continue
        for dirpath, dirnames, filenames in os.walk(top_path):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for filename in sorted(filenames):
                if filename.endswith(SKIP_SUFFIXES):
                    continue
                path = os.path.join(dirpath, filename)
                with open(path, "rb") as handle:
                    files.append((os.path.relpath(path, src).replace(os.sep, "/"), handle.read()))
    scripts = project.get("scripts", {})
    entry_points = "[console_scripts]\n" + "".join("%s = %s\n" % item for item in sorted(scripts.items()))
    tops = sorted({name.split("/", 1)[0] for name, dummy in files})
    files += [
        (info + "/METADATA", _metadata(project).encode("utf-8")),
        (info + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: devin-outposts-build-wheel\nRoot-Is-Purelib: true\n"
         b"Tag: py3-none-any\n"),
        (info + "/entry_points.txt", entry_points.encode("utf-8")),
        (info + "/top_level.txt", ("\n".join(tops) + "\n").encode("utf-8")),
    ]
    record = "".join("%s,%s,%d\n" % (name, _record_hash(data), len(data)) for name, data in files)
    files.append((info + "/RECORD", (record + info + "/RECORD,,\n").encode("utf-8")))

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files:
            entry = zipfile.ZipInfo(name, date_time=EPOCH)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(entry, data)
    data = buffer.getvalue()

    os.makedirs(output, exist_ok=True)
    name = "%s-%s-py3-none-any.whl" % (dist, version)
    path = os.path.join(output, name)
    changed = True
    if os.path.exists(path):
        with open(path, "rb") as handle:
            changed = handle.read() != data
    if changed:
        tmp = path + ".tmp"
        with open(tmp, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    return {"path": path, "name": name, "version": version, "changed": changed}


def main(argv):
    if len(argv) != 3:
        sys.stderr.write("usage: build_wheel.py SOURCE_DIR OUTPUT_DIR\n")
        return 2
    print(json.dumps(build(argv[1], os.path.expanduser(argv[2]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
