#!/usr/bin/env bash
# ansible-test sanity on a git snapshot of the working tree (see make_collection_copy in scripts/lib.sh).
# Extra arguments go to ansible-test, e.g. scripts/test.sh sanity --test pylint
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ansible_test_stage sanity "$@"
