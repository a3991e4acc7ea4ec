#!/usr/bin/env bash
# The collection as users install it: build the release (scripts/build.sh), check what the tarball holds, install
# it into a fresh collections path with a fresh venv that has only ansible-core (the dev venv's version) and the
# two wheels from dist/ (as the README's "Install" says), and, from that installed copy alone (nothing else on
# ANSIBLE_COLLECTIONS_PATH, the working directory outside the checkout):
#
#   1. ansible-doc on every module, lookup, filter and role: each must render without an error or warning;
#   2. tests/tarball/modules.yml: the modules, the lookup and the action group against devin-outposts-sim;
#   3. tests/tarball/worker.yml: the worker role converges a systemd-nspawn test host (scripts/test-hosts/), and
#      the worker it installed claims and serves a session. Needs root and cgroups (cannot_run otherwise).
#
#   scripts/test.sh tarball             # or: make tarball
#   TARBALL_KEEP=1 scripts/test.sh tarball   # keep the scratch folder (its path is printed)
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ensure_env
cd "$ROOT"

# Developer files that must never be in the tarball (extended regular expressions on the member paths).
DENY=(
    '^Makefile$' '^scripts/' '^extensions/molecule/' '^benchmarks/' '^python/' '^\.ci/' '^dist/'
    '(^|/)\.venv/' '(^|/)\.cache/' '(^|/)\.ansible/' '(^|/)__pycache__/' '\.pyc$' '\.egg-info(/|$)'
    '(^|/)\.(pytest|mypy|ruff|import_linter)_cache/' '\.tar\.gz$'
    '^\.gitignore$' '^\.shellcheckrc$' '^requirements-dev\.txt$' '^ruff\.toml$'
    '^pytest\.ini$' '^conftest\.py$'
    '^tests/(output|unit|integration|roles|orchestrator|tarball|eda)/' '^changelogs/fragments/' '^playbooks/demo\.yml$'
)
# What a user needs and must find.
REQUIRE=(
    '^MANIFEST\.json$' '^FILES\.json$' '^LICENSE$' '^README\.md$' '^meta/runtime\.yml$'
    '^roles/worker/files/wheels/devin_outposts-[^/]+-py3-none-any\.whl$' '^roles/worker/tasks/main\.yml$'
    '^roles/cli/tasks/main\.yml$' '^plugins/module_utils/_fleet_api\.py$' '^tests/sanity/ignore-2\.[0-9]+\.txt$'
    '^extensions/eda/plugins/event_source/outpost_queue\.py$' '^extensions/eda/rulebooks/autoscale_workers\.yml$'
    '^extensions/eda/rulebooks/provision_per_session\.yml$' '^meta/extensions\.yml$' '^playbooks/scale_workers\.yml$'
    # the AWX credential type (docs/awx.md); docs/examples/awx/configure.yml reads it from here
    '^credential_types/devin_outposts/input\.yml$' '^credential_types/devin_outposts/injectors\.yml$'
    # the lint configuration: ansible-lint on the installed copy needs its skip of var-naming[no-role-prefix]
    '^\.ansible-lint$'
)

work=$(mktemp -d "${TMPDIR:-/tmp}/devin-outposts-tarball.XXXXXX")
sim_pid=""
hosts_started=0
fleet_started=0
cleanup() {
    local rc=$?
    if [[ -n "$sim_pid" ]] && kill -0 "$sim_pid" 2>/dev/null; then
        kill -TERM "$sim_pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do kill -0 "$sim_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$sim_pid" 2>/dev/null || true
        wait "$sim_pid" 2>/dev/null || true
    fi
    if [[ $hosts_started -eq 1 ]]; then "$ROOT/scripts/test-hosts/nspawn-host.sh" stop tarball-bookworm || true; fi
    if [[ $fleet_started -eq 1 ]]; then "$ROOT/scripts/test-hosts/fleet-sim.sh" stop "$work/fleet" || true; fi
    if [[ $rc -ne 0 && -s "$work/sim.log" ]]; then
        say "the simulator's log (last lines):"
        tail -n 20 "$work/sim.log" | sed 's/^/  | /'
    fi
    if [[ "${TARBALL_KEEP:-0}" == 1 ]]; then say "kept $work"; else rm -rf "$work"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step() { say ""; say "-- tarball: $*"; }

# --- build and list -------------------------------------------------------------------------------------
step "make build"
"$ROOT/scripts/build.sh"
shopt -s nullglob
tarballs=("$ROOT"/dist/devin-outposts-*.tar.gz)
worker_wheels=("$ROOT"/dist/devin_outposts-*-py3-none-any.whl)
sim_wheels=("$ROOT"/dist/devin_outposts_sim-*-py3-none-any.whl)
shopt -u nullglob
[[ ${#tarballs[@]} -eq 1 && ${#worker_wheels[@]} -eq 1 && ${#sim_wheels[@]} -eq 1 ]] ||
    die "make build must leave one collection tarball and the two wheels in dist/"
tarball=${tarballs[0]}

step "what $(basename "$tarball") holds"
tar -tzf "$tarball" | sed 's|/$||' | LC_ALL=C sort >"$work/members"
bad=0
for pattern in "${DENY[@]}"; do
    if grep -E -- "$pattern" "$work/members" >"$work/hits"; then
        say "developer files in the tarball (pattern $pattern):"
        sed 's/^/  /' "$work/hits"
        bad=1
    fi
done
for pattern in "${REQUIRE[@]}"; do
    grep -qE -- "$pattern" "$work/members" || { say "missing from the tarball: $pattern"; bad=1; }
done
tar -xzf "$tarball" -C "$work" MANIFEST.json
if grep -q 'example\.invalid' "$work/MANIFEST.json"; then say "MANIFEST.json still names example.invalid"; bad=1; fi
say "$(wc -l <"$work/members") entries, $(stat -c %s "$tarball") bytes; by top-level folder:"
cut -d/ -f1 "$work/members" | uniq -c | sed 's/^/ /'
[[ $bad -eq 0 ]] || die "the tarball is not what users should get (see above; build_ignore in galaxy.yml)"

# --- a fresh venv and collections path, as a user has them --------------------------------------------------
core=$(python -c 'import ansible; print(ansible.__version__)')
step "a fresh venv: ansible-core==$core and the wheels from dist/"
uvenv="$work/venv"
# The dev venv's interpreter (scripts/bootstrap.sh: Python 3.11, OUTPOSTS_PYTHON overrides it).
"${OUTPOSTS_PYTHON:-python3.11}" -m venv "$uvenv"
"$uvenv/bin/python" -m pip install --disable-pip-version-check --no-input --quiet "ansible-core==$core" \
    "${worker_wheels[0]}" "${sim_wheels[0]}" 2>&1 | { grep -v "^WARNING: Location '" || true; }
worker_version=$(basename "${worker_wheels[0]}" | sed -E 's/^devin_outposts-([^-]+)-.*/\1/')

colls="$work/collections"
mkdir -p "$colls" "$work/run"
# The playbooks run from the scratch folder too: nothing is read from the checkout once the tarball exists.
cp "$ROOT/tests/tarball/modules.yml" "$ROOT/tests/tarball/worker.yml" "$work/run/"
: >"$work/ansible.cfg"
# Only the installed copy: no checkout on the path, no site-packages collections, no ansible.cfg of ours.
export PATH="$uvenv/bin:$PATH" VIRTUAL_ENV="$uvenv"
export ANSIBLE_COLLECTIONS_PATH="$colls" ANSIBLE_COLLECTIONS_SCAN_SYS_PATH=False ANSIBLE_CONFIG="$work/ansible.cfg"
export ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0 ANSIBLE_LOCALHOST_WARNING=False ANSIBLE_INVENTORY_UNPARSED_WARNING=False
export ANSIBLE_HOME="$work/ansible-home"
unset ANSIBLE_ROLES_PATH ANSIBLE_LIBRARY ANSIBLE_FILTER_PLUGINS ANSIBLE_LOOKUP_PLUGINS
cd "$work/run"
ansible-galaxy collection install --offline -p "$colls" "$tarball" >/dev/null
installed="$colls/ansible_collections/devin/outposts"
[[ -f "$installed/MANIFEST.json" ]] || die "ansible-galaxy did not install the tarball into $colls"
listed=$(ansible-galaxy collection list devin.outposts 2>/dev/null | grep -c '^devin\.outposts ' || true)
[[ "$listed" == 1 ]] || die "expected exactly one devin.outposts on the collections path, found $listed"
say "installed into $installed with $(ansible --version | sed -n 1p)"

# --- 1. ansible-doc -----------------------------------------------------------------------------------------
step "ansible-doc on every plugin and role of the installed copy"
names() {  # the plugin names of one type in the installed copy (source files, so that none can hide)
    local dir=$1 f
    for f in "$installed/$dir"/*; do
        case "$f" in */__init__.py) continue ;; *.py | *.yml) ;; *) continue ;; esac
        basename "${f%.*}"
    done | LC_ALL=C sort -u
}
doc_failed=0
run_doc() {
    local type=$1 name=$2 out rc=0
    out=$(ansible-doc -t "$type" "devin.outposts.$name" 2>&1 >/dev/null) || rc=$?
    if [[ $rc -ne 0 || "$out" == *ERROR* || "$out" == *WARNING* ]]; then
        say "  FAILED ansible-doc -t $type devin.outposts.$name (exit $rc):"
        printf '%s\n' "$out" | sed 's/^/    /'
        doc_failed=1
    else
        say "  ok     ansible-doc -t $type devin.outposts.$name"
    fi
}
n_doc=0
for name in $(names plugins/modules); do run_doc module "$name"; n_doc=$((n_doc + 1)); done
for name in $(names plugins/lookup); do run_doc lookup "$name"; n_doc=$((n_doc + 1)); done
# Filter plugins are documented by one .yml file per filter (plugins/filter/<name>.yml).
for name in $(for f in "$installed"/plugins/filter/*.yml; do basename "${f%.yml}"; done); do
    run_doc filter "$name"; n_doc=$((n_doc + 1))
done
for role in "$installed"/roles/*/; do run_doc role "$(basename "$role")"; n_doc=$((n_doc + 1)); done
[[ $doc_failed -eq 0 ]] || die "ansible-doc failed on the installed collection"
say "ansible-doc: $n_doc plugins and roles render"

# --- 2. the modules against the simulator -------------------------------------------------------------------
step "tests/tarball/modules.yml against devin-outposts-sim (installed from dist/)"
devin-outposts-sim serve --host 127.0.0.1 --port 0 --port-file "$work/sim.port" --db "$work/sim.db" \
    --admin-token-file "$work/sim.admin-token" --no-access-log --log-level warning >"$work/sim.log" 2>&1 &
sim_pid=$!
for ((i = 0; i < 300; i++)); do
    [[ -s "$work/sim.port" ]] && break
    kill -0 "$sim_pid" 2>/dev/null || die "devin-outposts-sim exited before it was listening"
    sleep 0.1
done
[[ -s "$work/sim.port" ]] || die "devin-outposts-sim did not report its port within 30 s"
DEVIN_SIM_URL="http://127.0.0.1:$(tr -d '[:space:]' <"$work/sim.port")"
export DEVIN_SIM_URL DEVIN_SIM_ADMIN_TOKEN_FILE="$work/sim.admin-token"
DEVIN_OUTPOSTS_TOKEN=$(devin-outposts-sim token create --scope orchestrator --label tarball)
TARBALL_ORG_ID=$(devin-outposts-sim org list | awk -F'\t' 'NR == 1 {print $1}')
[[ -n "$DEVIN_OUTPOSTS_TOKEN" && -n "$TARBALL_ORG_ID" ]] || die "the simulator gave no token or organization"
export DEVIN_OUTPOSTS_TOKEN TARBALL_ORG_ID DEVIN_API_URL="$DEVIN_SIM_URL"
ansible-playbook "$work/run/modules.yml"
kill -TERM "$sim_pid" 2>/dev/null || true
wait "$sim_pid" 2>/dev/null || true
sim_pid=""
unset DEVIN_OUTPOSTS_TOKEN DEVIN_API_URL TARBALL_ORG_ID

# --- 3. the worker role on a systemd test host --------------------------------------------------------------
step "tests/tarball/worker.yml: the worker role on a systemd-nspawn host"
[[ $(id -u) -eq 0 ]] || cannot_run "the worker role's converge needs root (systemd-nspawn test hosts)"
[[ -d /sys/fs/cgroup/systemd || -f /sys/fs/cgroup/cgroup.controllers ]] ||
    cannot_run "no cgroup hierarchy for systemd-nspawn"
test_hosts="$ROOT/scripts/test-hosts"
cache=${DEVIN_OUTPOSTS_TEST_HOSTS:-/var/tmp/devin-outposts-test-hosts}
"$test_hosts/build-images.sh" bookworm
fleet_started=1
"$test_hosts/fleet-sim.sh" start "$work/fleet" >/dev/null
sim_json="$work/fleet/sim.json"
json_field() { python -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$sim_json" "$1"; }
hosts_started=1
"$test_hosts/nspawn-host.sh" start tarball-bookworm bookworm >/dev/null
"$test_hosts/nspawn-host.sh" relay tarball-bookworm 8787 "$(json_field port)"
"$test_hosts/nspawn-host.sh" relay tarball-bookworm 8788 "$(json_field static_port)"
export DEVIN_SIM_URL TARBALL_SIM_URL DEVIN_SIM_ADMIN_TOKEN_FILE
DEVIN_SIM_URL=$(json_field url)
TARBALL_SIM_URL=$DEVIN_SIM_URL
DEVIN_SIM_ADMIN_TOKEN_FILE=$(json_field admin_token_file)
TARBALL_ORCHESTRATOR_TOKEN=$(devin-outposts-sim token create --scope orchestrator --label tarball)
TARBALL_MACHINE_TOKEN=$(devin-outposts-sim token create --scope machine --label tarball-worker)
export TARBALL_ORCHESTRATOR_TOKEN TARBALL_MACHINE_TOKEN TARBALL_WORKER_VERSION="$worker_version"
export TARBALL_WHEELHOUSE="$cache/wheelhouse-py311"  # bookworm's Python 3.11
cat >"$work/inventory.yml" <<EOF
workers:
  hosts:
    tarball-bookworm:
      ansible_host: tarball-bookworm
      ansible_user: root
      ansible_ssh_private_key_file: $cache/ssh/id_ed25519
      ansible_ssh_common_args: >-
        -o 'ProxyCommand=$test_hosts/nspawn-host.sh proxy %h' -o StrictHostKeyChecking=no
        -o UserKnownHostsFile=/dev/null -o IdentitiesOnly=yes -o ControlPath=$work/cp-%C
      ansible_python_interpreter: auto_silent
EOF
ansible-playbook -i "$work/inventory.yml" "$work/run/worker.yml"
say ""
say "tarball: the installed collection documented, ran its modules and converged the worker role"
