"""Benchmark the worker role: fresh converge and idempotent re-run of the Molecule ``default`` scenario.

On one distro (``--distro``, default bookworm), with the test hosts, simulator and wheelhouse that the
scenario itself uses (scripts/test-hosts/):

1. ``molecule destroy`` then ``molecule create -s default`` (through ``scripts/test.sh molecule``, which
   also builds the cached images); not timed. Create boots both of the scenario's hosts (half a second
   each); the timed steps run on one of them only (``--limit``).
2. **fresh**: ``molecule converge -s default -- --limit default-<distro>`` on the freshly booted host:
   packages checked, user, venv, the wheel built on the controller and installed with the dependencies
   from the wheelhouse, units written and started.
3. **re-run**: the same command again; the ``changed=`` count of the host's PLAY RECAP must be 0.
4. ``molecule destroy``; always, also after a failure.

The times are wall-clock seconds of the whole ``molecule converge`` command, Molecule's own start-up
included. Goals (docs/roles.md): fresh <= 90 s, re-run <= 15 s with changed=0. The figures are printed
next to the goals; they are measurements, not assertions: the exit code is 0 unless a step itself failed.

Run as root (systemd-nspawn)::

    .venv/bin/python benchmarks/role_converge.py [--distro trixie] [--json FILE|-]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _harness import write_json

ROOT = Path(__file__).resolve().parents[1]
GOAL_FRESH = 90.0
GOAL_RERUN = 15.0
RECAP = re.compile(
    r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
    r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)",
    re.MULTILINE,
)


class BenchError(Exception):
    """A step of the benchmark failed: no figure can be given."""


def molecule_env() -> dict[str, str]:
    """The environment scripts/lib.sh gives Molecule: the venv first, this checkout as devin.outposts."""
    env = dict(os.environ)
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(ROOT / ".venv")
    env["ANSIBLE_COLLECTIONS_PATH"] = str(ROOT / ".cache" / "collections")
    env.update({"NO_COLOR": "1", "PY_COLORS": "0", "ANSIBLE_FORCE_COLOR": "0"})
    return env


def run(argv: list[str], what: str) -> tuple[float, str]:
    """Run a command from the checkout; its wall time and output, or BenchError with the output's tail."""
    start = time.monotonic()
    proc = subprocess.run(
        argv, cwd=ROOT, env=molecule_env(), capture_output=True, text=True, check=False
    )
    elapsed = time.monotonic() - start
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        tail = "\n".join(output.splitlines()[-40:])
        raise BenchError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return elapsed, output


def recap_of(output: str, host: str) -> dict[str, int]:
    """The PLAY RECAP counters of one host (the last recap that names it)."""
    rows = [m for m in RECAP.finditer(output) if m.group("host") == host]
    if not rows:
        raise BenchError(f"no PLAY RECAP line for {host} in the converge output")
    return {key: int(value) for key, value in rows[-1].groupdict().items() if key != "host"}


def measure(distro: str) -> dict[str, Any]:
    host = f"default-{distro}"
    converge = ["molecule", "converge", "-s", "default", "--", "--limit", host]
    run(["scripts/test.sh", "molecule", "destroy", "-s", "default"], "molecule destroy")
    try:
        run(["scripts/test.sh", "molecule", "create", "-s", "default"], "molecule create")
        fresh, fresh_out = run(converge, "the fresh converge")
        rerun, rerun_out = run(converge, "the re-run")
    finally:
        run(["scripts/test.sh", "molecule", "destroy", "-s", "default"], "molecule destroy")
    return {
        "distro": distro,
        "host": host,
        "fresh_s": round(fresh, 1),
        "fresh_recap": recap_of(fresh_out, host),
        "rerun_s": round(rerun, 1),
        "rerun_recap": recap_of(rerun_out, host),
        "goal_fresh_s": GOAL_FRESH,
        "goal_rerun_s": GOAL_RERUN,
    }


def report(result: dict[str, Any]) -> str:
    def verdict(ok: bool) -> str:
        return "meets the goal" if ok else "MISSES the goal"

    changed = result["rerun_recap"]["changed"]
    lines = [
        f"role converge, Molecule scenario default on {result['distro']} ({result['host']}):",
        f"  fresh converge  {result['fresh_s']:7.1f} s   goal <= {GOAL_FRESH:.0f} s   "
        f"{verdict(result['fresh_s'] <= GOAL_FRESH)}   (changed={result['fresh_recap']['changed']})",
        f"  re-run          {result['rerun_s']:7.1f} s   goal <= {GOAL_RERUN:.0f} s   "
        f"{verdict(result['rerun_s'] <= GOAL_RERUN)}",
        f"  re-run changed  {changed:7d}     goal 0        {verdict(changed == 0)}",
        "  (wall time of `molecule converge`, Molecule's start-up included)",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--distro", default="bookworm", choices=["bookworm", "trixie"])
    parser.add_argument(
        "--json", default=None, metavar="FILE", help="also write the figures as JSON ('-': stdout)"
    )
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("role_converge: must run as root (systemd-nspawn test hosts)", file=sys.stderr)
        return 2
    try:
        result = measure(args.distro)
    except BenchError as exc:
        print(f"role_converge: {exc}", file=sys.stderr)
        return 1
    print(report(result))
    if args.json:
        write_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
