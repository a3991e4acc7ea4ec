#!/usr/bin/env bash
# The Event-Driven Ansible parts (tests/eda, docs/eda.md): the event source devin.outposts.outpost_queue against
# the fleet simulator (test_outpost_queue.py), ansible-rulebook running the provision_per_session rulebook
# (test_rulebooks.py), and the autoscale_workers rulebook scaling workers on a systemd-nspawn test host
# (test_autoscale_nspawn.py; it needs root and the test-host images, which this stage builds or reuses).
#
#   scripts/test.sh eda
#   scripts/test.sh eda -k outpost_queue     # arguments go to pytest
#
# ansible-rulebook needs Java 17 (scripts/bootstrap.sh installs openjdk-17-jre-headless); without it, or without
# root for the host test, the tests are skipped on a developer's machine and fail in CI (CI=true).
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
has_pytest_files "$ROOT/tests/eda" || skip "tests/eda holds no test files yet"
ensure_env
cd "$ROOT"
command -v java >/dev/null 2>&1 || cannot_run "ansible-rulebook needs Java 17 (apt-get install openjdk-17-jre-headless)"
command -v ansible-rulebook >/dev/null 2>&1 || cannot_run "ansible-rulebook is not installed (scripts/bootstrap.sh)"
if [[ $(id -u) -eq 0 ]] && [[ -d /sys/fs/cgroup/systemd || -f /sys/fs/cgroup/cgroup.controllers ]]; then
    # The autoscale test's host: Debian 12 only (cached under /var/tmp after the first build).
    "$ROOT/scripts/test-hosts/build-images.sh" bookworm
elif in_ci; then
    die "the eda stage's host test needs root and cgroups (systemd-nspawn); CI=true fails instead of skipping"
fi
export NO_COLOR=1 PY_COLORS=0 ANSIBLE_FORCE_COLOR=0
# Two workers: the host test (about 100 s) runs beside the rest instead of after it.
run_pytest tests/eda -q -p no:cacheprovider -n 2 --durations=10 "$@"
