#!/usr/bin/env bash
# ruff check on the bundled package, from its folder, with the rules in its pyproject.toml; then on its tests
# and the benchmarks (ruff.toml).
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ensure_env
cd "$PKG_DIR"
say "ruff $(ruff --version | cut -d' ' -f2) in ${PKG_DIR#"$ROOT"/}"
ruff check --no-cache . "$@"
# The package's tests and the benchmarks, with the same rules (ruff.toml at the root extends the package's).
cd "$ROOT"
say "ruff in tests/package and benchmarks"
ruff check --no-cache tests/package benchmarks "$@"
