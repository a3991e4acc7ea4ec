#!/usr/bin/env bash
# pytest on both Python distributions' tests (python/devin-outposts/tests, python/devin-outposts-sim/tests).
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
has_pytest_files "$PKG_DIR/tests" || skip "python/devin-outposts/tests holds no test files yet"
ensure_env
cd "$ROOT"
# Two workers (the machines have two cores): most tests wait on subprocesses, servers and timers.
run_pytest "$PKG_DIR/tests" "$SIM_DIR/tests" -n 2 "$@"
