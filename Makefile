# Entry points for developers and CI. Each target calls a script under scripts/, which does the work.
#   make demo    set everything up and run the demo against the embedded fleet simulator
#   make test    the whole suite (CI runs exactly this)
#   make build   the release: both wheels and the collection tarball (with the worker's wheel) in dist/
#   make release-notes  regenerate CHANGELOG.md from changelogs/ (docs/release.md)
#   make docsite the docs site, docs/site/build/html/index.html
#   make <stage> one stage: ruff mypy imports ansible-lint changelog docs sanity units matrix package integration eda
#                tarball molecule windows, or lint

STAGES := ruff mypy imports ansible-lint changelog docs sanity units matrix package integration eda tarball molecule windows

.PHONY: help demo test build bootstrap lint release-notes docsite $(STAGES) clean

help:
	@sed -n 's/^#   //p' $(firstword $(MAKEFILE_LIST))
	@scripts/test.sh --list | sed -n '/^Stages:/,$$p'

demo:
	scripts/demo.sh

test:
	scripts/test.sh

build:
	scripts/build.sh

bootstrap:
	scripts/bootstrap.sh

release-notes:
	scripts/release.sh changelog

docsite:
	scripts/bootstrap.sh
	PATH="$(CURDIR)/.venv/bin:$$PATH" docs/site/build.sh

lint:
	scripts/test.sh lint

$(STAGES):
	scripts/test.sh $@

# Remove test reports and caches (not .venv: delete it by hand to rebuild it from scratch).
clean:
	rm -rf tests/output .cache .ansible .pytest_cache .ruff_cache .mypy_cache dist roles/worker/files/wheels
