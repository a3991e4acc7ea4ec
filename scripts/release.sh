#!/usr/bin/env bash
# The release's version and changelog (docs/release.md is the whole procedure).
#
#   scripts/release.sh versions          # every place that repeats the version agrees with galaxy.yml
#   scripts/release.sh bump 0.2.0        # set the version in galaxy.yml and in every place that repeats it
#   scripts/release.sh changelog         # regenerate CHANGELOG.md from changelogs/ (idempotent)
#   scripts/release.sh check-changelog   # fail, with a diff, when CHANGELOG.md is out of date
#   scripts/release.sh check-tarball dist/devin-outposts-X.Y.Z.tar.gz   # fail unless it records its release
#   (scripts/build.sh runs 'release.py stage DIR': the tree the tarball is built from, the release recorded)
#
# The changelog stage (scripts/stages/changelog.sh) runs 'versions' and 'check-changelog'.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_env
exec python "$ROOT/scripts/release.py" "$@"
