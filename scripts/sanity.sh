#!/usr/bin/env bash
# ansible-test sanity alone, on a git snapshot of this working tree (uncommitted edits included).
#   scripts/sanity.sh                         # every sanity test
#   scripts/sanity.sh --test validate-modules # one test; any other ansible-test sanity option works too
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/test.sh" sanity "$@"
