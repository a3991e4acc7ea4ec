#!/usr/bin/env bash
# Run docs/quickstart.md's commands as printed, in order, and fail on the first that fails: a manual check
# (root, a systemd-nspawn test host, PyPI for the guide's pip install; about 3 minutes), not a test stage.
#
#   sudo scripts/check-quickstart.sh
#
# The guide's ```sh blocks run in one bash (set -euo pipefail), with three changes, which the guide's last
# section states (and the check fails on a deprecation warning in their output):
#   - HOME is a scratch directory, so ~ and ~/.ansible/collections start empty;
#   - the simulator's port is a free one instead of 8787 (every 8787 in the commands is replaced), and its
#     output goes to a file;
#   - the worker host is a systemd-nspawn test host (scripts/test-hosts/nspawn-host.sh) without network: a
#     host_vars/worker1.yml written after the inventory reaches it over ssh through a ProxyCommand, and gives the
#     role the test hosts' wheelhouse; the simulator's port is relayed into the host's loopback.
# Everything started here (the test host, its relay, the simulator) is stopped at the end, by PID.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $(id -u) -eq 0 ]] || die "check-quickstart: must run as root (systemd-nspawn test host)"
ensure_env
CACHE=${DEVIN_OUTPOSTS_TEST_HOSTS:-/var/tmp/devin-outposts-test-hosts}
work=$(mktemp -d /var/tmp/devin-outposts-quickstart.XXXXXX)
export DEVIN_OUTPOSTS_TEST_HOSTS_RUN="$work/hosts"
host=qs-$(printf '%s' "$work" | sha256sum | cut -c1-8)
port=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

cleanup() {
    "$ROOT/scripts/test-hosts/nspawn-host.sh" stop "$host" >/dev/null 2>&1 || true
    if [[ -s "$work/sim.pid" ]]; then kill -TERM "$(cat "$work/sim.pid")" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

"$ROOT/scripts/test-hosts/build-images.sh" bookworm >/dev/null
"$ROOT/scripts/test-hosts/nspawn-host.sh" start "$host" bookworm >/dev/null
"$ROOT/scripts/test-hosts/nspawn-host.sh" relay "$host" "$port" "$port"

# The guide's commands, with the changes above.
python - "$ROOT/docs/quickstart.md" "$port" "$host" "$CACHE" "$ROOT" >"$work/quickstart.sh" <<'EOF'
import re, shlex, sys
guide, port, host, cache, root = sys.argv[1:]
blocks = re.findall(r"^```sh\n(.*?)^```", open(guide).read(), re.S | re.M)
host_vars = f"""mkdir -p host_vars
cat > host_vars/worker1.yml <<'HOSTVARS'
ansible_host: {host}
ansible_user: root
ansible_ssh_private_key_file: {cache}/ssh/id_ed25519
ansible_ssh_common_args: >-
  -o 'ProxyCommand={root}/scripts/test-hosts/nspawn-host.sh proxy {host}'
  -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o IdentitiesOnly=yes
ansible_python_interpreter: auto_silent
devin_outposts_worker_wheelhouse: {cache}/wheelhouse-py311
HOSTVARS
"""
print("set -euo pipefail")
print(f"cd {root}")
for block in blocks:
    block = block.replace("8787", port)
    if block.startswith("devin-outposts-sim serve"):
        # Its output to a file: a background job that keeps this script's stdout would keep tee waiting.
        block = block.replace(
            "--no-access-log &",
            f"--no-access-log --port {port} >\"$QUICKSTART_WORK/sim.log\" 2>&1 &\n"
            "echo $! > \"$QUICKSTART_WORK/sim.pid\"\nsleep 3",
        )
    print("echo " + shlex.quote("+++ " + block.splitlines()[0][:100]))
    print(block)
    if "group_vars/outpost_workers.yml" in block:
        print(host_vars)
EOF
say "check-quickstart: running $(grep -c "^echo '+++" "$work/quickstart.sh") blocks of docs/quickstart.md (simulator port $port)"
mkdir "$work/home"
env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME="$work/home" LANG=C.UTF-8 \
    QUICKSTART_WORK="$work" DEVIN_OUTPOSTS_TEST_HOSTS_RUN="$DEVIN_OUTPOSTS_TEST_HOSTS_RUN" \
    bash "$work/quickstart.sh" 2>&1 | tee "$work/quickstart.log" | grep -v "^WARNING: Location '"
# A guide whose commands print deprecation warnings is out of date (ansible -o printed two on ansible-core 2.21).
if grep -n "DEPRECATION WARNING" "$work/quickstart.log"; then
    die "check-quickstart: the guide's commands printed the deprecation warnings above"
fi
say "check-quickstart: every command of docs/quickstart.md ran, without a deprecation warning"
