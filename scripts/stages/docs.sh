#!/usr/bin/env bash
# The docs site, with no warnings: antsibull-docs' linter on the plugins' and roles' docs (markup, references,
# schemas, docs/docsite/links.yml), then docs/site/build.sh (antsibull-docs and Sphinx, warnings are errors),
# then tests/docs (a warning planted in a scratch copy fails each tool; an EDA event source gets its page;
# scripts/release.py fails on a planted version mismatch and on a CHANGELOG.md that misses a fragment).
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ensure_env
cd "$ROOT"
export ANSIBLE_HOME="${ANSIBLE_HOME:-$ROOT/.ansible}"
say "antsibull-docs $(antsibull-docs --version 2>/dev/null | awk '{print $NF}'), $(sphinx-build --version)"
out=$(antsibull-docs lint-collection-docs --plugin-docs "$ROOT" 2>&1) || { printf '%s\n' "$out"; die "antsibull-docs lint-collection-docs failed"; }
if [[ -n "$out" ]]; then
    printf '%s\n' "$out"
    die "antsibull-docs lint-collection-docs reported the problems above"
fi
say "lint-collection-docs: no findings"
docs/site/build.sh
has_pytest_files tests/docs || die "tests/docs has no tests"
run_pytest tests/docs -p no:cacheprovider -q -n 2 "$@"
say "docs: OK"
