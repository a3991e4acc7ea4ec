#!/usr/bin/env bash
# Build the example execution environment image with podman on this machine, and check it: a manual check
# (minutes, and root), not a test stage. docs/execution-environments.md reports what it did here.
#
#   sudo scripts/ee-image.sh              # builds localhost/devin-outposts-ee:<version>, then checks it
#   KEEP=1 sudo scripts/ee-image.sh       # keep the scratch folder (the build context) and print its path
#   NO_CACHE=1 sudo scripts/ee-image.sh   # build every layer again (podman build --no-cache): the cold time
#
# What it does:
#   1. the base image: the Debian 12 test-host root filesystem (scripts/test-hosts/build-images.sh)
#      imported with `podman import` as localhost/devin-outposts-ee-base:bookworm (no registry is reachable
#      here, so the example's UBI base cannot be pulled);
#   2. the collection tarball: `make build` (scripts/build.sh), so it carries the worker's wheel;
#   3. a wheelhouse: pip downloads, on this machine, what ansible-builder installs in the image (ansible-core,
#      ansible-runner, bindep, PyYAML, packaging, dumb-init and their dependencies); the build runs with
#      --network none and installs from it;
#   4. `ansible-builder build` on scripts/ee/execution-environment.yml (the example, adapted to that base);
#   5. checks inside the image: the collection is installed from the tarball, with the worker's wheel;
#      `ansible-doc` reads a module; a module runs (outpost_info against an address nothing listens on
#      fails with the client's connection error, which shows the module and its client load and run).
# Rootful podman (shared/reference/test-hosts.md, Recipe A): the configuration scripts/bootstrap.sh writes.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CACHE=${DEVIN_OUTPOSTS_TEST_HOSTS:-/var/tmp/devin-outposts-test-hosts}
ROOTFS="$CACHE/rootfs-bookworm"
BASE=localhost/devin-outposts-ee-base:bookworm
EXAMPLE="$ROOT/docs/examples/execution-environment"

[[ $(id -u) -eq 0 ]] || die "ee-image: must run as root (rootful podman; the root filesystem is root's)"
command -v podman >/dev/null || die "ee-image: podman is not installed (scripts/bootstrap.sh installs it)"
ensure_env
version=$(sed -n 's/^version: *//p' "$ROOT/galaxy.yml")
IMAGE=localhost/devin-outposts-ee:$version
start=$SECONDS

# 1. The base image, once per root filesystem build.
if [[ ! -f "$ROOTFS/.devin-outposts-rootfs" ]]; then
    "$ROOT/scripts/test-hosts/build-images.sh" bookworm
fi
rootfs_stamp=$(cat "$ROOTFS/.devin-outposts-rootfs"; stat -c %Y "$ROOTFS/.devin-outposts-rootfs")
if [[ "$(podman image inspect --format '{{index .Labels "devin-outposts.rootfs"}}' "$BASE" 2>/dev/null)" != \
      "$(printf '%s' "$rootfs_stamp" | sha256sum | cut -c1-16)" ]]; then
    say "ee-image: importing $ROOTFS as $BASE"
    tar -C "$ROOTFS" -c . | podman import --quiet \
        --change "LABEL devin-outposts.rootfs=$(printf '%s' "$rootfs_stamp" | sha256sum | cut -c1-16)" \
        - "$BASE" >/dev/null
fi

# 2. The collection tarball.
"$ROOT/scripts/build.sh" >/dev/null
tarball="$ROOT/dist/devin-outposts-$version.tar.gz"
[[ -f "$tarball" ]] || die "ee-image: make build wrote no $tarball"

# 3. and 4. The scratch folder: the definition, the example's requirements.yml, the tarball, the wheelhouse.
work=$(mktemp -d /var/tmp/devin-outposts-ee.XXXXXX)
if [[ -z "${KEEP:-}" ]]; then trap 'rm -rf "$work"' EXIT; fi
cp "$ROOT/scripts/ee/execution-environment.yml" "$ROOT/scripts/ee/pip.conf" "$EXAMPLE/requirements.yml" \
    "$tarball" "$work/"
# The example names the tarball of the version it was written for; a bumped version must update it.
grep -q "devin-outposts-$version.tar.gz" "$work/requirements.yml" \
    || die "ee-image: $EXAMPLE/requirements.yml does not name devin-outposts-$version.tar.gz"
python -m pip download --quiet --only-binary=:all: --dest "$work/wheels" \
    'ansible-core~=2.19.0' 'ansible-runner~=2.3' bindep pyyaml packaging 'dumb-init==1.2.5.post1' \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)

say "ee-image: ansible-builder build (offline) of $IMAGE"
build_start=$SECONDS
(cd "$work" && ansible-builder build --tag "$IMAGE" --container-runtime podman --context context \
    --extra-build-cli-args "--network none --pull=never${NO_CACHE:+ --no-cache}" -v 2)
say "ee-image: built $IMAGE in $((SECONDS - build_start)) s"

# 5. Checks inside the image (as its default user, with no network).
run() { podman run --rm --network none "$IMAGE" "$@"; }
listing=$(run ansible-galaxy collection list devin.outposts)
grep -Eq "^devin\.outposts +$version\b" <<<"$listing" || die "ee-image: devin.outposts $version not installed: $listing"
run sh -c 'ls /usr/share/ansible/collections/ansible_collections/devin/outposts/roles/worker/files/wheels/' \
    | grep -q '^devin_outposts-.*\.whl$' || die "ee-image: the worker's wheel is not in the installed collection"
run ansible-doc devin.outposts.outpost | grep -q 'Creates or deletes an outpost' \
    || die "ee-image: ansible-doc devin.outposts.outpost did not show the module"
# 127.0.0.1:9 (discard): nothing listens in the container, so the module must fail on the connection.
# The token comes from the environment, as in AWX: ansible-core 2.19 echoes a failed ad-hoc task's -a string.
out=$(podman run --rm --network none -e DEVIN_OUTPOSTS_TOKEN=not-a-token "$IMAGE" \
    ansible localhost -m devin.outposts.outpost_info -a 'api_url=http://127.0.0.1:9 timeout=5' 2>&1 || true)
if ! grep -q 'FAILED' <<<"$out" || ! grep -q 'Could not' <<<"$out"; then
    die "ee-image: outpost_info did not fail as expected on a closed port: $out"
fi
if grep -q 'not-a-token' <<<"$out"; then die "ee-image: the module printed its token: $out"; fi
run ansible-runner --version >/dev/null
run ssh -V 2>&1 | grep -q '^OpenSSH' || die "ee-image: no OpenSSH client in the image (meta/ee-bindep.txt)"
if run sh -c 'ls /etc/pip.conf /var/cache/ee-wheels' >/dev/null 2>&1; then
    die "ee-image: the build's pip.conf or wheelhouse is left in the image"
fi
run ansible --version | head -n 1
printf '%s\n' "$listing" | grep -E '^(# |devin\.)'
say "ee-image: checked $IMAGE: collection $version with the worker's wheel, ansible-doc, a module run,"
say "ee-image: ansible-runner and ssh present, no build-only pip configuration ($((SECONDS - start)) s in all)"
if [[ -n "${KEEP:-}" ]]; then say "ee-image: build context kept in $work/context"; fi
