#!/usr/bin/env bash
# ruff on the bundled package (its pyproject.toml holds the rules) and on its tests in tests/package.
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ensure_env
cd "$PKG_DIR"
say "ruff $(ruff --version | cut -d' ' -f2): package"
rc=0
ruff check --no-cache . "$@" || rc=1
if has_pytest_files "$ROOT/tests/package"; then
    say "ruff: tests/package, with the package's rules"
    ruff check --no-cache --config pyproject.toml "$ROOT/tests/package" "$@" || rc=1
fi
exit "$rc"
