#!/usr/bin/env bash
# The fleet simulator and a stand-in devin-remote distribution, on this machine's loopback, for the Molecule
# scenarios. The test hosts reach them through nspawn-host.sh relays (127.0.0.1:8787 and :8788 in each host).
#
#   fleet-sim.sh start DIR    start both; writes DIR/sim.json {url, static_url, admin_token_file, pids}
#   fleet-sim.sh stop DIR     stop both, by their recorded PIDs
#
# The stand-in remote is a shell script published as the worker expects (latest_linux_x64,
# devin-remote_<sha>_linux_x64 and its .sha256). When served it logs one line naming the session, writes
# $DEVIN_REMOTE_STATE_DIR/served, and runs until the worker stops it. The simulator's own stand-in (a Python
# script that runs the brain's tool calls: `devin_outposts_sim call`) is published beside it, not as latest:
# a session queued with --remote-binary-sha <sim.json's standin_sha> gets it.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cmd=${1:?usage: fleet-sim.sh start|stop DIR}
dir=$(realpath -m "${2:?state dir}")
PY=$ROOT/.venv/bin/python

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }

case "$cmd" in
start)
    mkdir -p "$dir/static"
    if [[ -f "$dir/sim.pid" ]] && kill -0 "$(cat "$dir/sim.pid")" 2>/dev/null; then exit 0; fi
    cat >"$dir/static/remote.sh" <<'SH'
#!/bin/sh
# Stand-in devin-remote for the Molecule scenarios.
echo "stand-in devin-remote serving session $DEVIN_OUTPOST_SESSION_ID"
echo "$DEVIN_OUTPOST_SESSION_ID" >"$DEVIN_REMOTE_STATE_DIR/served"
trap 'echo "stand-in devin-remote stopping session $DEVIN_OUTPOST_SESSION_ID"; exit 0' TERM INT
while :; do sleep 1; done
SH
    sha=$(sha256sum "$dir/static/remote.sh" | cut -c1-40)
    cp "$dir/static/remote.sh" "$dir/static/devin-remote_${sha}_linux_x64"
    sha256sum "$dir/static/devin-remote_${sha}_linux_x64" | cut -d' ' -f1 >"$dir/static/devin-remote_${sha}_linux_x64.sha256"
    printf '%s\n' "$sha" >"$dir/static/latest_linux_x64"
    "$PY" -c 'import sys; from devin_outposts_sim.state.dist import standin_bytes; sys.stdout.buffer.write(standin_bytes())' \
        >"$dir/static/standin.py"
    standin_sha=$(sha256sum "$dir/static/standin.py" | cut -c1-40)
    cp "$dir/static/standin.py" "$dir/static/devin-remote_${standin_sha}_linux_x64"
    sha256sum "$dir/static/devin-remote_${standin_sha}_linux_x64" | cut -d' ' -f1 \
        >"$dir/static/devin-remote_${standin_sha}_linux_x64.sha256"
    rm -f "$dir/sim.port"
    setsid "$PY" -m devin_outposts_sim serve --db "$dir/sim.db" --port 0 --port-file "$dir/sim.port" \
        --admin-token-file "$dir/sim.admin-token" --claim-ttl 30 --no-access-log </dev/null >"$dir/sim.log" 2>&1 &
    echo $! >"$dir/sim.pid"
    static_port=$(free_port)
    setsid "$PY" -m http.server --bind 127.0.0.1 --directory "$dir/static" "$static_port" </dev/null >"$dir/static.log" 2>&1 &
    echo $! >"$dir/static.pid"
    for ((try = 0; try < 100; try++)); do [[ -s "$dir/sim.port" ]] && break; sleep 0.1; done
    [[ -s "$dir/sim.port" ]] || { cat "$dir/sim.log" >&2; exit 1; }
    printf '{"url": "http://127.0.0.1:%s", "port": %s, "static_port": %s, "admin_token_file": "%s", "remote_sha": "%s", "standin_sha": "%s"}\n' \
        "$(cat "$dir/sim.port")" "$(cat "$dir/sim.port")" "$static_port" "$dir/sim.admin-token" "$sha" "$standin_sha" \
        >"$dir/sim.json"
    cat "$dir/sim.json"
    ;;
stop)
    for f in sim static; do
        [[ -f "$dir/$f.pid" ]] || continue
        pid=$(cat "$dir/$f.pid")
        kill -TERM "$pid" 2>/dev/null || true
        for ((try = 0; try < 50; try++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        rm -f "$dir/$f.pid"
    done
    ;;
*) echo "fleet-sim: unknown command $cmd" >&2; exit 2 ;;
esac
