#!/usr/bin/env bash
# mypy --strict (configured in the package's pyproject.toml) on the bundled package.
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ensure_env
cd "$PKG_DIR"
say "$(mypy --version)"
exec mypy src "$@"
