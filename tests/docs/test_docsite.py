"""The docs site's checks can fail: a planted warning in a copy of the tree fails the docs stage's tools.

scripts/stages/docs.sh runs the linter and the build on the real tree first; these tests show that each of
them turns a planted problem into a failure (and that an Event-Driven Ansible source gets its page), in a
scratch copy of the tree so that the working tree is never touched.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SITE = Path("docs/site")
# What the docs tools read; python/, benchmarks/ and tests/ are not needed and are not copied.
COPIED = (
    "galaxy.yml", "README.md", "meta", "plugins", "roles", "playbooks", "docs", "extensions", "changelogs",
)
REPOSITORY_BLOB = "https://github.com/devin-outposts/devin.outposts/blob/main/"

SAMPLE_SOURCE = '''"""A sample event source, planted by tests/docs/test_docsite.py."""
DOCUMENTATION = r"""
short_description: Sample events for the docs tests
description:
  - Puts one event per O(interval) seconds on the queue, filtered by O(filter.phase).
  - Uses the connection options of M(devin.outposts.outpost).
options:
  interval:
    description: Seconds between two events.
    type: int
    default: 5
  filter:
    description: What to pass on.
    type: dict
    suboptions:
      phase:
        description: Only this phase.
        type: str
        choices: [queued, claimed]
author:
  - devin.outposts maintainers (@devin-outposts)
"""
EXAMPLES = r"""
- name: Sample rulebook
  hosts: localhost
  sources:
    - devin.outposts.sample_source:
        interval: 7
"""


async def main(queue, args):
    raise NotImplementedError
'''


def copy_tree(destination: Path) -> Path:
    """The files git would commit (tracked, and new ones not ignored) of the COPIED paths, at destination."""
    listing = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard",  # noqa: S607
         "--", *COPIED],
        check=True, capture_output=True, text=True,
    ).stdout
    for name in filter(None, listing.split("\0")):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def run(command: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ANSIBLE_HOME=str(tmp_path / "ansible-home"), TMPDIR=str(tmp_path))
    return subprocess.run(command, env=env, capture_output=True, text=True, check=False, timeout=110)


def plant_in_module_description(tree: Path, text: str) -> None:
    """Appends text to the first description line of the outpost module's DOCUMENTATION."""
    module = tree / "plugins/modules/outpost.py"
    source = module.read_text(encoding="utf-8")
    planted, count = re.subn(r"^(description:\n  - .*)$", lambda m: f"{m.group(1)} {text}", source,
                             count=1, flags=re.MULTILINE)
    assert count == 1, "the outpost module's DOCUMENTATION has no 'description:' list to plant into"
    module.write_text(planted, encoding="utf-8")


def load_module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_markup_error_fails_the_linter(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path / "tree")
    plant_in_module_description(tree, "See C(unclosed.")
    result = run(["antsibull-docs", "lint-collection-docs", "--plugin-docs", str(tree)], tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "plugins/modules/outpost.py" in output and "Markup error" in output, output


def test_unknown_option_reference_fails_the_build(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path / "tree")
    plant_in_module_description(tree, "See O(no_such_option).")
    result = run([str(tree / SITE / "build.sh")], tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    label = "ansible_collections.devin.outposts.outpost_module__parameter-no_such_option"
    assert f"undefined label: '{label}'" in output, output


def test_event_source_gets_a_page(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path / "tree")
    source = tree / "extensions/eda/plugins/event_source/sample_source.py"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(SAMPLE_SOURCE, encoding="utf-8")
    result = run([str(tree / SITE / "build.sh")], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    html = tree / SITE / "build/html"
    page = (html / "sample_source_event_source.html").read_text(encoding="utf-8")
    assert "devin.outposts.sample_source event source" in page
    # each option has its anchor, and the description's O() links to it (Sphinx turns labels into ids)
    for option in ("interval", "filter-phase"):
        anchor = f"ansible-collections-devin-outposts-sample-source-event-source-parameter-{option}"
        assert f'id="{anchor}"' in page and f'href="#{anchor}"' in page, anchor
    assert "interval: 7" in re.sub(r"<[^>]+>", "", page)  # the example, without its highlighting's markup
    assert 'href="outpost_module.html"' in page  # M(devin.outposts.outpost) resolved
    assert 'href="sample_source_event_source.html"' in (html / "index.html").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("planted", "message"),
    [
        ('DOCUMENTATION = "short_description: x"\n', "no EXAMPLES string"),
        ('EXAMPLES = ""\n', "no DOCUMENTATION string"),
        ('DOCUMENTATION = "short_description: x\\ndescription: See C(unclosed."\nEXAMPLES = ""\n',
         "Cannot find closing"),
        ('DOCUMENTATION = "short_description: x\\ndescription: y\\noptions: {a: {type: str}}"\n'
         'EXAMPLES = ""\n', "options/a has no description"),
        ('DOCUMENTATION = "short_description: x\\ndescription: y\\n'
         'options: {a: {description: z, kind: str}}"\nEXAMPLES = ""\n', "options/a has unknown keys: kind"),
    ],
)
def test_event_source_doc_errors_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str], planted: str,
                                      message: str) -> None:
    eda_sources = load_module(ROOT / SITE / "eda_sources.py", "eda_sources")
    source = tmp_path / "extensions/eda/plugins/event_source/broken.py"
    source.parent.mkdir(parents=True)
    source.write_text(planted, encoding="utf-8")
    (tmp_path / "rst").mkdir()
    assert eda_sources.main([str(tmp_path), str(tmp_path / "rst")]) == 1
    error = capsys.readouterr().err
    assert "extensions/eda/plugins/event_source/broken.py" in error and message in error, error
    assert not list((tmp_path / "rst").iterdir())


def test_links_name_files_that_exist() -> None:
    links = yaml.safe_load((ROOT / "docs/docsite/links.yml").read_text(encoding="utf-8"))
    urls = [link["url"] for link in links.get("extra_links", [])]
    ours = [url[len(REPOSITORY_BLOB):].split("#")[0] for url in urls if url.startswith(REPOSITORY_BLOB)]
    assert ours, "docs/docsite/links.yml links none of the repository's docs"
    missing = [path for path in ours if not (ROOT / path).is_file()]
    assert not missing, f"docs/docsite/links.yml links files that do not exist: {missing}"


def test_references_to_ansible_docs_resolve_offline() -> None:
    sys.path.insert(0, str(ROOT / SITE))
    try:
        conf = load_module(ROOT / SITE / "conf.py", "docsite_conf")
    finally:
        sys.path.remove(str(ROOT / SITE))
    base = "https://docs.ansible.com/projects/ansible/latest"
    assert conf.external_url("ansible_collections.ansible.builtin.slurp_module") == (
        f"{base}/collections/ansible/builtin/slurp_module.html")
    assert conf.external_url("ansible_collections.kubernetes.core.k8s_module__parameter-state") == (
        f"{base}/collections/kubernetes/core/k8s_module.html#parameter-state")
    assert conf.external_url("common_return_values") == (
        f"{base}/reference_appendices/common_return_values.html")
    # our own labels and unknown ones stay unresolved, so that Sphinx warns about them
    assert conf.external_url("ansible_collections.devin.outposts.wroker_role") is None
    assert conf.external_url("no_such_label") is None
