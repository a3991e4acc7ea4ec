#!/usr/bin/env bash
# The one test command. Bootstraps, then runs the stages in order, stopping at the first failure.
#
#   scripts/test.sh                     # every stage (what `make test` and CI run)
#   scripts/test.sh lint                # ruff, mypy, ansible-lint, changelog
#   scripts/test.sh sanity units        # some stages, in the order given
#   scripts/test.sh sanity --test pep8  # one stage; the words after it go to its tool
#   scripts/test.sh --keep-going        # run every stage even after a failure
#   scripts/test.sh --list              # the stages and what each runs
#
# A stage with nothing to test yet (an empty tests/ folder) is reported as skipped, never as passed.
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

STAGES=(ruff mypy imports ansible-lint changelog docs sanity units matrix package integration eda tarball molecule)
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
)
declare -A GROUPS_=(
    [lint]="ruff mypy imports ansible-lint changelog"
    [all]="${STAGES[*]}"
)

usage() {
    sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    echo
    echo "Stages:"
    local s
    for s in "${STAGES[@]}"; do printf '  %-13s %s\n' "$s" "${ABOUT[$s]}"; done
    echo "Groups: lint = ${GROUPS_[lint]}; all (the default)"
}

keep_going=0
selected=()
extra=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h | --help | --list) usage; exit 0 ;;
        -k | --keep-going) keep_going=1; shift ;;
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
if [[ ${#extra[@]} -gt 0 && ${#selected[@]} -ne 1 ]]; then
    echo "extra arguments (${extra[*]}) need exactly one stage" >&2; exit 2
fi

declare -A RESULT=() TIME=()
suite_start=$SECONDS

summary() {
    local s passed=0 failed=0 skipped=0
    echo
    echo "================================ summary ================================"
    for s in "${selected[@]}"; do
        local r="${RESULT[$s]:-not run}"
        case "$r" in passed) passed=$((passed + 1)) ;; failed) failed=$((failed + 1)) ;; skipped) skipped=$((skipped + 1)) ;; esac
        printf '  %-13s %-8s %s\n' "$s" "$r" "${TIME[$s]:+${TIME[$s]} s}"
    done
    echo "  total         $((SECONDS - suite_start)) s"
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

banner "bootstrap"
start=$SECONDS
"$ROOT/scripts/bootstrap.sh"
export OUTPOSTS_BOOTSTRAPPED=1
echo "bootstrap: $((SECONDS - start)) s"

n=0
for stage in "${selected[@]}"; do
    n=$((n + 1))
    banner "[$n/${#selected[@]}] $stage: ${ABOUT[$stage]}"
    start=$SECONDS
    rc=0
    "$ROOT/scripts/stages/$stage.sh" "${extra[@]}" || rc=$?
    TIME[$stage]=$((SECONDS - start))
    if [[ $rc -eq 0 ]]; then
        RESULT[$stage]=passed
        echo "-- $stage: passed in ${TIME[$stage]} s"
    elif [[ $rc -eq $EXIT_SKIPPED ]]; then
        RESULT[$stage]=skipped
        echo "-- $stage: skipped"
    else
        RESULT[$stage]=failed
        echo "-- $stage: FAILED (exit $rc) after ${TIME[$stage]} s; the lines above say why"
        [[ $keep_going -eq 1 ]] || break
    fi
done

summary
