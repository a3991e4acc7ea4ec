#!/usr/bin/env bash
# Build the collection's docs site: docs/site/build/html/index.html.
#
#   docs/site/build.sh           # from the dev venv (scripts/stages/docs.sh runs it, after the linter)
#
# 1. antsibull-docs writes the RST of the collection's modules, plugins and roles (from ansible-doc, and the
#    roles' meta/argument_specs.yml) into docs/site/rst/, with the links of docs/docsite/links.yml;
# 2. docs/site/eda_sources.py adds a page per Event-Driven Ansible event source (antsibull-docs has no EDA
#    support);
# 3. Sphinx builds the HTML, offline (conf.py resolves references to Ansible's own docs to their URLs).
#
# Any warning fails the build: antsibull-docs' (it runs with --fail-on-error, and a warning line in its output
# fails this script too) and Sphinx's (-W --keep-going: every warning is shown, then the build fails).
# rst/ and build/ are generated; they are in .gitignore and in galaxy.yml's build_ignore.
# It documents the collection this script sits in (never an installed copy), so a copy of the tree builds its
# own docs: the docs stage's tests use that.
set -euo pipefail
site=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$site/../.." && pwd)
rst="$site/rst"
html="$site/build/html"
for tool in antsibull-docs sphinx-build python; do
    command -v "$tool" >/dev/null || { echo "ERROR: $tool not found: run this from the dev venv" >&2; exit 1; }
done

# This tree as devin.outposts, and nothing else (ansible.builtin comes with ansible-core).
scratch=$(mktemp -d "${TMPDIR:-/tmp}/devin-outposts-docs.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/ansible_collections/devin"
ln -s "$root" "$scratch/ansible_collections/devin/outposts"
export ANSIBLE_COLLECTIONS_PATH="$scratch"
export ANSIBLE_HOME="${ANSIBLE_HOME:-$scratch/ansible-home}"

rm -rf "$rst" "$site/build"
mkdir -m 0700 "$rst"  # antsibull-docs wants its output folder writable by its owner only
log="$scratch/antsibull-docs.log"
rc=0
antsibull-docs --config-file "$site/antsibull-docs.cfg" collection --use-current --squash-hierarchy \
    --fail-on-error --cleanup everything --dest-dir "$rst" devin.outposts >"$log" 2>&1 || rc=$?
cat "$log"
if [[ $rc -ne 0 ]]; then
    echo "ERROR: antsibull-docs failed (exit $rc)" >&2; exit 1
fi
if grep -qiE 'warning|error' "$log"; then
    echo "ERROR: antsibull-docs reported a warning or an error (above)" >&2; exit 1
fi
python "$site/eda_sources.py" "$root" "$rst"
sphinx-build -b html -q -E -W --keep-going -c "$site" "$rst" "$html"
echo "docs site: $html/index.html"
