# shellcheck shell=bash
# Shared helpers for scripts/*.sh and scripts/stages/*.sh. Source it; do not run it.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
PY_DIR="$ROOT/python"
# The two Python distributions: the worker (ships to hosts) and the fleet simulator (never does).
PKG_DIR="$PY_DIR/devin-outposts"
SIM_DIR="$PY_DIR/devin-outposts-sim"
# A stage script exits with this code when it has nothing to test; scripts/test.sh reports it as skipped.
EXIT_SKIPPED=77
export ROOT VENV PY_DIR PKG_DIR SIM_DIR EXIT_SKIPPED

say() { printf '%s\n' "$*"; }
warn() { printf 'WARNING: %s\n' "$*" >&2; }
die() { printf 'ERROR: %s\n' "$*" >&2; exit 1; }
# A stage with nothing to test yet (no test files): skipped, here and in CI.
skip() { say "SKIPPED: $*"; exit "$EXIT_SKIPPED"; }
# True when running in CI (.ci/run; CI services set CI=true).
in_ci() { case "${CI:-}" in true | TRUE | True | 1 | yes) return 0 ;; *) return 1 ;; esac; }
# A stage that cannot run on this machine (a missing tool or capability): skipped on a developer's
# machine, but a failure in CI, where a green run must mean that every stage really ran.
cannot_run() {
    if in_ci; then
        die "$* (CI=true: a stage that cannot run fails in CI instead of being skipped)"
    fi
    skip "$*"
}

# Bootstrap once per run (scripts/test.sh does it before the first stage), then use the venv's tools.
# Ansible finds this checkout as devin.outposts first: ansible-lint and Molecule copy the collection into
# caches, and a stale copy there must never win over the working tree.
ensure_env() {
    if [[ "${OUTPOSTS_BOOTSTRAPPED:-0}" != 1 ]]; then
        "$ROOT/scripts/bootstrap.sh"
        export OUTPOSTS_BOOTSTRAPPED=1
    fi
    export VIRTUAL_ENV="$VENV"
    case ":$PATH:" in *":$VENV/bin:"*) ;; *) export PATH="$VENV/bin:$PATH" ;; esac
    local link_dir="$ROOT/.cache/collections/ansible_collections/devin"
    if [[ "$(readlink "$link_dir/outposts" 2>/dev/null)" != "$ROOT" ]]; then
        mkdir -p "$link_dir"
        ln -sfn "$ROOT" "$link_dir/outposts"
    fi
    case ":${ANSIBLE_COLLECTIONS_PATH:-}:" in
        *":$ROOT/.cache/collections:"*) ;;
        *) export ANSIBLE_COLLECTIONS_PATH="$ROOT/.cache/collections${ANSIBLE_COLLECTIONS_PATH:+:$ANSIBLE_COLLECTIONS_PATH}" ;;
    esac
}

# True when DIR holds at least one pytest-style test file.
has_pytest_files() {
    [[ -d "$1" ]] && [[ -n "$(find "$1" -type f \( -name 'test_*.py' -o -name '*_test.py' \) -print -quit)" ]]
}

# Run pytest, turning "no tests collected" (exit 5) into a clear failure: the caller already checked that
# test files exist, so collecting nothing means something is broken.
run_pytest() {
    local rc=0
    python -m pytest "$@" || rc=$?
    if [[ $rc -eq 5 ]]; then
        say "ERROR: pytest collected no tests from $* although test files exist"
        return 1
    fi
    return "$rc"
}

# ansible-test downloads a get-pip script from a host this network cannot reach. Write a stand-in that uses
# ensurepip and then PyPI, for every pip version the installed ansible-test pins.
ensure_get_pip_standin() {
    local req versions ver cache="$HOME/.ansible/test/cache"
    req=$(python -c 'import ansible_test, os; print(os.path.join(os.path.dirname(ansible_test.__file__), "_internal", "python_requirements.py"))')
    [[ -f "$req" ]] || die "cannot find ansible-test's python_requirements.py at $req"
    versions=$(python - "$req" <<'PY'
import re
import sys

text = open(sys.argv[1], encoding="utf-8").read()
found = set(re.findall(r"""\bpip\s*=\s*['"](\d+(?:\.\d+)*)['"]""", text))
found |= set(re.findall(r"""['"]pip['"]\s*:\s*['"](\d+(?:\.\d+)*)['"]""", text))
print("\n".join(sorted(found)))
PY
)
    [[ -n "$versions" ]] || die "found no pip version in $req; update ensure_get_pip_standin in scripts/lib.sh"
    mkdir -p "$cache"
    for ver in $versions; do
        local target="$cache/get_pip_${ver//./_}.py"
        [[ -s "$target" ]] && continue  # a stand-in or a real get-pip saved earlier; both work
        # Written aside and renamed: the stages that run ansible-test side by side never read half a file.
        cat >"$target.$$" <<'PY'
# devin.outposts get-pip stand-in: ansible-test's own download host is unreachable here.
import subprocess, sys
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"])
subprocess.check_call([sys.executable, "-m", "pip", "install"] + args)
PY
        mv -f "$target.$$" "$target"
        say "wrote the get-pip stand-in for pip $ver: $target"
    done
}

# ansible-test needs the collection at .../ansible_collections/devin/outposts, as a git checkout. Copy what git
# would see in this working tree (tracked and untracked-but-not-ignored files, uncommitted edits included) to a
# fresh temporary tree, commit it there, and print its path. The caller removes "${path%/ansible_collections/*}".
make_collection_copy() {
    local work coll
    work=$(mktemp -d "${TMPDIR:-/tmp}/devin-outposts-ansible-test.XXXXXX")
    coll="$work/ansible_collections/devin/outposts"
    mkdir -p "$coll"
    if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        (
            cd "$ROOT" || exit 1
            git ls-files -z --cached --others --exclude-standard |
                while IFS= read -r -d '' f; do [[ -e "$f" || -L "$f" ]] && printf '%s\0' "$f"; done
        ) | rsync -a --from0 --files-from=- "$ROOT/" "$coll/"
    else
        rsync -a --exclude=.venv --exclude=.cache --exclude=.ansible --exclude=tests/output \
            --exclude=__pycache__ --exclude='*.egg-info' --exclude=.mypy_cache --exclude=.ruff_cache \
            --exclude=.pytest_cache "$ROOT/" "$coll/"
    fi
    git -C "$coll" init -q
    git -C "$coll" add -A
    git -C "$coll" -c user.name=devin-outposts-tests -c user.email=tests@devin-outposts.invalid \
        -c commit.gpgsign=false commit -q --no-verify -m "snapshot of $ROOT for ansible-test"
    printf '%s\n' "$coll"
}

# Keep ansible-test's reports where a developer looks for them, then drop the copy.
finish_collection_copy() {
    local coll="$1"
    if [[ -d "$coll/tests/output" ]]; then
        mkdir -p "$ROOT/tests/output"
        rsync -a "$coll/tests/output/" "$ROOT/tests/output/"
    fi
    rm -rf "${coll%/ansible_collections/*}"
}

# Run ansible-test in the collection copy (the current directory). Its findings are scattered between pip
# and progress output; on failure, repeat them together at the end so the stage's result is easy to read.
run_ansible_test() {
    local log rc=0 lock=""
    log=$(mktemp "${TMPDIR:-/tmp}/devin-outposts-ansible-test-log.XXXXXX")
    if [[ $1 == sanity ]]; then
        # ansible-test sanity keeps its tools' venvs in ~/.ansible/test/venv/<tool>/<python>/, and deletes one it
        # finds without its marker as half made: two runs making the same venv break each other. One sanity run
        # per Python at a time (the test run primes these venvs in the background, prime_sanity_venvs).
        mkdir -p "$HOME/.ansible/test"
        exec {lock}>"$HOME/.ansible/test/.devin-outposts-sanity-$(python_of_args "$@").lock"
        flock "$lock"
    fi
    ansible-test "$@" 2>&1 | tee "$log" || rc=$?
    [[ -z "$lock" ]] || exec {lock}>&-
    if [[ $rc -ne 0 ]]; then
        say ""
        say "---- ansible-test $1: findings ----"
        grep -E '^(ERROR|FATAL): ' "$log" | grep -v '^FATAL: Command ' || say "(no ERROR lines; see the output above)"
        if grep -qE 'missing-gplv3-license|tests/sanity/ignore-' "$log"; then
            say "hint: after adding or removing a module or lookup, run scripts/sanity-ignores.sh"
        fi
    fi
    rm -f "$log"
    return "$rc"
}

# `ansible-test COMMAND` (sanity or units) with the dev venv's ansible-core and --venv, on a git snapshot of the
# working tree (make_collection_copy), whose reports are kept in tests/output (the sanity and units stages).
ansible_test_stage() {
    local command=$1
    shift
    ensure_env
    ensure_get_pip_standin
    SNAPSHOT=$(make_collection_copy)
    trap 'finish_collection_copy "$SNAPSHOT"' EXIT
    say "ansible-test $command ($(ansible --version | sed -n 1p)) in $SNAPSHOT"
    cd "$SNAPSHOT" || return 1
    run_ansible_test "$command" --venv --python "${OUTPOSTS_TEST_PYTHON:-3.11}" --color no "$@"
}

# The value of --python in an ansible-test command line ("default" without one).
python_of_args() {
    local previous="" arg
    for arg in "$@"; do
        if [[ $previous == --python ]]; then echo "$arg"; return 0; fi
        previous=$arg
    done
    echo default
}

# Make the venvs that `ansible-test sanity` will want, without running a test (ansible-test's --prime-venvs), on
# a collection copy: with the dev venv's ansible-core, or with a core's venv (core_venv) when a core is given.
# Mostly downloads: the test run does it in the background (scripts/test-hosts/prepare.sh) while the lint runs.
# A stamp in ~/.ansible/test/venv (gone with it) records each ansible-test release and Python primed there: those
# venvs are then only checked by the stage that uses them, not primed again (which costs a minute when warm).
prime_sanity_venvs() {
    local core=${1:-} venv="$VENV" pyver=${OUTPOSTS_TEST_PYTHON:-3.11} coll stamp rc=0
    if [[ -n "$core" ]]; then
        venv=$(core_venv "$core") || return 1
        pyver=$(core_python_version "$core")
    fi
    stamp="$HOME/.ansible/test/venv/.devin-outposts-primed-$("$venv/bin/ansible-test" --version | awk '{print $NF}')-python$pyver"
    if [[ -f "$stamp" ]]; then
        say "primed before: $stamp"
        return 0
    fi
    coll=$(make_collection_copy)
    # The core's venv first on PATH for this function only (exported locals, undone on return).
    local -x VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
    pushd "$coll" >/dev/null || return 1
    { ensure_get_pip_standin >/dev/null && run_ansible_test sanity --prime-venvs --venv --python "$pyver" --color no; } ||
        rc=$?
    popd >/dev/null || true
    rm -rf "${coll%/ansible_collections/*}"
    [[ $rc -ne 0 ]] || touch "$stamp"
    return "$rc"
}

# The ansible-core minors the collection supports and tests (scripts/core-matrix.sh), oldest first. Keep in
# step with requires_ansible in meta/runtime.yml and the README; scripts/sanity-ignores.sh writes one
# tests/sanity/ignore-<core>.txt for each.
# shellcheck disable=SC2034  # used by the scripts that source this file
CORE_VERSIONS=(2.16 2.17 2.18 2.19 2.20 2.21)

# The Python a core's matrix venv uses: 3.11 (the dev venv's) for the cores that support it, 3.12 for the
# cores that dropped 3.11 as a controller Python (2.20 and later).
core_python_version() {
    case "$1" in
        2.1[6-9]) echo 3.11 ;;
        *) echo 3.12 ;;
    esac
}

# The path of a working python<ver>: on PATH (not a pyenv shim that has no such version), else from pyenv's
# versions folder. Prints nothing when there is none.
find_python() {
    local ver=$1 candidate
    for candidate in "$(command -v "python$ver" 2>/dev/null || true)" "$HOME"/.pyenv/versions/"$ver".*/bin/"python$ver"; do
        [[ -n "$candidate" && -x "$candidate" ]] || continue
        if "$candidate" -c 'import ensurepip, venv' >/dev/null 2>&1; then
            printf '%s\n' "$candidate"
            return 0
        fi
    done
    return 0
}

# Where core_venv keeps one venv per core: .cache/core-matrix/<core>/venv (scripts/core-matrix.sh keeps its logs
# beside them; tests/roles/test_preflight_cores.py uses the same venvs).
CORE_VENV_CACHE="$ROOT/.cache/core-matrix"

# The venv of one core: prints its path; installs the newest ansible-core <core>.* from PyPI (with Python
# core_python_version <core>) when the venv's stamp does not match. Fails when there is no such Python.
# One maker at a time per core (a lock beside the venv): the test run makes the venvs ahead of the stages
# (scripts/test-hosts/prepare.sh) while the matrix and tests/roles (two pytest workers) may ask for the same one.
core_venv() {
    local core=$1 lock rc=0
    mkdir -p "$CORE_VENV_CACHE/$core"
    exec {lock}>"$CORE_VENV_CACHE/$core/.lock"
    flock "$lock"
    make_core_venv "$core" || rc=$?
    exec {lock}>&-
    return "$rc"
}

make_core_venv() {
    local core=$1 pyver py venv stamp want
    pyver=$(core_python_version "$core")
    py=$(find_python "$pyver")
    [[ -n "$py" ]] || { warn "no python$pyver for ansible-core $core (install it, e.g. with pyenv)"; return 1; }
    venv="$CORE_VENV_CACHE/$core/venv"
    stamp="$venv/.core-matrix-stamp"
    want="ansible-core==$core.* python$pyver $(sha256sum "$ROOT/tests/unit/requirements.txt" | cut -c1-16)"
    if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
        rm -rf "$venv"
        "$py" -m venv "$venv" >&2 || return 1
        "$venv/bin/python" -m pip install --disable-pip-version-check --no-input --quiet "ansible-core==$core.*" >&2 ||
            return 1
        printf '%s\n' "$want" >"$stamp"
    fi
    printf '%s\n' "$venv"
}

# The galaxy-importer release that checks the tarball (the tarball stage; tests/tarball/galaxy-importer.cfg).
# shellcheck disable=SC2034  # used by the scripts that source this file
GALAXY_IMPORTER_VERSION=0.4.44

# galaxy-importer's venv: prints its path. A venv of its own, cached in .cache/galaxy-importer (its pins, attrs<24
# and ansible-lint<=26.10.1, are not the dev venv's), with the dev venv's ansible-core; remade when the release,
# the core or the Python changes. One maker at a time (a lock): the test run makes it ahead of the tarball stage.
galaxy_importer_venv() {
    local venv="$ROOT/.cache/galaxy-importer" py=${OUTPOSTS_PYTHON:-python3.11} core want lock rc=0
    core=$("$VENV/bin/python" -c 'import ansible; print(ansible.__version__)') || return 1
    want="galaxy-importer==$GALAXY_IMPORTER_VERSION ansible-core==$core $("$py" -c 'import sys; print(sys.version)')"
    mkdir -p "$ROOT/.cache"
    exec {lock}>"$ROOT/.cache/galaxy-importer.lock"
    flock "$lock"
    if [[ ! -x "$venv/bin/python" || "$(cat "$venv/.stamp" 2>/dev/null)" != "$want" ]]; then
        say "installing galaxy-importer==$GALAXY_IMPORTER_VERSION into $venv" >&2
        rm -rf "$venv"
        {
            "$py" -m venv "$venv" &&
                "$venv/bin/python" -m pip install --disable-pip-version-check --no-input --quiet \
                    "galaxy-importer==$GALAXY_IMPORTER_VERSION" "ansible-core==$core" 2>&1 &&
                printf '%s\n' "$want" >"$venv/.stamp"
        } | { grep -v "^WARNING: Location '" >&2 || true; }
        [[ -f "$venv/.stamp" ]] || rc=1
    fi
    exec {lock}>&-
    [[ $rc -eq 0 ]] && printf '%s\n' "$venv"
    return "$rc"
}
