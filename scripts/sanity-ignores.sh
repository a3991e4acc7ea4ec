#!/usr/bin/env bash
# Regenerate tests/sanity/ignore-<core>.txt, one per core in CORE_VERSIONS (scripts/lib.sh: 2.16 ... 2.21), from
# the plugins that exist.
#
# The only entries are validate-modules:missing-gplv3-license, for every module and lookup plugin: the
# collection is MIT licensed, and validate-modules wants a GPLv3 header (docs/architecture.md says why).
# Run it after adding or removing a module or a lookup; `scripts/test.sh sanity` fails until the files match.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
shopt -s nullglob
entries=$(for f in plugins/modules/*.py plugins/lookup/*.py; do
    [[ "$(basename "$f")" == __init__.py ]] && continue
    printf '%s validate-modules:missing-gplv3-license\n' "$f"
done | LC_ALL=C sort)
mkdir -p tests/sanity
for v in "${CORE_VERSIONS[@]}"; do
    file="tests/sanity/ignore-$v.txt"
    if [[ -z "$entries" ]]; then
        rm -f "$file"
    elif [[ ! -f "$file" || "$(cat "$file")" != "$entries" ]]; then
        printf '%s\n' "$entries" >"$file"
        say "updated $file"
    fi
done
