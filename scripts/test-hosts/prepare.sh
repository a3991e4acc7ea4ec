#!/usr/bin/env bash
# Build, once per run and ahead of the stages, what the slow stages would otherwise build when they reach it:
# the test hosts' root filesystems, key and wheelhouses (build-images.sh), the podman driver's session image
# (build-session-image.sh), the ansible-core venvs of the oldest and the newest core (core_venv in
# scripts/lib.sh), the venvs of ansible-test sanity's tools for the dev core and for those two
# (prime_sanity_venvs) and galaxy-importer's venv (galaxy_importer_venv). scripts/test.sh runs it in the
# background while the lint stages run: most of this waits on the network and the disk, the lint on the CPU.
#
#   scripts/test-hosts/prepare.sh hosts session-image cores sanity-venvs matrix-venvs importer   # any of them
#
# Every part is cached by content and built under a lock, so a stage that needs a part while this is still
# building it waits for it, and a stage run alone builds what it needs itself. A part that fails here is only
# reported: the stage that needs it builds it again and fails by its own name.
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

hosts_ok() { [[ $(id -u) -eq 0 ]] && [[ -d /sys/fs/cgroup/systemd || -f /sys/fs/cgroup/cgroup.controllers ]]; }

part() {
    local name=$1 start=$SECONDS rc=0
    shift
    "$@" >"$LOG_DIR/prepare-$name.log" 2>&1 || rc=$?
    if [[ $rc -eq 0 ]]; then
        say "prepare: $name ready in $((SECONDS - start)) s"
    else
        say "prepare: $name FAILED (exit $rc) after $((SECONDS - start)) s; the stage that needs it builds it again:"
        tail -n 20 "$LOG_DIR/prepare-$name.log" | sed 's/^/  | /'
    fi
}

# The root filesystems in the order the stages reach them: bookworm first (every host stage and the session
# image need it), trixie (only the default Molecule scenario) last.
hosts_then_image() {
    part hosts-bookworm "$ROOT/scripts/test-hosts/build-images.sh" bookworm
    if [[ $want_image == 1 ]]; then
        if command -v podman >/dev/null; then
            part session-image "$ROOT/scripts/test-hosts/build-session-image.sh"
        else
            say "prepare: session-image: no podman here (the package stage says so)"
        fi
    fi
    [[ $want_hosts == 0 ]] || part hosts-trixie "$ROOT/scripts/test-hosts/build-images.sh" trixie
}

cores() {
    local core
    for core in "${CORE_VERSIONS[0]}" "${CORE_VERSIONS[-1]}"; do core_venv "$core" || return 1; done
}

# The matrix's cores: their venvs (cores), then their sanity venvs.
cores_then_venvs() {
    [[ $want_cores == 0 ]] || part cores cores
    if [[ $want_matrix_venvs == 1 ]]; then
        part "matrix-venvs-${CORE_VERSIONS[0]}" prime_sanity_venvs "${CORE_VERSIONS[0]}"
        part "matrix-venvs-${CORE_VERSIONS[-1]}" prime_sanity_venvs "${CORE_VERSIONS[-1]}"
    fi
}

LOG_DIR=${OUTPOSTS_STAGE_LOGS:-$ROOT/tests/output/stages}
mkdir -p "$LOG_DIR"
want_hosts=0 want_image=0 want_cores=0 want_importer=0 want_sanity_venvs=0 want_matrix_venvs=0
for word in "$@"; do
    case "$word" in
        hosts) want_hosts=1 ;;
        session-image) want_image=1 ;;
        cores) want_cores=1 ;;
        importer) want_importer=1 ;;
        sanity-venvs) want_sanity_venvs=1 ;;
        matrix-venvs) want_matrix_venvs=1 ;;
        *) die "prepare: unknown part: $word (hosts, session-image, cores, sanity-venvs, matrix-venvs, importer)" ;;
    esac
done
if [[ $want_hosts == 1 || $want_image == 1 ]] && ! hosts_ok; then
    say "prepare: no root or no cgroups here: no test hosts or session image (the stages that need them say so)"
    want_hosts=0 want_image=0
fi

pids=()
if [[ $want_hosts == 1 || $want_image == 1 ]]; then hosts_then_image & pids+=($!); fi
# PyPI downloads: beside the debootstraps, which wait on Debian's mirror.
if [[ $want_sanity_venvs == 1 ]]; then part sanity-venvs prime_sanity_venvs & pids+=($!); fi
if [[ $want_cores == 1 || $want_matrix_venvs == 1 ]]; then cores_then_venvs & pids+=($!); fi
if [[ $want_importer == 1 ]]; then part importer galaxy_importer_venv & pids+=($!); fi
for pid in "${pids[@]}"; do wait "$pid" || true; done
