#!/usr/bin/env bash
# The release metadata: antsibull-changelog lint (config.yaml, changelog.yaml, every fragment); every place that
# repeats the version agrees with galaxy.yml; CHANGELOG.md is what the fragments make (scripts/release.sh).
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ensure_env
cd "$ROOT"
say "antsibull-changelog $(antsibull-changelog --version 2>/dev/null | awk '{print $NF}')"
antsibull-changelog lint "$@"
python scripts/release.py versions
python scripts/release.py check-changelog
say "changelog: OK"
