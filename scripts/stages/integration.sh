#!/usr/bin/env bash
# pytest on the integration harness (tests/integration): playbooks run against the fleet simulator.
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
has_pytest_files "$ROOT/tests/integration" || skip "tests/integration holds no test files yet"
ensure_env
cd "$ROOT"
run_pytest tests/integration --durations=10 "$@"
