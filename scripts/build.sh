#!/usr/bin/env bash
# make build: the release artifacts, in dist/.
#
#   1. the tree the tarball is built from (scripts/release.py stage): what git would commit, in a scratch folder,
#      with the version's release recorded in changelogs/changelog.yaml while it is unreleased (docs/release.md);
#   2. the wheels of both Python distributions, from that tree (pip wheel, the standard tool; reproducible with
#      SOURCE_DATE_EPOCH): dist/devin_outposts-<v>-py3-none-any.whl and dist/devin_outposts_sim-<v>-...;
#   3. the worker's wheel copied into roles/worker/files/wheels/ (of that tree, and of this checkout, where the
#      worker role run from git finds it);
#   4. the collection tarball, dist/devin-outposts-<v>.tar.gz (ansible-galaxy collection build), which therefore
#      carries the worker's wheel and installs it on hosts without building anything.
#
# It needs only what building needs: git, Python 3.11 (OUTPOSTS_PYTHON) and a small build venv,
# .cache/build-venv (OUTPOSTS_BUILD_VENV), with ansible-core, setuptools and antsibull-changelog at the ranges
# requirements-dev.txt gives them, and their dependencies; made on the first run, reused while those lines and
# this script stay the same. No .venv, no Debian package, no podman configuration (scripts/bootstrap.sh is for
# developing and testing). The tarball stage builds in a fresh copy of the tree to prove it.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

BUILD_TOOLS=(ansible-core setuptools antsibull-changelog)
build_venv=${OUTPOSTS_BUILD_VENV:-$ROOT/.cache/build-venv}
python=${OUTPOSTS_PYTHON:-python3.11}

# The build tools' lines of requirements-dev.txt, so that the build and the dev venv agree on their ranges.
requirements=$(grep -E "^($(IFS='|'; echo "${BUILD_TOOLS[*]}"))[<>=!~ ;]" "$ROOT/requirements-dev.txt" || true)
for tool in "${BUILD_TOOLS[@]}"; do
    grep -qE "^${tool}[<>=!~ ;]" <<<"$requirements" || die "requirements-dev.txt has no line for $tool (scripts/build.sh)"
done

ensure_build_venv() {
    command -v "$python" >/dev/null 2>&1 || die "$python not found (set OUTPOSTS_PYTHON to a Python 3.11 interpreter)"
    local want stamp="$build_venv/.devin-outposts-build.sha256"
    want=$({ "$python" -c 'import sys; print(sys.version)'; printf '%s\n' "$requirements"; cat "${BASH_SOURCE[0]}"; } |
        sha256sum | cut -d' ' -f1)
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$build_venv/bin/python" ]]; then
        return 0
    fi
    say "build venv: $build_venv ($(tr '\n' ' ' <<<"$requirements"))"
    rm -rf "$build_venv"
    mkdir -p "$(dirname "$build_venv")"
    "$python" -m venv "$build_venv"
    # shellcheck disable=SC2086  # one requirement per line
    "$build_venv/bin/python" -m pip install --disable-pip-version-check --no-input --quiet $requirements 2>&1 |
        { grep -v "^WARNING: Location '" || true; }
    printf '%s\n' "$want" >"$stamp"
}
ensure_build_venv
export VIRTUAL_ENV="$build_venv" PATH="$build_venv/bin:$PATH"
unset ANSIBLE_COLLECTIONS_PATH ANSIBLE_CONFIG

dist="$ROOT/dist"
wheels="$ROOT/roles/worker/files/wheels"
rm -rf "$dist" "$wheels"
mkdir -p "$dist" "$wheels"
stage=$(mktemp -d "${TMPDIR:-/tmp}/devin-outposts-build.XXXXXX")
trap 'rm -rf "$stage"' EXIT
tree="$stage/tree"
mkdir -p "$tree"
python "$ROOT/scripts/release.py" stage "$tree"

export SOURCE_DATE_EPOCH=315532800  # 1980-01-01: the same source gives the same wheel bytes
for project in "${PKG_DIR#"$ROOT"/}" "${SIM_DIR#"$ROOT"/}"; do
    python -m pip wheel --no-deps --no-build-isolation --disable-pip-version-check --no-input \
        --wheel-dir "$dist" "$tree/$project" >/dev/null
done
# The staged tree is a copy: setuptools' working folders (build/, *.egg-info) stay out of the checkout, and
# build_ignore keeps them out of the tarball.
mkdir -p "$tree/roles/worker/files/wheels"
cp "$dist"/devin_outposts-*-py3-none-any.whl "$wheels/"
cp "$dist"/devin_outposts-*-py3-none-any.whl "$tree/roles/worker/files/wheels/"
ANSIBLE_HOME="$stage/ansible-home" ansible-galaxy collection build --force --output-path "$dist" "$tree" >/dev/null
say "built:"
find "$dist" -maxdepth 1 -type f -printf '  dist/%f\n' | sort
