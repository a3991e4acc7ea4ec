#!/usr/bin/env bash
# Boot, stop and reach systemd-nspawn test hosts (docs/architecture.md, "Test hosts").
#
#   nspawn-host.sh start NAME SUITE             boot a host from CACHE/rootfs-SUITE (volatile overlay, private
#                                               network, its own cgroups); prints the leader PID when it is up
#   nspawn-host.sh relay NAME HOST_PORT TARGET_PORT
#                                               make 127.0.0.1:HOST_PORT inside the host reach 127.0.0.1:TARGET_PORT
#                                               on this machine (two socat processes and a unix socket; nothing
#                                               else is reachable, and no network or route is created)
#   nspawn-host.sh stop NAME                    stop the relays and the host, by their recorded PIDs
#   nspawn-host.sh proxy NAME                   ssh ProxyCommand: stdio to the host's sshd (nsenter -n socat)
#   nspawn-host.sh ssh-args NAME                the ssh options that reach the host
#
# Every process started here is recorded under $DEVIN_OUTPOSTS_TEST_HOSTS_RUN/NAME/ and stopped by PID by
# `stop`. The default run directory, CACHE/run/<checkout>, and the hosts' cgroups are keyed by this checkout's
# path: two checkouts can run the same scenario (the same host names) at once, sharing only the read-only
# images, key and wheelhouses under CACHE (DEVIN_OUTPOSTS_TEST_HOSTS, default /var/tmp/devin-outposts-test-hosts).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${DEVIN_OUTPOSTS_TEST_HOSTS:-/var/tmp/devin-outposts-test-hosts}
CHECKOUT=$(printf '%s' "$ROOT" | sha256sum | cut -c1-8)
RUN=${DEVIN_OUTPOSTS_TEST_HOSTS_RUN:-$CACHE/run/$CHECKOUT}
cmd=${1:?usage: nspawn-host.sh start|stop|relay|ssh-args NAME ...}
name=${2:?host name}
valid='^[a-z0-9][a-z0-9-]{0,30}$'
[[ $name =~ $valid ]] || { echo "nspawn-host: bad host name: $name" >&2; exit 2; }

leader_of() {  # the container's PID 1 (seen from here): the child of systemd-nspawn in a PID namespace of its own
    local pid=$1 mine child ns
    mine=$(readlink /proc/self/ns/pid)
    for ((try = 0; try < 600; try++)); do
        for child in $(ps -o pid= --ppid "$pid" 2>/dev/null); do
            # nspawn's first child stays in this namespace and exits soon; one that is gone already has no
            # namespace to read, and must not pass for the leader (that made a loaded machine's boot fail).
            ns=$(readlink "/proc/$child/ns/pid" 2>/dev/null) || continue
            if [[ -n "$ns" && "$ns" != "$mine" ]]; then
                echo "$child"
                return 0
            fi
        done
        sleep 0.05
    done
    return 1
}

stop_pid() {  # SIGTERM, then SIGKILL after $2 seconds
    local pid=$1 wait=${2:-10} i
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < wait * 10; i++)); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
}

case "$cmd" in
start)
    suite=${3:?suite}; state=$RUN/$name
    rootfs="$CACHE/rootfs-$suite"
    [[ -f "$rootfs/.devin-outposts-rootfs" ]] || { echo "nspawn-host: no image for $suite; run scripts/test-hosts/build-images.sh" >&2; exit 1; }
    if [[ -f "$state/nspawn.pid" ]] && kill -0 "$(cat "$state/nspawn.pid")" 2>/dev/null; then
        cat "$state/leader.pid"; exit 0
    fi
    mkdir -p "$state"
    cp "$CACHE/ssh/id_ed25519.pub" "$state/authorized_keys"
    # Each host in its own cgroups (name=systemd and unified), or parallel hosts break each other.
    cg="devin-outposts-$CHECKOUT-$name"
    for h in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified; do if [[ -d $h ]]; then mkdir -p "$h/$cg"; fi; done
    # shellcheck disable=SC2016  # the inner script expands its own positional parameters
    setsid bash -c '
        for h in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified; do [[ -d $h/$1 ]] && echo $$ >"$h/$1/cgroup.procs"; done
        exec systemd-nspawn --quiet --register=no --keep-unit --boot --directory="$2" \
            --machine="$3" --hostname="$3" --volatile=overlay --resolv-conf=off --private-network \
            --bind-ro="$4/authorized_keys:/root/.ssh/authorized_keys" --console=passive
    ' nspawn "$cg" "$rootfs" "$name" "$state" </dev/null >"$state/console.log" 2>&1 &
    echo $! >"$state/nspawn.pid"
    leader=$(leader_of "$!") || { echo "nspawn-host: $name did not start; see $state/console.log" >&2; exit 1; }
    echo "$leader" >"$state/leader.pid"
    # Wait until systemd has booted (the bus appears a moment after PID 1 starts).
    state_now=
    for ((try = 0; try < 600; try++)); do
        state_now=$(nsenter -t "$leader" -a systemctl is-system-running 2>/dev/null || true)
        case "$state_now" in running | degraded | maintenance | stopping) break ;; esac
        sleep 0.1
    done
    if [[ $state_now != running ]]; then
        echo "nspawn-host: $name is '$state_now':" >&2
        nsenter -t "$leader" -a systemctl --failed --no-legend >&2 || true
        [[ $state_now == degraded ]] || exit 1
    fi
    echo "$leader"
    ;;
relay)
    state=$RUN/$name; host_port=${3:?port in the host}; target=${4:?port on this machine}
    leader=$(cat "$state/leader.pid")
    sock="$state/relay-$host_port.sock"
    rm -f "$sock"
    # This machine's side: the unix socket to the target on this machine's loopback.
    setsid socat "UNIX-LISTEN:$sock,fork,mode=0600" "TCP:127.0.0.1:$target" </dev/null >/dev/null 2>&1 &
    echo $! >>"$state/relay.pids"
    for ((try = 0; try < 50; try++)); do [[ -S $sock ]] && break; sleep 0.05; done
    # The host's side: its loopback port to the same socket (nsenter -n keeps this machine's file system).
    setsid nsenter -t "$leader" -n socat "TCP-LISTEN:$host_port,bind=127.0.0.1,fork,reuseaddr" "UNIX-CONNECT:$sock" \
        </dev/null >/dev/null 2>&1 &
    echo $! >>"$state/relay.pids"
    ;;
stop)
    state=$RUN/$name
    if [[ -f "$state/relay.pids" ]]; then
        while read -r pid; do stop_pid "$pid" 2; done <"$state/relay.pids"
        rm -f "$state/relay.pids" "$state"/relay-*.sock
    fi
    if [[ -f "$state/nspawn.pid" ]]; then
        stop_pid "$(cat "$state/nspawn.pid")" 30
        rm -f "$state/nspawn.pid" "$state/leader.pid"
    fi
    cg="devin-outposts-$CHECKOUT-$name"
    for h in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified; do
        if [[ -d $h/$cg ]]; then find "$h/$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
    done
    ;;
proxy)
    exec nsenter -t "$(cat "$RUN/$name/leader.pid")" -n socat STDIO TCP:127.0.0.1:22
    ;;
ssh-args)
    state=$RUN/$name
    leader=$(cat "$state/leader.pid")
    printf '%s\n' "-o ProxyCommand=\"nsenter -t $leader -n socat STDIO TCP:127.0.0.1:22\" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o IdentitiesOnly=yes -i $CACHE/ssh/id_ed25519"
    ;;
*) echo "nspawn-host: unknown command $cmd" >&2; exit 2 ;;
esac
