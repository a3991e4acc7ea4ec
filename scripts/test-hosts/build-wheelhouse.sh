#!/usr/bin/env bash
# Download the bundled worker's runtime dependencies as wheels for each test host's Python, so that the
# role installs them with `--no-index --find-links` (the air-gapped path). Idempotent.
#
#   scripts/test-hosts/build-wheelhouse.sh [CACHE_DIR]      # writes CACHE_DIR/wheelhouse-py311 and -py313
#
# The same command, with the Python version of your hosts, prepares a wheelhouse for an air-gapped site
# (docs/roles.md, "Air-gapped hosts").
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${1:-${DEVIN_OUTPOSTS_TEST_HOSTS:-/var/tmp/devin-outposts-test-hosts}}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
[[ -x "$PYTHON" ]] || PYTHON=python3
ARCH=$(uname -m)
# The runtime requirements of the bundled package (pyproject.toml [project].dependencies).
mapfile -t REQS < <("$PYTHON" - "$ROOT/python/devin-outposts/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as fh:
    print("\n".join(tomllib.load(fh)["project"]["dependencies"]))
PY
)
stamp_text="${REQS[*]} $ARCH"
for pyver in 3.11 3.13; do
    tag=${pyver/./}
    dest="$CACHE/wheelhouse-py$tag"
    if [[ -f "$dest/.stamp" && "$(cat "$dest/.stamp")" == "$stamp_text" ]]; then
        echo "build-wheelhouse: python $pyver: cached at $dest"
        continue
    fi
    rm -rf "$dest.tmp"
    mkdir -p "$dest.tmp"
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --dest "$dest.tmp" --only-binary=:all: \
        --python-version "$pyver" --implementation cp --abi "cp$tag" \
        --platform "manylinux2014_$ARCH" --platform "manylinux_2_17_$ARCH" --platform "manylinux_2_28_$ARCH" \
        "${REQS[@]}" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
    printf '%s\n' "$stamp_text" >"$dest.tmp/.stamp"
    rm -rf "$dest"
    mv "$dest.tmp" "$dest"
    echo "build-wheelhouse: python $pyver: $(find "$dest" -name '*.whl' | wc -l) wheels at $dest"
done
