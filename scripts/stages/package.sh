#!/usr/bin/env bash
# pytest on the bundled package's tests (tests/package).
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
has_pytest_files "$ROOT/tests/package" || skip "tests/package holds no test files yet"
ensure_env
cd "$ROOT"
run_pytest tests/package "$@"
