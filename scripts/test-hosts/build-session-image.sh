#!/usr/bin/env bash
# Build the session image the podman driver's tests run: the Debian test-host root filesystem
# (build-images.sh) plus this checkout's devin-outposts wheel in a venv, built from
# python/devin-outposts/Containerfile offline (the wheels come from the test hosts' wheelhouse).
# Idempotent and cached by content: the tag is a hash of what goes into the image (the worker's sources, the
# setuptools that builds its wheel, the root filesystem's build stamp, the wheelhouse, the Containerfile and
# this recipe), computed before anything is built, so a second run finds the image in well under a second.
# The test run builds it once, ahead of the package stage (scripts/test-hosts/prepare.sh); the podman tests'
# fixture then finds it.
#
#   scripts/test-hosts/build-session-image.sh          # prints the image reference as its last line
#   DEVIN_OUTPOSTS_TEST_HOSTS=/var/tmp/x ...            # another cache directory (as build-images.sh)
#
# Rootful podman (shared/reference/test-hosts.md, Recipe A): runs as root, like build-images.sh.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${DEVIN_OUTPOSTS_TEST_HOSTS:-/var/tmp/devin-outposts-test-hosts}
SUITE=bookworm
ROOTFS="$CACHE/rootfs-$SUITE"
WHEELHOUSE="$CACHE/wheelhouse-py311" # bookworm's python3 is 3.11
REPO=localhost/devin-outposts-session
BASE_REPO=localhost/devin-outposts-session-base
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
# Bump when what this script or the Containerfile does changes in a way the hashes below do not see.
RECIPE_VERSION=1
# A fixed wheel timestamp makes the wheel's bytes (and so the tag) depend on its content only.
export SOURCE_DATE_EPOCH=315532800

say() { printf 'build-session-image: %s\n' "$*" >&2; }
die() { printf 'build-session-image: ERROR: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root (rootful podman, and the root filesystem is root's)"
command -v podman >/dev/null || die "podman is not installed (scripts/bootstrap.sh installs it)"
[[ -x "$PYTHON" ]] || PYTHON=python3

# 1. The root filesystem and the wheelhouse (built once, cached by build-images.sh).
if [[ ! -f "$ROOTFS/.devin-outposts-rootfs" || ! -f "$WHEELHOUSE/.stamp" ]]; then
    "$ROOT/scripts/test-hosts/build-images.sh" "$SUITE" >&2
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.session-image.lock"
flock 9

start=$SECONDS

# 2. The tag: what goes into the image, hashed. The wheel is a function of the sources and the setuptools that
#    builds it, so hashing those finds a built image without building the wheel.
rootfs_id=$(cat "$ROOTFS/.devin-outposts-rootfs"; stat -c %Y "$ROOTFS/.devin-outposts-rootfs")
setuptools_version=$("$PYTHON" -c 'import setuptools; print(setuptools.__version__)')
tag=$({
    printf 'recipe %s\nrootfs %s\nsetuptools %s\n' "$RECIPE_VERSION" "$rootfs_id" "$setuptools_version"
    sha256sum "$ROOT/python/devin-outposts/Containerfile" "${BASH_SOURCE[0]}" | cut -d' ' -f1
    (
        cd "$ROOT/python/devin-outposts"
        { echo pyproject.toml; [[ ! -f README.md ]] || echo README.md
          find src -type f ! -path '*/__pycache__/*' ! -path '*.egg-info/*'; } | LC_ALL=C sort | xargs -d '\n' sha256sum
    )
    (cd "$WHEELHOUSE" && sha256sum -- *.whl)
} | sha256sum | cut -c1-16)
image="$REPO:$tag"
if podman image exists "$image"; then
    say "cached: $image ($((SECONDS - start)) s)"
    printf '%s\n' "$image"
    exit 0
fi

# 3. The worker's wheel (no dependencies: those come from the wheelhouse). Built from a copy of the
#    sources, so that setuptools' build/ and egg-info never land in the checkout (parallel builds).
work=$(mktemp -d "$CACHE/.session-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/wheels" "$work/src"
cp -r "$ROOT/python/devin-outposts/pyproject.toml" "$ROOT/python/devin-outposts/src" "$work/src/"
[[ -f "$ROOT/python/devin-outposts/README.md" ]] && cp "$ROOT/python/devin-outposts/README.md" "$work/src/"
find "$work/src" \( -name '__pycache__' -o -name '*.egg-info' \) -prune -exec rm -rf {} +
"$PYTHON" -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    -w "$work/wheels" "$work/src" >&2 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
wheel=$(find "$work/wheels" -name 'devin_outposts-*.whl' -print -quit)
[[ -n "$wheel" ]] || die "pip wheel made no devin_outposts wheel"
cp "$WHEELHOUSE"/*.whl "$work/wheels/"

# 4. The base: the root filesystem imported as an image (once per root filesystem build).
base_tag=$(printf '%s' "$rootfs_id" | sha256sum | cut -c1-12)
base="$BASE_REPO:$SUITE-$base_tag"
if ! podman image exists "$base"; then
    say "importing $ROOTFS as $base"
    tar -C "$ROOTFS" -c . | podman import --quiet - "$base" >/dev/null
fi

# 5. The image, offline: everything it installs is in the build context.
say "building $image"
podman build --quiet --network none --pull=never \
    --build-arg BASE_IMAGE="$base" --build-arg PIP_OPTIONS="--no-index" \
    --label "org.opencontainers.image.source=devin-outposts checkout" \
    -f "$ROOT/python/devin-outposts/Containerfile" -t "$image" "$work" >/dev/null

# Older builds are only disk space now: keep the newest three (other checkouts on this machine may be
# testing theirs; a container still using one keeps it anyway, as rmi refuses).
podman images --sort created --format '{{.Repository}}:{{.Tag}}' "$REPO" | tail -n +4 | while read -r old; do
    [[ "$old" == "$image" ]] || podman rmi "$old" >/dev/null 2>&1 || true
done
podman images --format '{{.Repository}}:{{.Tag}}' "$BASE_REPO" | while read -r old; do
    [[ "$old" == "$base" ]] || podman rmi "$old" >/dev/null 2>&1 || true
done
say "built $image in $((SECONDS - start)) s"
printf '%s\n' "$image"
