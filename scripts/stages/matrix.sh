#!/usr/bin/env bash
# ansible-test sanity and units on the oldest and the newest supported ansible-core (scripts/core-matrix.sh
# --ends), each in its own cached venv; the sanity and units stages cover the dev venv's core. The whole
# matrix: scripts/core-matrix.sh. Extra arguments go to core-matrix.sh instead, e.g.
#   scripts/test.sh matrix 2.18
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
has_pytest_files "$ROOT/tests/unit" || skip "tests/unit holds no test files yet"
if [[ $# -gt 0 ]]; then
    exec "$ROOT/scripts/core-matrix.sh" "$@"
fi
exec "$ROOT/scripts/core-matrix.sh" --ends
