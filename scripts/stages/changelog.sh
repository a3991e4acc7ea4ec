#!/usr/bin/env bash
# antsibull-changelog lint: changelogs/config.yaml, changelog.yaml and every fragment.
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ensure_env
cd "$ROOT"
say "antsibull-changelog $(antsibull-changelog --version 2>/dev/null | awk '{print $NF}')"
antsibull-changelog lint "$@"
say "changelog: OK"
