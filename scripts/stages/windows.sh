#!/usr/bin/env bash
# The windows stage: the worker's Windows service host installed as the worker role installs it and run as a real
# Windows service under Wine, against the fleet simulator on this machine; and the cli role's own Windows tasks run by
# ansible-playbook against the Wine prefix, with test-only ansible.windows stand-ins (tests/windows; docs/windows.md,
# "Under Wine in CI"). scripts/windows/setup.sh provisions it first (apt, PyPI; cached in .cache/windows).
#
#   scripts/test.sh windows                 # or: make windows
#   scripts/test.sh windows -k idle         # arguments go to pytest
#
# Without root (for apt) or without network on a first run the stage is skipped on a developer's machine and fails
# in CI (CI=true).
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
has_pytest_files "$ROOT/tests/windows" || skip "tests/windows holds no test files yet"
ensure_env
cd "$ROOT"
if ! "$ROOT/scripts/windows/setup.sh"; then
    cannot_run "scripts/windows/setup.sh could not provision Wine, the Windows Python and its wheels"
fi
# One pytest process: the cases share one Wine prefix and its service manager, in file order. -v prints a line per
# case as it ends; the summary repeats them ("windows case: ...").
run_pytest tests/windows -v -p no:cacheprovider --durations=10 "$@"
