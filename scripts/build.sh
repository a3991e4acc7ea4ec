#!/usr/bin/env bash
# make build: the release artifacts, in dist/.
#
#   1. the wheels of both Python distributions (pip wheel, the standard tool; reproducible with
#      SOURCE_DATE_EPOCH): dist/devin_outposts-<v>-py3-none-any.whl and dist/devin_outposts_sim-<v>-...;
#   2. the worker's wheel copied into roles/worker/files/wheels/, where the worker role finds it;
#   3. the collection tarball, dist/devin-outposts-<v>.tar.gz (ansible-galaxy collection build), which
#      therefore carries the worker's wheel and installs it on hosts without building anything.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_env
cd "$ROOT"
dist="$ROOT/dist"
wheels="$ROOT/roles/worker/files/wheels"
rm -rf "$dist" "$wheels"
mkdir -p "$dist" "$wheels"
export SOURCE_DATE_EPOCH=315532800  # 1980-01-01: the same source gives the same wheel bytes
for project in "$PKG_DIR" "$SIM_DIR"; do
    python -m pip wheel --no-deps --no-build-isolation --disable-pip-version-check --no-input \
        --wheel-dir "$dist" "$project" >/dev/null
done
# The build leaves setuptools' working folders in the source tree; they must not reach the tarball.
rm -rf "$PKG_DIR/build" "$SIM_DIR/build"
cp "$dist"/devin_outposts-*-py3-none-any.whl "$wheels/"
ansible-galaxy collection build --force --output-path "$dist" "$ROOT" >/dev/null
say "built:"
find "$dist" -maxdepth 1 -type f -printf '  dist/%f\n' | sort
