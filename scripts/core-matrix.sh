#!/usr/bin/env bash
# ansible-test sanity and units on every supported ansible-core minor, each in its own venv, and one table.
#
#   scripts/core-matrix.sh               # every core in CORE_VERSIONS (scripts/lib.sh): 2.16 ... 2.21
#   scripts/core-matrix.sh 2.16 2.21     # some cores
#   scripts/core-matrix.sh --ends        # the oldest and the newest (what the matrix stage and CI run)
#   scripts/core-matrix.sh --units 2.18  # only units (or --sanity: only sanity)
#
# Each core gets a venv under .cache/core-matrix/<core>/ with the newest ansible-core of that minor from
# PyPI (re-installed only when the minor or the Python changes) and Python 3.11, or 3.12 for the cores that
# need it (core_python_version in scripts/lib.sh; 3.12 comes from PATH or pyenv). The tests run on a git
# snapshot of the working tree, as in the sanity and units stages, with ansible-test's --venv. Logs:
# .cache/core-matrix/<core>/{sanity,units}.log. Exit status: 0 when every run passed.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

want_sanity=1 want_units=1
cores=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --ends) cores+=("${CORE_VERSIONS[0]}" "${CORE_VERSIONS[-1]}") ;;
        --sanity) want_units=0 ;;
        --units) want_sanity=0 ;;
        -h | --help) sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        2.[0-9]*) cores+=("$1") ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
    shift
done
[[ ${#cores[@]} -gt 0 ]] || cores=("${CORE_VERSIONS[@]}")

cache="$CORE_VENV_CACHE"
mkdir -p "$cache"

# Run "$@" (a command or a function of lib.sh) with the core's venv first on PATH, in directory $2.
in_core() (
    local venv=$1 dir=$2
    shift 2
    export VIRTUAL_ENV="$venv"
    export PATH="$venv/bin:$PATH"
    cd "$dir"
    "$@"
)

declare -A SANITY=() UNITS=() SECS=() PY=() FULL=() TESTS=()
overall=0
for core in "${cores[@]}"; do
    start=$SECONDS
    say ""
    say "=== ansible-core $core ==="
    pyver=$(core_python_version "$core")
    [[ -n "$(find_python "$pyver")" ]] || cannot_run "no python$pyver for ansible-core $core (install it, e.g. with pyenv)"
    venv=$(core_venv "$core")
    PY[$core]=$("$venv/bin/python" -c 'import platform; print(platform.python_version())')
    FULL[$core]=$("$venv/bin/python" -c 'import ansible; print(ansible.__version__)')
    SANITY[$core]=- UNITS[$core]=- TESTS[$core]=-
    coll=$(make_collection_copy)
    in_core "$venv" "$coll" ensure_get_pip_standin >/dev/null
    if [[ $want_sanity -eq 1 ]]; then
        if in_core "$venv" "$coll" run_ansible_test sanity --venv --python "$pyver" --color no \
            >"$cache/$core/sanity.log" 2>&1; then
            SANITY[$core]=pass
        else
            SANITY[$core]=FAIL; overall=1
            say "sanity on $core failed; the findings (full log: ${cache#"$ROOT/"}/$core/sanity.log):"
            sed -n '/^---- ansible-test sanity: findings ----$/,$p' "$cache/$core/sanity.log" | sed 's/^/  /'
        fi
        say "sanity: ${SANITY[$core]}"
    fi
    if [[ $want_units -eq 1 ]]; then
        if in_core "$venv" "$coll" run_ansible_test units --venv --python "$pyver" --color no \
            >"$cache/$core/units.log" 2>&1; then
            UNITS[$core]=pass
        else
            UNITS[$core]=FAIL; overall=1
            say "units on $core failed; the last lines (full log: ${cache#"$ROOT/"}/$core/units.log):"
            tail -n 30 "$cache/$core/units.log" | sed 's/^/  /'
        fi
        # ansible-test runs pytest once per group (modules, module_utils, controller): add up the passes.
        TESTS[$core]=$(grep -E '^=+ .*[0-9]+ passed' "$cache/$core/units.log" | grep -Eo '[0-9]+ passed' |
            awk '{n += $1} END {print n + 0}')
        say "units: ${UNITS[$core]} (${TESTS[$core]} tests passed)"
    fi
    rm -rf "${coll%/ansible_collections/*}"
    SECS[$core]=$((SECONDS - start))
done

say ""
printf '| %-12s | %-8s | %-6s | %-6s | %-11s | %7s |\n' core python sanity units "unit tests" seconds
printf '|%s|%s|%s|%s|%s|%s|\n' -------------- ---------- -------- -------- ------------- ---------
for core in "${cores[@]}"; do
    printf '| %-12s | %-8s | %-6s | %-6s | %-11s | %7s |\n' "${FULL[$core]}" "${PY[$core]}" "${SANITY[$core]}" \
        "${UNITS[$core]}" "${TESTS[$core]}" "${SECS[$core]}"
done
exit "$overall"
