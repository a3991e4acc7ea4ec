#!/usr/bin/env bash
# ansible-lint with the production profile; the configuration is .ansible-lint at the repo root.
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ensure_env
cd "$ROOT"
say "$(ansible-lint --version 2>/dev/null | sed -n 1p)"
exec ansible-lint --offline "$@"
