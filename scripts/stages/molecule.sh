#!/usr/bin/env bash
# The roles' tests: the argument-spec drift test and the roles run on this machine (tests/roles), the
# orchestrator's ansible driver on a real host (tests/orchestrator), and the Molecule scenarios
# (extensions/molecule/) on systemd-nspawn test hosts that scripts/test-hosts/build-images.sh builds
# (Debian 12 and 13, cached under /var/tmp). The fleet simulator runs on this machine's loopback and is
# relayed into each host; the hosts have no network.
#
#   scripts/test.sh molecule                          # everything; the scenarios in MOLECULE_SCENARIOS (default: all)
#   MOLECULE_SCENARIOS=default scripts/test.sh molecule
#   MOLECULE_JOBS=1 scripts/test.sh molecule          # one at a time (default: 2 side by side)
#   scripts/test.sh molecule converge -s default      # any molecule command line
#
# These jobs wait a lot (on ansible-playbook's round trips, the hosts' boots, pip in the hosts, sessions being
# claimed and drained): one at a time, the stage used about half of one core (its processes and its hosts: some
# 800 CPU seconds in a 1532-second run). So MOLECULE_JOBS of them run side by side, longest first; each scenario has its own hosts, simulator and Molecule folder. Each job's output goes to
# tests/output/molecule/<job>.log and is printed whole when the job ends.
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ensure_env
cd "$ROOT"
export NO_COLOR=1 PY_COLORS=0 ANSIBLE_FORCE_COLOR=0

if [[ $# -gt 0 ]]; then
    "$ROOT/scripts/test-hosts/build-images.sh"
    exec molecule "$@"
fi

# The jobs, longest first (their times on a quiet two-core machine, one at a time, in docs/architecture.md).
ORDER=(tests/roles orchestrator absent default upgrade multi cli tests/orchestrator check)
log_dir="$ROOT/tests/output/molecule"
mkdir -p "$log_dir"

run_job() {
    case "$1" in
        # Two workers: most of these tests wait on ansible-playbook runs.
        tests/roles) run_pytest tests/roles -q -p no:cacheprovider -n 2 --durations=10 ;;
        # The orchestrator's ansible driver on a real host (docs/examples/orchestrator/'s playbooks): it needs a
        # test host, so it runs here rather than in the package stage.
        tests/orchestrator)
            "$ROOT/scripts/test-hosts/build-images.sh" bookworm
            run_pytest tests/orchestrator -q -p no:cacheprovider --durations=10 ;;
        # Its create playbook builds (or finds) the images of its platforms.
        *) molecule test -s "$1" ;;
    esac
}

todo=()
can_host=1
if [[ $(id -u) -ne 0 ]] || [[ ! -d /sys/fs/cgroup/systemd && ! -f /sys/fs/cgroup/cgroup.controllers ]]; then
    can_host=0
fi
scenarios=()
read -r -a scenarios <<<"${MOLECULE_SCENARIOS:-$(find extensions/molecule -mindepth 2 -maxdepth 2 -name molecule.yml -printf '%h\n' | xargs -n1 basename | sort | tr '\n' ' ')}"
skipped=0
for job in "${ORDER[@]}"; do
    case "$job" in
        tests/roles) todo+=("$job") ;;
        # MOLECULE_SCENARIOS=... runs only those scenarios (and tests/roles).
        tests/orchestrator) [[ $can_host -eq 0 || -n "${MOLECULE_SCENARIOS:-}" ]] || todo+=("$job") ;;
        *) [[ $can_host -eq 0 || " ${scenarios[*]} " != *" $job "* ]] || todo+=("$job") ;;
    esac
done
for scenario in "${scenarios[@]}"; do
    if [[ $scenario == windows ]]; then
        # The windows scenario needs a Windows host that the user provides (extensions/molecule/windows/molecule.yml):
        # none can be built here, so it is skipped, also in CI, unless one is named. Not a cannot_run: nothing is wrong.
        if [[ -z "${DEVIN_OUTPOSTS_WINDOWS_HOST:-}" ]]; then
            say "molecule windows: SKIPPED: it needs a real Windows host (no Windows machine can run here or in CI);" \
                "set DEVIN_OUTPOSTS_WINDOWS_HOST, _USER, _PASSWORD (and _CONNECTION) to run it (docs/windows.md)"
            skipped=$((skipped + 1))
        else
            todo+=(windows)
        fi
    elif [[ " ${ORDER[*]} " != *" $scenario "* ]]; then
        [[ $can_host -eq 0 ]] || todo+=("$scenario")  # a scenario added since ORDER was written: last
    fi
done

width=${MOLECULE_JOBS:-2}
[[ $width =~ ^[1-9][0-9]*$ ]] || die "MOLECULE_JOBS takes a whole number from 1"
declare -A JOB_OF=() START=()
running=0 failed=0 passed=0
# Each job in its own process group (job control), and an interrupt passed on to each whole job.
set -m
stop_jobs() {
    local pid
    for pid in "${!JOB_OF[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    exit 130
}
trap stop_jobs INT TERM
say "molecule: ${#todo[@]} jobs, $width side by side: ${todo[*]} (logs: ${log_dir#"$ROOT/"}/)"
next=0
while [[ $next -lt ${#todo[@]} || $running -gt 0 ]]; do
    while [[ $next -lt ${#todo[@]} && $running -lt $width ]]; do
        job=${todo[$next]}
        next=$((next + 1))
        (run_job "$job") >"$log_dir/${job//\//-}.log" 2>&1 </dev/null &
        JOB_OF[$!]=$job
        START[$job]=$SECONDS
        running=$((running + 1))
        say "molecule $job: started"
    done
    rc=0
    wait -n -p done_pid "${!JOB_OF[@]}" || rc=$?
    job=${JOB_OF[$done_pid]}
    unset "JOB_OF[$done_pid]"
    running=$((running - 1))
    say ""
    say "---- molecule $job (${log_dir#"$ROOT/"}/${job//\//-}.log) ----"
    cat "$log_dir/${job//\//-}.log"
    if [[ $rc -eq 0 ]]; then
        passed=$((passed + 1))
        say "molecule $job: passed in $((SECONDS - START[$job])) s"
    else
        failed=$((failed + 1))
        say "molecule $job: FAILED (exit $rc) after $((SECONDS - START[$job])) s"
    fi
done
say "molecule: $passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]] || exit 1
# Without root or cgroups the hosts cannot run: a developer sees "skipped", CI fails (cannot_run).
[[ $(id -u) -eq 0 ]] || cannot_run "the Molecule scenarios need root (debootstrap, systemd-nspawn)"
[[ $can_host -eq 1 ]] || cannot_run "no cgroup hierarchy for systemd-nspawn"
