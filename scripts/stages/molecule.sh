#!/usr/bin/env bash
# The roles' tests: the argument-spec drift test (tests/roles), then the orchestrator's ansible driver on a real
# host (tests/orchestrator), then the Molecule scenarios
# (extensions/molecule/) on systemd-nspawn test hosts that scripts/test-hosts/build-images.sh builds
# (Debian 12 and 13, cached under /var/tmp). The fleet simulator runs on this machine's loopback and is
# relayed into each host; the hosts have no network.
#
#   scripts/test.sh molecule                          # every scenario in MOLECULE_SCENARIOS (default: all)
#   MOLECULE_SCENARIOS=default scripts/test.sh molecule
#   scripts/test.sh molecule converge -s default      # any molecule command line
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ensure_env
cd "$ROOT"
# Two workers: most of these tests wait on ansible-playbook runs (120 s serial, about 80 s so).
run_pytest tests/roles -q -p no:cacheprovider -n 2
# Without root or cgroups the scenarios cannot run: a developer sees "skipped", CI fails (cannot_run).
[[ $(id -u) -eq 0 ]] || cannot_run "the Molecule scenarios need root (debootstrap, systemd-nspawn)"
[[ -d /sys/fs/cgroup/systemd || -f /sys/fs/cgroup/cgroup.controllers ]] ||
    cannot_run "no cgroup hierarchy for systemd-nspawn"
"$ROOT/scripts/test-hosts/build-images.sh"
export NO_COLOR=1 PY_COLORS=0 ANSIBLE_FORCE_COLOR=0
if [[ $# -gt 0 ]]; then
    exec molecule "$@"
fi
# The orchestrator's ansible driver on a real host (docs/examples/orchestrator/'s playbooks): it needs the images
# built just above, so it runs here rather than in the package stage. MOLECULE_SCENARIOS=... skips it.
if [[ -z "${MOLECULE_SCENARIOS:-}" ]]; then
    start=$SECONDS
    run_pytest tests/orchestrator -q -p no:cacheprovider
    say "orchestrator ansible driver on an nspawn host: passed in $((SECONDS - start)) s"
fi
read -r -a scenarios <<<"${MOLECULE_SCENARIOS:-$(find extensions/molecule -mindepth 2 -maxdepth 2 -name molecule.yml -printf '%h\n' | xargs -n1 basename | sort | tr '\n' ' ')}"
failed=0
skipped=0
for scenario in "${scenarios[@]}"; do
    # The windows scenario needs a Windows host that the user provides (extensions/molecule/windows/molecule.yml):
    # none can be built here, so it is skipped, also in CI, unless one is named. Not a cannot_run: nothing is wrong.
    if [[ $scenario == windows && -z "${DEVIN_OUTPOSTS_WINDOWS_HOST:-}" ]]; then
        say "molecule windows: SKIPPED: it needs a real Windows host (no Windows machine can run here or in CI);" \
            "set DEVIN_OUTPOSTS_WINDOWS_HOST, _USER, _PASSWORD (and _CONNECTION) to run it (docs/windows.md)"
        skipped=$((skipped + 1))
        continue
    fi
    start=$SECONDS
    if molecule test -s "$scenario"; then
        say "molecule $scenario: passed in $((SECONDS - start)) s"
    else
        say "molecule $scenario: FAILED after $((SECONDS - start)) s"
        failed=$((failed + 1))
    fi
done
say "molecule: $(( ${#scenarios[@]} - failed - skipped )) passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
