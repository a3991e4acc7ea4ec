#!/usr/bin/env bash
# The demo: the collection's modules and the bundled worker serve a session from the embedded fleet
# simulator, on this machine only.
#
#   scripts/demo.sh             # or: make demo
#   scripts/demo.sh -v          # arguments go to ansible-playbook
#
# 1. bootstrap (apt packages if missing, .venv, requirements-dev.txt)
# 2. start `devin-outposts-sim serve` on a free loopback port, with its database in a temporary folder
# 3. issue an orchestrator-scope token through the simulator's admin API
# 4. run playbooks/demo.yml with DEVIN_API_URL and DEVIN_OUTPOSTS_TOKEN in the environment (never on argv);
#    the play starts `devin-outposts worker start` itself, once it has registered the outpost
# 5. stop the worker if the play left one running, stop the simulator and remove the temporary folder,
#    whatever happened
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_env
cd "$ROOT"

work=$(mktemp -d "${TMPDIR:-/tmp}/devin-outposts-demo.XXXXXX")
sim_pid=""
# The play stops its worker itself, also when a task fails; this is for an interrupted ansible-playbook.
stop_worker() {
    local pid
    pid=$(cat "$work/worker.pid" 2>/dev/null) || return 0
    # Only a process that is still our worker: the pid file outlives it (its command line names $work).
    grep -qaF "$work" "/proc/$pid/cmdline" 2>/dev/null || return 0
    # The second SIGTERM makes it stop its devin-remote at once instead of draining; it still releases.
    kill -TERM "$pid" 2>/dev/null || return 0
    sleep 0.5
    kill -TERM "$pid" 2>/dev/null || true
    for ((tries = 0; tries < 150; tries++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
    say "demo: worker stopped"
}
cleanup() {
    local rc=$?
    stop_worker
    if [[ $rc -ne 0 && -s "$work/worker.log" ]]; then
        say "demo: the worker's log (last lines):"
        tail -n 20 "$work/worker.log" | sed 's/^/  | /'
    fi
    if [[ -n "$sim_pid" ]] && kill -0 "$sim_pid" 2>/dev/null; then
        kill -TERM "$sim_pid" 2>/dev/null || true
        for ((tries = 0; tries < 50; tries++)); do kill -0 "$sim_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$sim_pid" 2>/dev/null || true
        wait "$sim_pid" 2>/dev/null || true
        say "demo: simulator stopped"
    fi
    if [[ $rc -ne 0 && -s "$work/sim.log" ]]; then
        say "demo: the simulator's log (last lines):"
        tail -n 20 "$work/sim.log" | sed 's/^/  | /'
    fi
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "demo: starting the fleet simulator"
devin-outposts-sim serve --host 127.0.0.1 --port 0 --port-file "$work/port" --db "$work/sim.db" \
    --admin-token-file "$work/admin-token" --no-access-log --log-level warning >"$work/sim.log" 2>&1 &
sim_pid=$!

for ((tries = 0; tries < 300; tries++)); do
    [[ -s "$work/port" ]] && break
    kill -0 "$sim_pid" 2>/dev/null || die "the simulator exited before it was listening"
    sleep 0.1
done
[[ -s "$work/port" ]] || die "the simulator did not report its port within 30 s"
url="http://127.0.0.1:$(tr -d '[:space:]' <"$work/port")"
say "demo: simulator listening at $url (pid $sim_pid)"

# The admin verbs read the admin token from this file; nothing secret goes on a command line.
export DEVIN_SIM_URL="$url"
export DEVIN_SIM_ADMIN_TOKEN_FILE="$work/admin-token"
DEVIN_OUTPOSTS_TOKEN=$(devin-outposts-sim token create --scope orchestrator --label demo)
[[ -n "$DEVIN_OUTPOSTS_TOKEN" ]] || die "the simulator issued an empty token"
export DEVIN_API_URL="$url" DEVIN_OUTPOSTS_TOKEN
say "demo: issued an orchestrator-scope token"

# The play keeps its repository, the worker's files and its own async job status in this folder.
export DEVIN_DEMO_DIR="$work" ANSIBLE_ASYNC_DIR="$work/ansible-async"
# The demo runs on the implicit localhost; say so once here rather than in two warnings. Results print as
# YAML, so a command's output reads as lines rather than one JSON string.
export ANSIBLE_LOCALHOST_WARNING=False ANSIBLE_INVENTORY_UNPARSED_WARNING=False
export ANSIBLE_CALLBACK_RESULT_FORMAT=yaml
if [[ -n "${CI:-}" ]]; then export ANSIBLE_NOCOLOR=1; fi
ansible-playbook playbooks/demo.yml "$@"
say "demo: done"
