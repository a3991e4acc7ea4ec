#!/usr/bin/env bash
# ruff check on python/ (both distributions, their tests, the contract runner: python/ruff.toml), then on the
# benchmarks and the pytest parts of tests/ (ruff.toml at the root, which extends python/ruff.toml).
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ensure_env
cd "$ROOT"
say "ruff $(ruff --version | cut -d' ' -f2) in python/"
(cd python && ruff check --no-cache . "$@")
say "ruff in benchmarks"
ruff check --no-cache benchmarks "$@"
say "ruff in extensions/eda (the event source)"
ruff check --no-cache extensions/eda "$@"
