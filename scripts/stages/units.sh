#!/usr/bin/env bash
# ansible-test units (tests/unit: modules and module_utils) on a git snapshot of the working tree.
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
has_pytest_files "$ROOT/tests/unit" || skip "tests/unit holds no test files yet"
ensure_env
ensure_get_pip_standin
coll=$(make_collection_copy)
trap 'finish_collection_copy "$coll"' EXIT
say "ansible-test units ($(ansible --version | sed -n 1p)) in $coll"
cd "$coll"
run_ansible_test units --venv --python "${OUTPOSTS_TEST_PYTHON:-3.11}" --color no "$@"
