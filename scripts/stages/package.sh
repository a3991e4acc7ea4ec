#!/usr/bin/env bash
# pytest on both Python distributions' tests (python/devin-outposts/tests, python/devin-outposts-sim/tests).
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
has_pytest_files "$PKG_DIR/tests" || skip "python/devin-outposts/tests holds no test files yet"
ensure_env
cd "$ROOT"
# The podman driver's tests run the session image: found (or built) here, once, before the tests start, not in
# the set-up of whichever test comes first while the other pytest worker waits for the build's lock. The full
# run builds it ahead, in the background (scripts/test-hosts/prepare.sh). Without root or podman the tests say
# why themselves (skipped here, failed in CI).
if [[ $(id -u) -eq 0 ]] && command -v podman >/dev/null; then
    say "the session image: $("$ROOT/scripts/test-hosts/build-session-image.sh")"
fi
# Two workers (the machines have two cores): most tests wait on subprocesses, servers and timers.
run_pytest "$PKG_DIR/tests" "$SIM_DIR/tests" -n 2 --durations=10 "$@"
