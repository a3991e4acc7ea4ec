#!/usr/bin/env bash
# Build the systemd test-host root filesystems that the Molecule scenarios boot with systemd-nspawn, plus the
# SSH key and the per-Python wheelhouses they use. Idempotent: what is already built is kept.
#
#   scripts/test-hosts/build-images.sh                 # bookworm and trixie
#   scripts/test-hosts/build-images.sh bookworm        # only some suites
#   DEVIN_OUTPOSTS_TEST_HOSTS=/var/tmp/x scripts/...   # another cache directory
#   DEVIN_OUTPOSTS_TEST_HOSTS_REBUILD=1 ...            # rebuild the root filesystems
#
# The recipe: a base root filesystem by debootstrap minbase,
# timers masked (idempotence), libnss-myhostname and emptied /etc/hostname and /etc/resolv.conf (no 20 s
# stall in sudo or name lookups). The hosts get no network: Molecule reaches them with ssh through
# `nsenter -n socat`, and the tests relay only the ports they create (see scripts/test-hosts/nspawn-host.sh).
set -euo pipefail

CACHE=${DEVIN_OUTPOSTS_TEST_HOSTS:-/var/tmp/devin-outposts-test-hosts}
SUITES=("$@")
[[ ${#SUITES[@]} -eq 0 ]] && SUITES=(bookworm trixie)
# Bump when the recipe below changes: every cached root filesystem is then rebuilt.
RECIPE_VERSION=2
INCLUDE=systemd,systemd-sysv,dbus,python3,python3-apt,python3-venv,sudo,openssh-server,iproute2,nftables,ca-certificates,procps,libnss-myhostname,git

say() { printf 'build-images: %s\n' "$*"; }

[[ $(id -u) -eq 0 ]] || { echo "build-images: must run as root (debootstrap, systemd-nspawn)" >&2; exit 1; }

mkdir -p "$CACHE"
# One build of each thing at a time per cache: parallel runs (other checkouts, other scenarios, the test run's
# own early build in scripts/test-hosts/prepare.sh) wait here, then find it built and stamped, instead of
# deleting each other's half-built root filesystems. A lock per suite, so that a run that needs only bookworm
# never waits for trixie's debootstrap; fd 9 guards the rest (the tools, the key, the wheelhouses).
exec 9>"$CACHE/.build.lock"

# 1. The tools, from Debian's archive (a fresh machine has none of them).
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v systemd-nspawn >/dev/null || need+=(systemd-container)
command -v socat >/dev/null || need+=(socat)
command -v ssh >/dev/null || need+=(openssh-client)
command -v nsenter >/dev/null || need+=(util-linux)
if [[ ${#need[@]} -gt 0 ]]; then
    flock 9
    say "installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    flock -u 9
fi

MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[[ -n "$MIRROR" ]] || MIRROR=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[[ -n "$MIRROR" ]] || MIRROR=http://deb.debian.org/debian

# 2. One root filesystem per suite, built in a temporary directory and renamed into place when complete.
for suite in "${SUITES[@]}"; do
    dest="$CACHE/rootfs-$suite"
    stamp="$dest/.devin-outposts-rootfs"
    exec 8>"$CACHE/.build-$suite.lock"
    flock 8
    if [[ "${DEVIN_OUTPOSTS_TEST_HOSTS_REBUILD:-0}" != 1 && -f "$stamp" && "$(cat "$stamp")" == "$RECIPE_VERSION" ]]; then
        say "$suite: cached at $dest"
        exec 8>&-
        continue
    fi
    start=$SECONDS
    tmp="$CACHE/.rootfs-$suite.tmp"
    rm -rf "$tmp"
    say "$suite: debootstrap from $MIRROR"
    debootstrap --variant=minbase --include="$INCLUDE" "$suite" "$tmp" "$MIRROR" >"$CACHE/debootstrap-$suite.log" 2>&1 ||
        { tail -20 "$CACHE/debootstrap-$suite.log" >&2; exit 1; }
    chroot "$tmp" sh -c '
      systemctl mask systemd-timesyncd.service apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer \
        fstrim.timer man-db.timer dpkg-db-backup.timer systemd-tmpfiles-clean.timer 2>/dev/null
      : >/etc/machine-id; rm -f /var/lib/dbus/machine-id
      rm -f /etc/hostname
      printf "127.0.0.1 localhost\n::1 localhost\n" >/etc/hosts
      sed -i "s/^hosts:.*/hosts: files myhostname/" /etc/nsswitch.conf
      : >/etc/resolv.conf
      # ssh from the controller only, as root with the test key; no DNS look-ups on connect.
      mkdir -p /etc/ssh/sshd_config.d /root/.ssh; chmod 0700 /root/.ssh
      printf "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\nListenAddress 127.0.0.1\n" \
        >/etc/ssh/sshd_config.d/devin-outposts-test.conf
      apt-get clean; rm -rf /var/lib/apt/lists/*' >/dev/null
    printf '%s\n' "$RECIPE_VERSION" >"$tmp/.devin-outposts-rootfs"
    rm -rf "$dest"
    mv "$tmp" "$dest"
    say "$suite: built in $((SECONDS - start)) s at $dest"
    exec 8>&-
done

flock 9

# 3. The controller's key for the test hosts (bound read-only into each host as root's authorized_keys).
if [[ ! -f "$CACHE/ssh/id_ed25519" ]]; then
    mkdir -p "$CACHE/ssh"
    chmod 0700 "$CACHE/ssh"
    ssh-keygen -q -t ed25519 -N '' -C devin-outposts-test-hosts -f "$CACHE/ssh/id_ed25519"
    say "ssh key: $CACHE/ssh/id_ed25519"
fi

# 4. Wheelhouses: the worker's dependencies for each host's Python, downloaded here, so that the hosts
#    (which have no network) prove the air-gapped install path.
"$(dirname "${BASH_SOURCE[0]}")/build-wheelhouse.sh" "$CACHE"
say "ready: $CACHE"
