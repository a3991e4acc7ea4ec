#!/usr/bin/env bash
# Regenerate tests/sanity/ignore-<core>.txt, one per core in CORE_VERSIONS (scripts/lib.sh: 2.16 ... 2.21), from
# the plugins that exist.
#
# Every core gets validate-modules:missing-gplv3-license for every module and lookup plugin: the collection is
# MIT licensed, and validate-modules wants a GPLv3 header. A core whose own tools need more gets those entries
# from CORE_ONLY below, and nothing else. docs/architecture.md ("Sanity ignore files") justifies each entry.
# Run it after adding or removing a module or a lookup; `scripts/test.sh sanity` fails until the files match.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
shopt -s nullglob
common=$(for f in plugins/modules/*.py plugins/lookup/*.py; do
    [[ "$(basename "$f")" == __init__.py ]] && continue
    printf '%s validate-modules:missing-gplv3-license\n' "$f"
done | LC_ALL=C sort)
# Entries that only some cores need, one per line, by core (none today). The Python side keeps clear of
# what older cores' tools reject: e.g. typing.Protocol stubs have docstring bodies, because the pep8 test
# of ansible-core 2.16 to 2.18 reports one-line "def f(self) -> T: ..." stubs as E704.
declare -A CORE_ONLY=()
mkdir -p tests/sanity
for v in "${CORE_VERSIONS[@]}"; do
    file="tests/sanity/ignore-$v.txt"
    entries=$(printf '%s\n%s\n' "$common" "${CORE_ONLY[$v]:-}" | sed '/^$/d' | LC_ALL=C sort)
    if [[ -z "$entries" ]]; then
        rm -f "$file"
    elif [[ ! -f "$file" || "$(cat "$file")" != "$entries" ]]; then
        printf '%s\n' "$entries" >"$file"
        say "updated $file"
    fi
done
