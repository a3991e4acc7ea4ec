#!/usr/bin/env bash
# The collection as users install it: build the release in a fresh copy of the tree, as a user's clone has it
# (no .venv: scripts/build.sh must need only its build venv), check what the tarball holds and that it records
# its release, run Galaxy's importer on it, install it into a fresh collections path with a fresh venv that has
# only ansible-core (the dev venv's version) and the two wheels from dist/ (as the README's "Install" says), and,
# from that installed copy alone (nothing else on ANSIBLE_COLLECTIONS_PATH, the working directory outside the
# checkout):
#
#   1. ansible-doc on every module, lookup, filter and role: each must render without an error or warning;
#   2. tests/tarball/modules.yml: the modules, the lookup and the action group against devin-outposts-sim;
#   3. the README's first deployment: the installed docs/examples/site.yml, with the installed example
#      inventory's group_vars and one systemd-nspawn test host (scripts/test-hosts/) in it, an orchestrator
#      token on the controller and a machine token for the hosts; then tests/tarball/first_deployment.yml checks
#      the outposts through the API, that the worker the role installed claims and serves a session, and that
#      the host holds the machine token and nowhere the orchestrator token. Needs root and cgroups (cannot_run
#      otherwise).
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
    '^tests/(output|unit|integration|roles|orchestrator|tarball|eda|windows)/' '^tests/(conftest|prerequisites)\.py$'
    '^changelogs/fragments/' '^playbooks/demo\.yml$'
    # a nested collection is test-only (tests/windows/collection: the ansible.windows stand-ins)
    '(^|/)ansible_collections/'
)
# What a user needs and must find.
REQUIRE=(
    '^MANIFEST\.json$' '^FILES\.json$' '^LICENSE$' '^README\.md$' '^meta/runtime\.yml$'
    '^roles/worker/files/wheels/devin_outposts-[^/]+-py3-none-any\.whl$' '^roles/worker/tasks/main\.yml$'
    '^roles/cli/tasks/main\.yml$' '^plugins/module_utils/_fleet_api\.py$' '^tests/sanity/ignore-2\.[0-9]+\.txt$'
    '^extensions/eda/plugins/event_source/outpost_queue\.py$' '^extensions/eda/rulebooks/autoscale_workers\.yml$'
    '^extensions/eda/rulebooks/provision_per_session\.yml$' '^meta/extensions\.yml$' '^playbooks/scale_workers\.yml$'
    # what the event source loads by path from the installed collection (docs/eda.md, "What the source shares")
    '^plugins/plugin_utils/_fleet_stream\.py$' '^plugins/plugin_utils/_fleet_backoff\.py$'
    '^plugins/plugin_utils/_fleet_listwatch\.py$' '^plugins/plugin_utils/_outpost_queue_options\.py$'
    '^plugins/plugin_utils/_outpost_queue_replies\.py$' '^plugins/plugin_utils/_outpost_queue_cursor\.py$'
    '^plugins/plugin_utils/_outpost_queue_events\.py$'
    # the AWX credential type (docs/awx.md); docs/examples/awx/configure.yml reads it from here
    '^credential_types/devin_outposts/input\.yml$' '^credential_types/devin_outposts/injectors\.yml$'
    # Galaxy's importer refuses a role without a README; the release history; the README's first deployment
    '^roles/cli/README\.md$' '^roles/worker/README\.md$' '^roles/orchestrator/README\.md$'
    '^CHANGELOG\.md$' '^changelogs/changelog\.yaml$'
    '^docs/examples/site\.yml$' '^docs/examples/inventory/hosts\.yml$' '^docs/examples/requirements\.yml$'
    # the lint configuration: ansible-lint on the installed copy needs its skip of var-naming[no-role-prefix]
    '^\.ansible-lint$'
    # the private role the worker and orchestrator roles import, and the lint decision about its name
    '^roles/_common/tasks/venv\.yml$' '^roles/_common/README\.md$' '^\.ansible-lint-ignore$'
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

# --- make build in a fresh copy of the tree -----------------------------------------------------------------
# What git would commit (uncommitted edits included; ignored files such as .venv and .cache not), as the one
# commit of a new repository: a user's fresh clone. make build runs there with the dev venv off PATH and, in
# front of the system's package and container tools, stand-ins that record any call: building needs neither,
# nor a .venv.
step "make build in a fresh copy of the tree, with only the build venv"
fresh="$work/checkout"
mkdir -p "$fresh"
git -C "$ROOT" ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do if [[ -e "$ROOT/$f" || -L "$ROOT/$f" ]]; then printf '%s\0' "$f"; fi; done |
    rsync -a --from0 --files-from=- "$ROOT/" "$fresh/"
git -C "$fresh" init -q
git -C "$fresh" add -A
git -C "$fresh" -c user.name=devin-outposts-tests -c user.email=tests@devin-outposts.invalid \
    -c commit.gpgsign=false commit -q --no-verify -m "snapshot of $ROOT for the tarball stage"
shims="$work/shims"
mkdir -p "$shims"
for tool in apt-get apt dpkg dpkg-query sudo podman; do
    printf '#!/bin/sh\necho "%s $*" >>"%s"\nexit 1\n' "$tool" "$work/shims.log" >"$shims/$tool"
    chmod +x "$shims/$tool"
done
clean_path=$(tr ':' '\n' <<<"$PATH" | grep -vxF "$VENV/bin" | paste -sd:)
# The build venv is cached in this checkout's .cache (its stamp follows requirements-dev.txt and build.sh).
build_venv="$ROOT/.cache/build-venv"
build_rc=0
env -u VIRTUAL_ENV -u OUTPOSTS_BOOTSTRAPPED -u OUTPOSTS_SKIP_APT -u ANSIBLE_COLLECTIONS_PATH -u ANSIBLE_CONFIG \
    PATH="$shims:$clean_path" OUTPOSTS_BUILD_VENV="$build_venv" make -C "$fresh" --no-print-directory build ||
    build_rc=$?
bad=0
if [[ $build_rc -ne 0 ]]; then say "make build failed (exit $build_rc)"; bad=1; fi
if [[ -s "$work/shims.log" ]]; then
    say "make build called system tools it must not need:"
    sed 's/^/  /' "$work/shims.log"
    bad=1
fi
if [[ -e "$fresh/.venv" ]]; then say "make build created the development venv, $fresh/.venv"; bad=1; fi
# Every distribution in the build venv is a build tool or what one of them requires (pip aside).
[[ -x "$build_venv/bin/python" ]] || die "make build must need only its build venv (scripts/build.sh), and made none"
"$build_venv/bin/python" - ansible-core setuptools antsibull-changelog <<'PY' || bad=1
import importlib.metadata
import re
import sys

from packaging.requirements import Requirement


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


installed = {norm(d.metadata["Name"]): d for d in importlib.metadata.distributions()}
needed, todo = set(), [norm(name) for name in sys.argv[1:]]
while todo:
    name = todo.pop()
    if name not in needed:
        needed.add(name)
        for line in installed[name].requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(norm(requirement.name))
extra = sorted(set(installed) - needed - {"pip"})
if extra:
    sys.exit(f"build venv: not needed to build: {' '.join(extra)}")
print(f"build venv: {len(installed)} distributions, each needed by {', '.join(sys.argv[1:])} (or pip)")
PY
[[ $bad -eq 0 ]] || die "make build must need only its build venv (scripts/build.sh)"
shopt -s nullglob
tarballs=("$fresh"/dist/devin-outposts-*.tar.gz)
worker_wheels=("$fresh"/dist/devin_outposts-*-py3-none-any.whl)
sim_wheels=("$fresh"/dist/devin_outposts_sim-*-py3-none-any.whl)
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

step "the release recorded in $(basename "$tarball")'s changelogs/changelog.yaml"
python "$ROOT/scripts/release.py" check-tarball "$tarball"

# --- Galaxy's importer --------------------------------------------------------------------------------------
# galaxy-importer (galaxy_importer_venv in scripts/lib.sh), configured by tests/tarball/galaxy-importer.cfg to
# run here: no ansible-test container; ansible-doc and ansible-lint as Galaxy runs them. It fails on what Galaxy
# refuses (a role without README.md, a bad MANIFEST, an unloadable plugin).
core=$(python -c 'import ansible; print(ansible.__version__)')
step "galaxy-importer $GALAXY_IMPORTER_VERSION on $(basename "$tarball")"
importer_venv=$(galaxy_importer_venv) || die "cannot make galaxy-importer's venv"
mkdir -p "$work/importer/home"
rc=0
(
    cd "$work/importer"
    env -u ANSIBLE_COLLECTIONS_PATH -u ANSIBLE_CONFIG -u VIRTUAL_ENV PATH="$importer_venv/bin:$PATH" \
        HOME="$work/importer/home" ANSIBLE_HOME="$work/importer/home/.ansible" \
        GALAXY_IMPORTER_CONFIG="$ROOT/tests/tarball/galaxy-importer.cfg" \
        "$importer_venv/bin/python" -m galaxy_importer.main "$tarball"
) >"$work/importer.log" 2>&1 || rc=$?
if [[ $rc -ne 0 ]] || grep -q '^ERROR' "$work/importer.log" ||
    ! grep -q '^Importer processing completed successfully' "$work/importer.log"; then
    say "galaxy-importer's log:"
    grep -v "^WARNING: Location '" "$work/importer.log" | sed 's/^/  | /'
    die "galaxy-importer rejected $(basename "$tarball") (exit $rc)"
fi
say "galaxy-importer's warnings (Galaxy shows them, and imports):"
grep -E '^WARNING' "$work/importer.log" | grep -v "^WARNING: Location '" | sed 's/^/  | /' || say "  | (none)"
# Its result lists every role of the tarball, each with its README.
python - "$work/importer/importer_result.json" "$work/members" <<'PY' || die "galaxy-importer's result is incomplete"
import json
import sys

with open(sys.argv[1], encoding="utf-8") as handle:
    result = json.load(handle)
with open(sys.argv[2], encoding="utf-8") as handle:
    roles = sorted({m.split("/")[1] for m in handle.read().split() if m.startswith("roles/") and m.count("/") >= 2})
found = {c["content_name"]: bool(c.get("readme_html")) for c in result["docs_blob"]["contents"]
         if c["content_type"] == "role"}
missing = [role for role in roles if not found.get(role)]
if missing:
    sys.exit(f"galaxy-importer found no README for the roles {missing}")
print(f"galaxy-importer: imported; roles {', '.join(roles)}, each with its README; "
      f"requires_ansible {result['requires_ansible']}")
PY

# --- a fresh venv and collections path, as a user has them --------------------------------------------------
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
cp "$ROOT/tests/tarball/modules.yml" "$ROOT/tests/tarball/first_deployment.yml" "$work/run/"
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

# --- 3. the README's first deployment on a systemd test host --------------------------------------------------
step "the README's first deployment: the installed docs/examples/site.yml on a systemd-nspawn host"
[[ $(id -u) -eq 0 ]] || cannot_run "the first deployment's converge needs root (systemd-nspawn test hosts)"
[[ -d /sys/fs/cgroup/systemd || -f /sys/fs/cgroup/cgroup.controllers ]] ||
    cannot_run "no cgroup hierarchy for systemd-nspawn"
examples="$installed/docs/examples"
[[ -f "$examples/site.yml" && -d "$examples/inventory/group_vars" ]] ||
    die "the installed collection has no docs/examples (README, \"A first deployment\")"
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
export DEVIN_SIM_URL DEVIN_SIM_ADMIN_TOKEN_FILE
DEVIN_SIM_URL=$(json_field url)
DEVIN_SIM_ADMIN_TOKEN_FILE=$(json_field admin_token_file)
# The README's two tokens: orchestrator scope on the controller, machine scope for the hosts.
orchestrator_token=$(devin-outposts-sim token create --scope orchestrator --label tarball-controller)
machine_token=$(devin-outposts-sim token create --scope machine --label tarball-hosts)
[[ -n "$orchestrator_token" && -n "$machine_token" ]] || die "the simulator gave no tokens"

# The example's inventory as a user adapts it: the installed group_vars as they are; the test host in one of its
# groups (gpu_workers: one instance, main, on gpu-h200); and host_vars with only what this host cannot do
# without: how Ansible reaches it, where it reaches the API and the stand-in devin-remote (relays into its
# loopback) and, since it has no network, the worker's dependencies from a wheelhouse and no extra packages.
inventory="$work/inventory"
mkdir -p "$inventory/host_vars"
cp -r "$examples/inventory/group_vars" "$inventory/"
cat >"$inventory/hosts.yml" <<YAML
outpost_workers:
  children:
    gpu_workers:
      hosts:
        tarball-bookworm:
YAML
cat >"$inventory/host_vars/tarball-bookworm.yml" <<YAML
ansible_host: tarball-bookworm
ansible_user: root
ansible_ssh_private_key_file: $cache/ssh/id_ed25519
ansible_ssh_common_args: >-
  -o 'ProxyCommand=$test_hosts/nspawn-host.sh proxy %h' -o StrictHostKeyChecking=no
  -o UserKnownHostsFile=/dev/null -o IdentitiesOnly=yes -o ControlPath=$work/cp-%C
ansible_python_interpreter: auto_silent
devin_outposts_worker_api_url: http://127.0.0.1:8787
devin_outposts_worker_controller_api_url: $DEVIN_SIM_URL
devin_outposts_worker_static_base_url: http://127.0.0.1:8788/
devin_outposts_worker_wheelhouse: $cache/wheelhouse-py311
devin_outposts_worker_extra_packages: []
YAML
say "inventory: the installed group_vars ($(cd "$inventory/group_vars" && echo *)); tarball-bookworm in gpu_workers"
# The README's commands, from the scratch folder, on the installed copy.
DEVIN_API_URL=$DEVIN_SIM_URL DEVIN_OUTPOSTS_TOKEN=$orchestrator_token DEVIN_OUTPOSTS_MACHINE_TOKEN=$machine_token \
    ansible-playbook -i "$inventory" "$examples/site.yml"
DEVIN_API_URL=$DEVIN_SIM_URL TARBALL_ORCHESTRATOR_TOKEN=$orchestrator_token TARBALL_MACHINE_TOKEN=$machine_token \
    TARBALL_WORKER_VERSION=$worker_version ansible-playbook -i "$inventory" "$work/run/first_deployment.yml"
say ""
say "tarball: the installed collection passed Galaxy's importer, documented itself, ran its modules and the"
say "README's first deployment"
