#!/usr/bin/env bash
# ansible-test sanity on a git snapshot of the working tree (see make_collection_copy in scripts/lib.sh).
# Extra arguments go to ansible-test, e.g. scripts/test.sh sanity --test pylint
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ensure_env
ensure_get_pip_standin
coll=$(make_collection_copy)
trap 'finish_collection_copy "$coll"' EXIT
say "ansible-test sanity ($(ansible --version | sed -n 1p)) in $coll"
cd "$coll"
run_ansible_test sanity --venv --python "${OUTPOSTS_TEST_PYTHON:-3.11}" --color no "$@"
