#!/usr/bin/env bash
# ruff check on the bundled package, from its folder, with the rules in its pyproject.toml.
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ensure_env
cd "$PKG_DIR"
say "ruff $(ruff --version | cut -d' ' -f2) in ${PKG_DIR#"$ROOT"/}"
exec ruff check --no-cache . "$@"
