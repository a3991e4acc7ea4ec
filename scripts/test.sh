#!/usr/bin/env bash
# The one test command. Bootstraps, then runs the stages; after a failure no further stage starts.
#
#   scripts/test.sh                     # every stage (what `make test` and CI run)
#   scripts/test.sh lint                # ruff, mypy, imports, ansible-lint, changelog
#   scripts/test.sh sanity units        # some stages
#   scripts/test.sh sanity --test pep8  # one stage; the words after it go to its tool
#   scripts/test.sh --keep-going        # run every stage even after a failure
#   scripts/test.sh --jobs 1            # one stage at a time, in the order given, output live
#   scripts/test.sh --list              # the stages and what each runs
#
# Two stages run side by side (--jobs N, or OUTPOSTS_TEST_JOBS=N; default 2: the machines have two cores), as
# "Side by side" in scripts/test.sh says. The Molecule stage runs two of its own jobs at a time (MOLECULE_JOBS).
# A stage with nothing to test yet (an empty tests/ folder) is reported as skipped, never as passed.
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

STAGES=(ruff mypy imports ansible-lint changelog docs sanity units matrix package integration eda tarball molecule windows)
declare -A ABOUT=(
    [ruff]="ruff check on python/ and the benchmarks"
    [mypy]="mypy --strict on both Python distributions (the worker also for win32 and darwin)"
    [imports]="import-linter: the import layers of python/ (no circles, no upward imports)"
    [ansible-lint]="ansible-lint, production profile"
    [changelog]="antsibull-changelog lint; versions agree with galaxy.yml; CHANGELOG.md matches the fragments"
    [docs]="the docs site (docs/site/build.sh): antsibull-docs lint and build, Sphinx -W; tests/docs"
    [sanity]="ansible-test sanity --venv --python 3.11"
    [units]="ansible-test units --venv --python 3.11 (tests/unit)"
    [matrix]="sanity and units on the oldest and the newest supported ansible-core (scripts/core-matrix.sh --ends)"
    [package]="pytest python/*/tests (both Python distributions)"
    [integration]="pytest tests/integration (playbooks against the simulator)"
    [eda]="pytest tests/eda: the EDA event source, ansible-rulebook runs the example rulebooks (one on an nspawn host)"
    [tarball]="make build, then the installed tarball: contents, ansible-doc, modules, the worker role on a host"
    [molecule]="roles: tests/roles, then the Molecule scenarios on systemd-nspawn hosts"
    [windows]="tests/windows under Wine: the worker's service host as a real service; the cli role's Windows tasks (scripts/windows/setup.sh)"
)
declare -A GROUPS_=(
    [lint]="ruff mypy imports ansible-lint changelog"
    [all]="${STAGES[*]}"
)

# --- Side by side ----------------------------------------------------------------------------------------------
# With --jobs 2 (the default) and more than one stage:
# - the lint stages run first, and nothing else starts before they have passed (they are quick, and they are what
#   fails most often);
# - then the others longest first (EXPECTED), at most --jobs at a time, each starting when a lane is free;
# - the stages that run ansible-test never run at the same time (they share ansible-test's venvs and caches in
#   ~/.ansible/test), see ONE_AT_A_TIME;
# - meanwhile scripts/test-hosts/prepare.sh builds, in the background, the images and venvs that the selected
#   stages need (NEEDS), so that no stage waits for a debootstrap or an image build when it gets there;
# - each stage writes to tests/output/stages/<stage>.log, and its log is printed whole when it ends, so that
#   logs never interleave; a line every minute says what is still running;
# - after a failure no new stage starts, and the running ones finish (they stop their own hosts and
#   simulators on the way out); the failed stage is named, with its log.
# Seconds each stage took run one at a time, on a fresh two-core machine (issue 25's run; tarball since its
# first deployment): only their order matters, longest first, so that no long stage starts last.
# windows is given 0 so that it starts last, whatever its length (issue 28: a failure under Wine stands out).
declare -A EXPECTED=(
    [ruff]=2 [mypy]=20 [imports]=3 [ansible-lint]=42 [changelog]=7 [docs]=42 [sanity]=84 [units]=24 [matrix]=214
    [package]=164 [integration]=78 [eda]=101 [tarball]=200 [molecule]=992 [windows]=0
)
declare -A ONE_AT_A_TIME=([sanity]=ansible-test [units]=ansible-test [matrix]=ansible-test)
declare -A NEEDS=(
    [molecule]="hosts cores" [eda]="hosts" [tarball]="hosts importer" [package]="session-image"
    [sanity]="sanity-venvs" [matrix]="cores matrix-venvs"
)
LOG_DIR="$ROOT/tests/output/stages"
HEARTBEAT=${OUTPOSTS_TEST_HEARTBEAT:-60}  # seconds between the lines that say what is still running

usage() {
    sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    echo
    echo "Stages:"
    local s
    for s in "${STAGES[@]}"; do printf '  %-13s %s\n' "$s" "${ABOUT[$s]}"; done
    echo "Groups: lint = ${GROUPS_[lint]}; all (the default)"
}

keep_going=0
jobs=${OUTPOSTS_TEST_JOBS:-2}
selected=()
extra=()
while [[ $# -gt 0 ]]; do
    # After a stage's name, everything is that stage's (`scripts/test.sh package -k watch`: -k is pytest's there,
    # not --keep-going); the suite's own options come first.
    if [[ ${#selected[@]} -gt 0 && $1 == -* ]]; then
        [[ $1 == -- ]] && shift
        extra+=("$@"); break
    fi
    case "$1" in
        -h | --help | --list) usage; exit 0 ;;
        -k | --keep-going) keep_going=1; shift ;;
        -j | --jobs) jobs=${2:?--jobs needs a number}; shift 2 ;;
        --jobs=*) jobs=${1#--jobs=}; shift ;;
        --) shift; extra+=("$@"); break ;;
        -*) extra+=("$@"); break ;;
        *)
            if [[ -n "${GROUPS_[$1]:-}" ]]; then
                read -r -a words <<<"${GROUPS_[$1]}"
                selected+=("${words[@]}")
            elif [[ -n "${ABOUT[$1]:-}" ]]; then
                selected+=("$1")
            elif [[ ${#selected[@]} -gt 0 ]]; then
                extra+=("$@"); break
            else
                echo "unknown stage: $1" >&2; usage >&2; exit 2
            fi
            shift ;;
    esac
done
[[ ${#selected[@]} -eq 0 ]] && selected=("${STAGES[@]}")
# Each stage once (`lint ruff` names ruff twice), in the order first given.
mapfile -t selected < <(printf '%s\n' "${selected[@]}" | awk '!seen[$0]++')
if [[ ${#extra[@]} -gt 0 && ${#selected[@]} -ne 1 ]]; then
    echo "extra arguments (${extra[*]}) need exactly one stage" >&2; exit 2
fi
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "--jobs takes a whole number from 1" >&2; exit 2; }
[[ ${#selected[@]} -gt 1 ]] || jobs=1

declare -A RESULT=() TIME=() CPU=()
suite_start=$SECONDS

summary() {
    local s side passed=0 failed=0 skipped=0
    echo
    echo "================================ summary ================================"
    for s in "${selected[@]}"; do
        local r="${RESULT[$s]:-not run}"
        case "$r" in passed) passed=$((passed + 1)) ;; failed) failed=$((failed + 1)) ;; skipped) skipped=$((skipped + 1)) ;; esac
        printf '  %-13s %-8s %7s %s\n' "$s" "$r" "${TIME[$s]:+${TIME[$s]} s}" "${CPU[$s]:+(cpu ${CPU[$s]} s)}"
    done
    if [[ $jobs -gt 1 ]]; then side=" (up to $jobs stages side by side)"; else side=""; fi
    echo "  total         $((SECONDS - suite_start)) s$side"
    echo "========================================================================="
    echo "stages: $passed passed, $failed failed, $skipped skipped"
    [[ $failed -eq 0 ]]
}

banner() {
    echo
    echo "========================================================================="
    echo "== $*"
    echo "========================================================================="
}

# The CPU seconds (user + system) of a stage's processes, from bash's `times` in the stage's own shell (its
# second line: the children's). Test hosts and containers run outside that tree and are not counted.
cpu_seconds() {
    sed -n 2p "$1" 2>/dev/null | awk '{
        n = 0
        for (i = 1; i <= 2; i++) { split($i, t, "m"); sub("s", "", t[2]); n += t[1] * 60 + t[2] }
        printf "%d", n + 0.5
    }'
}

# Run one stage in this shell's place (its output to stdout, or to $2); records its CPU time.
run_stage() {
    local stage=$1 rc=0
    "$ROOT/scripts/stages/$stage.sh" "${extra[@]}" || rc=$?
    times >"$LOG_DIR/$stage.cpu"
    return "$rc"
}

record() {  # stage rc seconds
    local stage=$1 rc=$2
    TIME[$stage]=$3
    CPU[$stage]=$(cpu_seconds "$LOG_DIR/$stage.cpu")
    if [[ $rc -eq 0 ]]; then
        RESULT[$stage]=passed
        echo "-- $stage: passed in ${TIME[$stage]} s (cpu ${CPU[$stage]:-?} s)"
    elif [[ $rc -eq $EXIT_SKIPPED ]]; then
        RESULT[$stage]=skipped
        echo "-- $stage: skipped"
    else
        RESULT[$stage]=failed
        echo "-- $stage: FAILED (exit $rc) after ${TIME[$stage]} s; the lines above say why"
    fi
}

banner "bootstrap"
start=$SECONDS
"$ROOT/scripts/bootstrap.sh"
export OUTPOSTS_BOOTSTRAPPED=1
echo "bootstrap: $((SECONDS - start)) s"
mkdir -p "$LOG_DIR"
rm -f "$LOG_DIR"/*.log "$LOG_DIR"/*.cpu

# --- one at a time: the stages in the order given, their output live ------------------------------------------
if [[ $jobs -eq 1 ]]; then
    n=0
    for stage in "${selected[@]}"; do
        n=$((n + 1))
        banner "[$n/${#selected[@]}] $stage: ${ABOUT[$stage]}"
        start=$SECONDS
        rc=0
        run_stage "$stage" || rc=$?
        record "$stage" "$rc" $((SECONDS - start))
        [[ $rc -eq 0 || $rc -eq $EXIT_SKIPPED || $keep_going -eq 1 ]] || break
    done
    summary
    exit
fi

# --- side by side ---------------------------------------------------------------------------------------------
is_lint() { [[ " ${GROUPS_[lint]} " == *" $1 "* ]]; }
queue=()
for stage in "${selected[@]}"; do is_lint "$stage" && queue+=("$stage"); done
mapfile -t -O "${#queue[@]}" queue < <(
    for stage in "${selected[@]}"; do is_lint "$stage" || printf '%s %s\n' "${EXPECTED[$stage]}" "$stage"; done |
        sort -s -k1,1nr | cut -d' ' -f2
)

# The logs are files, read later: no colour codes in them (ansible-lint's colours ignore that its output is no
# terminal).
export NO_COLOR=1
# Each job in its own process group (job control), so that an interrupt reaches a whole stage.
set -m
declare -A PID=() STAGE_OF=() STARTED=()
running=()
prepare_pid=""
ticker=""
# The heartbeat's sleep: stopped quietly (disowned first, so that job control reports nothing).
stop_ticker() {
    [[ -n "$ticker" ]] || return 0
    disown "$ticker" 2>/dev/null || true
    kill "$ticker" 2>/dev/null || true
    ticker=""
}

# On an interrupt, or if this script itself fails: stop every stage still running, and the background builds.
stop_all() {
    local stage signal=$1
    stop_ticker
    [[ ${#running[@]} -eq 0 ]] || echo "stopping ${running[*]}" >&2
    for stage in "${running[@]}"; do kill "-$signal" -- "-${PID[$stage]}" 2>/dev/null || true; done
    [[ -z "$prepare_pid" ]] || kill -TERM -- "-$prepare_pid" 2>/dev/null || true
    wait || true
}
trap 'trap - INT TERM EXIT; echo "interrupted" >&2; stop_all INT; exit 130' INT TERM
trap 'rc=$?; trap - EXIT; [[ $rc -eq 0 ]] || stop_all TERM; exit "$rc"' EXIT

parts=()
for stage in "${selected[@]}"; do
    for part in ${NEEDS[$stage]:-}; do [[ " ${parts[*]} " == *" $part "* ]] || parts+=("$part"); done
done
if [[ ${#parts[@]} -gt 0 ]]; then
    "$ROOT/scripts/test-hosts/prepare.sh" "${parts[@]}" >"$LOG_DIR/prepare.log" 2>&1 </dev/null &
    prepare_pid=$!
    STARTED[prepare]=$SECONDS
    echo "background: scripts/test-hosts/prepare.sh ${parts[*]} (log: ${LOG_DIR#"$ROOT/"}/prepare.log)"
fi

can_start() {
    local stage=$1 other
    if ! is_lint "$stage"; then
        for other in "${queue[@]}" "${running[@]}"; do is_lint "$other" && return 1; done
    fi
    if [[ -n "${ONE_AT_A_TIME[$stage]:-}" ]]; then
        for other in "${running[@]}"; do [[ "${ONE_AT_A_TIME[$other]:-}" == "${ONE_AT_A_TIME[$stage]}" ]] && return 1; done
    fi
    return 0
}

launch() {
    local stage=$1
    (run_stage "$stage") >"$LOG_DIR/$stage.log" 2>&1 </dev/null &
    PID[$stage]=$!
    STAGE_OF[$!]=$stage
    STARTED[$stage]=$SECONDS
    running+=("$stage")
    echo "-- $stage: started ($(( ${#selected[@]} - ${#queue[@]} ))/${#selected[@]}; log: ${LOG_DIR#"$ROOT/"}/$stage.log)"
}

heartbeat() {
    local stage line
    printf '.. %s, %d s in:' "$(date +%H:%M:%S)" $((SECONDS - suite_start))
    for stage in "${running[@]}"; do
        line=$(grep -v '^[[:space:]]*$' "$LOG_DIR/$stage.log" 2>/dev/null | tail -n 1 | cut -c1-90) || line=""
        printf ' [%s %d s: %s]' "$stage" $((SECONDS - STARTED[$stage])) "$line"
    done
    printf '\n'
}

# Start what may start now: in queue order, skipping a stage that must wait (the stages before it still must).
start_what_can_start() {
    local i=0 stage
    while [[ $i -lt ${#queue[@]} && ${#running[@]} -lt $jobs ]]; do
        stage=${queue[$i]}
        if can_start "$stage"; then
            queue=("${queue[@]:0:$i}" "${queue[@]:$((i + 1))}")
            launch "$stage"
        else
            i=$((i + 1))
        fi
    done
}

prepare_done() {
    echo
    echo "-- background builds done after $((SECONDS - STARTED[prepare])) s (scripts/test-hosts/prepare.sh):"
    sed 's/^/  /' "$LOG_DIR/prepare.log"
    prepare_pid=""
}

stopped=0
while :; do
    [[ $stopped -eq 1 ]] || start_what_can_start
    [[ ${#running[@]} -gt 0 ]] || break
    [[ -n "$ticker" ]] || { sleep "$HEARTBEAT" & ticker=$!; }
    pids=("$ticker" ${prepare_pid:+"$prepare_pid"})
    for stage in "${running[@]}"; do pids+=("${PID[$stage]}"); done
    rc=0
    wait -n -p done_pid "${pids[@]}" || rc=$?
    if [[ "$done_pid" == "$ticker" ]]; then
        ticker=""
        heartbeat
        continue
    elif [[ "$done_pid" == "$prepare_pid" ]]; then
        prepare_done
        continue
    fi
    stage=${STAGE_OF[$done_pid]}
    remaining=()
    for other in "${running[@]}"; do [[ $other == "$stage" ]] || remaining+=("$other"); done
    running=("${remaining[@]}")
    banner "$stage: ${ABOUT[$stage]} (started at $((STARTED[$stage] - suite_start)) s)"
    cat "$LOG_DIR/$stage.log"
    record "$stage" "$rc" $((SECONDS - STARTED[$stage]))
    if [[ $rc -ne 0 && $rc -ne $EXIT_SKIPPED && $keep_going -eq 0 && $stopped -eq 0 ]]; then
        stopped=1
        [[ ${#running[@]} -eq 0 ]] || echo "-- $stage failed: no new stage starts; waiting for ${running[*]} to finish"
    fi
done
stop_ticker
if [[ -n "$prepare_pid" ]]; then
    # The stages ended first (after a failure, or where one could not run); what was being built is built
    # again, from the start, the next time something needs it.
    kill -TERM -- "-$prepare_pid" 2>/dev/null || true
    wait "$prepare_pid" 2>/dev/null || true
    prepare_done
fi
summary
