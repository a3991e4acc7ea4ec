#!/usr/bin/env bash
# Set up everything the demo and the test suite need, on a fresh Debian 12 machine or an existing checkout.
#
#   scripts/bootstrap.sh          # idempotent; about a second when nothing changed
#
# 1. Debian packages (git, rsync, python3-venv, shellcheck; podman, runc and catatonit for the podman
#    orchestrator driver's tests), installed only when missing, and podman's configuration for machines
#    like ours (a drop-in, see podman_config below).
# 2. .venv with Python 3.11 (override with OUTPOSTS_PYTHON=/path/to/python3.11).
# 3. requirements-dev.txt installed into it, skipped when the stamp of the requirements hash matches.
# 4. The collections that only our tests and examples use (awx.awx for the AWX configuration-as-code playbook,
#    ansible.windows and community.windows for the roles' Windows branch), taken out of the pinned 'ansible'
#    wheel from PyPI (Galaxy is unreachable here) into .cache/collections, which scripts/lib.sh puts on
#    ANSIBLE_COLLECTIONS_PATH. The collection itself depends on none of them (galaxy.yml).
#
# Environment: OUTPOSTS_SKIP_APT=1 skips step 1 (for machines where someone else manages packages).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
PY_DIR="$ROOT/python"
STAMP="$VENV/.devin-outposts-requirements.sha256"
PYTHON="${OUTPOSTS_PYTHON:-python3.11}"
# runc and catatonit by name: apt would pick crun for podman's "crun | runc", and catatonit (podman
# --init, which the podman driver uses) is only a recommendation.
# openjdk-17-jre-headless: ansible-rulebook (the eda stage) runs its rules engine, Drools, on Java 17.
# nftables, iproute2, util-linux: the network-policy sandbox (nft, ip, unshare) and its tests.
# openssh-server, openssh-client: git over SSH through a confined session (the test starts its own sshd on
# loopback; the system's ssh service that installing the package starts is stopped and disabled again).
APT_PACKAGES=(git rsync python3-venv shellcheck podman runc catatonit openjdk-17-jre-headless nftables iproute2 util-linux
    openssh-server openssh-client)
# shared/reference/test-hosts.md, Recipe A: podman's default ulimits exceed the hard limits of our machines
# (setrlimit fails), and crun refuses their hybrid cgroup layout. A drop-in, so that a containers.conf of
# the machine's own stays as it is; podman reads containers.conf.d since 4.x.
PODMAN_DROPIN=/etc/containers/containers.conf.d/50-devin-outposts.conf
PODMAN_CONFIG='# Written by devin.outposts scripts/bootstrap.sh (shared/reference/test-hosts.md, Recipe A).
[containers]
default_ulimits = ["nofile=10000:10000", "nproc=10000:10000"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"'

# The community package the test collections come from, pinned by version and hash.
ANSIBLE_WHEEL=ansible-12.3.0-py3-none-any.whl
ANSIBLE_WHEEL_SHA256=cd156f82fa87f7a899212b0efa9f7ca3a24d609212de9f78428a572eb01e5414
TEST_COLLECTIONS=(awx/awx ansible/windows community/windows)
COLLECTIONS_DIR="$ROOT/.cache/collections/ansible_collections"

log() { printf 'bootstrap: %s\n' "$*"; }
die() { printf 'bootstrap: ERROR: %s\n' "$*" >&2; exit 1; }

install_apt_packages() {
    [[ "${OUTPOSTS_SKIP_APT:-0}" == 1 ]] && return 0
    command -v dpkg-query >/dev/null 2>&1 || { log "no dpkg here; make sure ${APT_PACKAGES[*]} are installed"; return 0; }
    local missing=() pkg
    for pkg in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null 2>&1 || die "missing Debian packages ${missing[*]}; install them as root"
        sudo=(sudo -n)
    fi
    log "installing Debian packages: ${missing[*]}"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    if [[ " ${missing[*]} " == *" openssh-server "* ]]; then
        # Only the tests' own sshd should listen: no system sshd on port 22 because of this script (with
        # systemd as PID 1 through systemctl, else through the init script the package installed).
        if [[ -d /run/systemd/system ]]; then
            "${sudo[@]}" systemctl disable --now ssh.service ssh.socket >/dev/null 2>&1 || true
        elif command -v service >/dev/null 2>&1; then
            "${sudo[@]}" service ssh stop >/dev/null 2>&1 || true
        fi
    fi
}

podman_config() {
    [[ "${OUTPOSTS_SKIP_APT:-0}" == 1 ]] && return 0
    command -v podman >/dev/null 2>&1 || return 0
    [[ -f "$PODMAN_DROPIN" && "$(cat "$PODMAN_DROPIN")" == "$PODMAN_CONFIG" ]] && return 0
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null 2>&1 || { log "WARNING: cannot write $PODMAN_DROPIN without root"; return 0; }
        sudo=(sudo -n)
    fi
    log "writing $PODMAN_DROPIN"
    "${sudo[@]}" mkdir -p "$(dirname "$PODMAN_DROPIN")"
    printf '%s\n' "$PODMAN_CONFIG" | "${sudo[@]}" tee "$PODMAN_DROPIN" >/dev/null
}

# Unpack TEST_COLLECTIONS from the pinned ansible wheel; a stamp keeps the second run to a file read.
install_test_collections() {
    local stamp="$COLLECTIONS_DIR/.from-$ANSIBLE_WHEEL-${TEST_COLLECTIONS[*]//\//.}"
    [[ -f "$stamp" ]] && return 0
    local tmp
    tmp=$(mktemp -d)
    log "unpacking ${TEST_COLLECTIONS[*]} from $ANSIBLE_WHEEL"
    "$VENV/bin/python" -m pip download --disable-pip-version-check --no-input --quiet --no-deps \
        -d "$tmp" "ansible==$(echo "$ANSIBLE_WHEEL" | cut -d- -f2)"
    echo "$ANSIBLE_WHEEL_SHA256  $tmp/$ANSIBLE_WHEEL" | sha256sum --check --quiet ||
        die "$ANSIBLE_WHEEL does not match its pinned sha256"
    "$VENV/bin/python" - "$tmp/$ANSIBLE_WHEEL" "$COLLECTIONS_DIR" "${TEST_COLLECTIONS[@]}" <<'PY'
import os
import shutil
import sys
import zipfile

wheel, dest, wanted = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(wheel) as archive:
    for name in wanted:
        prefix = f"ansible_collections/{name}/"
        members = [m for m in archive.namelist() if m.startswith(prefix)]
        if not members:
            sys.exit(f"{name} is not in {os.path.basename(wheel)}")
        target = os.path.join(dest, name)
        shutil.rmtree(target, ignore_errors=True)
        for member in members:
            path = os.path.join(dest, member[len("ansible_collections/"):])
            if member.endswith("/"):
                continue
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with archive.open(member) as src, open(path, "wb") as out:
                shutil.copyfileobj(src, out)
PY
    rm -rf "$tmp"
    rm -f "$COLLECTIONS_DIR"/.from-*
    : >"$stamp"
}

requirements_hash() {
    {
        "$VENV/bin/python" -c 'import sys; print(sys.version)'
        cat "$ROOT/requirements-dev.txt" "$PY_DIR"/*/pyproject.toml "${BASH_SOURCE[0]}"
    } | sha256sum | cut -d' ' -f1
}

venv_is_usable() {
    [[ -x "$VENV/bin/python" ]] &&
        "$VENV/bin/python" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null
}

main() {
    cd "$ROOT"
    install_apt_packages
    podman_config

    mkdir -p "$ROOT/.cache"
    # Two stages started at once must not install into the same venv concurrently.
    exec 9>"$ROOT/.cache/bootstrap.lock"
    flock 9

    if ! venv_is_usable; then
        command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (set OUTPOSTS_PYTHON to a Python 3.11 interpreter)"
        "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' ||
            die "$PYTHON is not Python 3.11 (ansible-core 2.19 is the newest core for 3.11; set OUTPOSTS_PYTHON)"
        [[ -e "$VENV" ]] && { log "recreating $VENV (not a Python 3.11 venv)"; rm -rf "$VENV"; }
        log "creating $VENV with $("$PYTHON" -c 'import sys; print(sys.executable)')"
        "$PYTHON" -m venv "$VENV"
    fi

    local want
    want=$(requirements_hash)
    if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
        log "up to date ($VENV)"
        install_test_collections
        return 0
    fi
    log "installing requirements-dev.txt into $VENV"
    local start=$SECONDS
    rm -f "$STAMP"
    "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input --quiet -r "$ROOT/requirements-dev.txt"
    "$VENV/bin/python" -m pip check >/dev/null 2>&1 || { log "WARNING: pip check reports conflicts:"; "$VENV/bin/python" -m pip check || true; }
    printf '%s\n' "$want" >"$STAMP"
    install_test_collections
    log "installed in $((SECONDS - start)) s: $("$VENV/bin/ansible" --version | sed -n 1p)"
}

main "$@"
