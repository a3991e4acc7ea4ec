#!/usr/bin/env bash
# mypy --strict (configured in each distribution's pyproject.toml) on both distributions, for Linux and, for
# the worker, also as if on Windows and macOS (its platform branches must type-check everywhere).
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ensure_env
say "$(mypy --version)"
cd "$PKG_DIR"
for target in linux win32 darwin; do
    say "mypy devin-outposts (--platform $target)"
    mypy --platform "$target" src "$@"
done
cd "$SIM_DIR"
say "mypy devin-outposts-sim"
mypy src "$@"
# The EDA event source (a lone file that ansible-rulebook runs with runpy; aiohttp comes with ansible-rulebook).
cd "$ROOT"
say "mypy --strict extensions/eda/plugins/event_source"
mypy --strict extensions/eda/plugins/event_source "$@"
