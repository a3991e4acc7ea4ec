"""Upstreams for a confined session to try, on a test host: one TCP server per ADDRESS:PORT given, each
recording the first bytes of every connection it accepts (a JSON line in DIR/<address>_<port>.jsonl) and
answering ``<address>:`` and them. The verify playbooks judge the network policy by these files: what reached
an upstream, never what the session or the worker say. Python 3 standard library only.

    python3 recording_upstream.py DIR 127.0.0.1:18080 127.0.0.2:18080
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
from pathlib import Path


def serve(server: socket.socket, address: str, record: Path) -> None:
    lock = threading.Lock()
    while True:
        conn, peer = server.accept()
        threading.Thread(target=one, args=(conn, peer, address, record, lock), daemon=True).start()


def one(conn: socket.socket, peer: tuple[str, int], address: str, record: Path, lock: threading.Lock) -> None:
    with conn:
        conn.settimeout(30)
        try:
            data = conn.recv(65536)
        except OSError:
            data = b""
        # Recorded before the answer: once a client has its reply, the file already says what arrived.
        with lock, record.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"peer": peer[0], "data": data.decode("latin-1")}) + "\n")
        with contextlib.suppress(OSError):
            conn.sendall(address.encode() + b":" + data)


def main() -> int:
    directory = Path(sys.argv[1])
    directory.mkdir(parents=True, exist_ok=True)
    threads = []
    for spec in sys.argv[2:]:
        address, port = spec.rsplit(":", 1)
        server = socket.create_server((address, int(port)))
        record = directory / f"{address}_{port}.jsonl"
        record.touch()  # the sign that this server listens (connecting to find out would be recorded)
        threads.append(threading.Thread(target=serve, args=(server, address, record), daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
