#!/usr/bin/env bash
# ansible-test units (tests/unit: modules and module_utils) on a git snapshot of the working tree.
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
has_pytest_files "$ROOT/tests/unit" || skip "tests/unit holds no test files yet"
ansible_test_stage units "$@"
