# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""Molecule upgrade scenario, on the test host: end a session while its worker drains.

Waits until the worker process of one systemd invocation logs that SIGTERM started its drain, then sets the
session's status to terminated through the simulator's admin API (relayed to the host's loopback), as the
brain would. Prints one JSON line: when the drain was seen and when the session was ended (epoch seconds),
or the error. Exit 0 on success, 1 on a timeout or an API error.

    python3 end_during_drain.py URL ADMIN_TOKEN_FILE SESSION_ID INVOCATION_ID [TIMEOUT]

Standard library only: it runs with the host's python3, outside the worker's venv that the upgrade replaces.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
import urllib.parse

DRAIN_LINE = "SIGTERM: no new claims"


def drain_seen(invocation):
    """True once the worker of this invocation has logged the start of its drain."""
    journal = subprocess.run(
        ["journalctl", "--no-pager", "-o", "cat", "_SYSTEMD_INVOCATION_ID=" + invocation],
        capture_output=True,
        text=True,
        check=False,
    )
    return DRAIN_LINE in journal.stdout


def end_session(url, token, session_id):
    """POST /_sim/sessions/<id>/status {"session_status": "terminated"}; returns the HTTP status."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request(
            "POST",
            f"/_sim/sessions/{urllib.parse.quote(session_id)}/status",
            body=json.dumps({"session_status": "terminated"}),
            headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"},
        )
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def main(argv):
    url, token_file, session_id, invocation = argv[1:5]
    timeout = float(argv[5]) if len(argv) > 5 else 600.0
    with open(token_file, encoding="utf-8") as handle:
        token = handle.read().strip()
    deadline = time.time() + timeout
    while not drain_seen(invocation):
        if time.time() > deadline:
            print(json.dumps({"error": f"no drain of invocation {invocation} within {timeout:g}s"}))
            return 1
        time.sleep(0.2)
    seen = time.time()
    status = end_session(url, token, session_id)
    ended = time.time()
    print(json.dumps({"drain_seen_at": seen, "ended_at": ended, "http_status": status}))
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
