#!/usr/bin/env bash
# import-linter: the import layers of python/ (python/importlinter.ini): api < core < orchestrator | worker < cli
# in devin_outposts, the orchestrator and the worker never import each other, drivers never import one another
# nor the claims; errors < remote < state < http|admin_client < cli|testing in devin_outposts_sim (state without
# HTTP); nothing in devin_outposts imports the simulator, the simulator uses only devin_outposts.api, and no import
# circles between sibling modules. A circle or an upward import fails the stage.
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ensure_env
cd "$PY_DIR"
say "$(lint-imports --version 2>/dev/null || echo import-linter)"
exec lint-imports --no-cache importlinter.ini "$@"
