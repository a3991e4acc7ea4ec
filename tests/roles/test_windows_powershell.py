"""Every PowerShell snippet of the Windows branches parses: the .ps1 files under roles/*/files and
extensions/molecule/windows, and the inline ``script:`` of win_powershell and the commands of win_shell tasks in the
Windows task files and the Windows Molecule scenario. No Windows and no pwsh here: tree-sitter-powershell parses
the text, and a syntax error anywhere in a snippet fails the test (see the negative cases at the end).

The roles themselves run no PowerShell of their own any more (the CA bundle is built by files/windows/ca_bundle.py,
which runs under Wine in the windows stage); a test keeps it so. The snippets left are the Molecule scenario's, for
a real Windows host. Wine's powershell.exe is a stub that prints nothing and exits 0: it is never used as a check.

Jinja in an inline snippet is rendered with placeholder values first, so that ``{{ x }}`` does not count as a
PowerShell hash literal; snippets that come from ``lookup('file', ...)`` are checked as their .ps1 file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import pytest
import tree_sitter
import tree_sitter_powershell
import yaml

ROOT = Path(__file__).resolve().parents[2]
PARSER = tree_sitter.Parser(tree_sitter.Language(tree_sitter_powershell.language()))
SNIPPET_MODULES = {
    "ansible.windows.win_powershell": "script",
    "ansible.windows.win_shell": "cmd",
    "ansible.windows.win_shell.free_form": "_raw_params",
}
TASK_FILES = sorted(
    [*ROOT.glob("roles/*/tasks/windows*.yml"), *ROOT.glob("roles/*/handlers/*.yml"),
     *ROOT.glob("extensions/molecule/windows/*.yml")]
)  # fmt: skip
PS1_FILES = sorted([*ROOT.glob("roles/*/files/**/*.ps1"), *ROOT.glob("extensions/molecule/windows/**/*.ps1")])


def syntax_errors(source: str) -> list[str]:
    """Where tree-sitter found an error or a missing token: ``line:column: text`` per problem; empty if none."""
    tree = PARSER.parse(source.encode("utf-8"))
    problems: list[str] = []
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.is_error or node.is_missing:
            text = source.encode("utf-8")[node.start_byte : node.end_byte].decode("utf-8", "replace")[:40]
            kind = "missing " + node.type if node.is_missing else "unexpected"
            problems.append(f"{node.start_point[0] + 1}:{node.start_point[1] + 1}: {kind} {text!r}")
        elif node.has_error:
            stack.extend(node.children)
    if tree.root_node.has_error and not problems:
        problems.append("a syntax error tree-sitter could not place")
    return problems


def _tasks(data: Any) -> Iterator[dict[str, Any]]:
    """Every task of a task file or playbook, blocks and their rescue/always included."""
    if isinstance(data, list):
        for item in data:
            yield from _tasks(item)
    elif isinstance(data, dict):
        if any(key in data for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always")):
            for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
                yield from _tasks(data.get(key) or [])
        else:
            yield data


def _placeholder_jinja(text: str) -> str:
    """``{{ ... }}`` as a bare word, ``{% ... %}`` dropped: what PowerShell would see after templating."""
    return re.sub(r"\{%.*?%\}", "", re.sub(r"\{\{.*?\}\}", "jinja_value", text, flags=re.S), flags=re.S)


def inline_snippets() -> list[tuple[str, str]]:
    """(label, PowerShell source) for every inline snippet of the Windows task files."""
    found = []
    for path in TASK_FILES:
        for task in _tasks(yaml.safe_load(path.read_text(encoding="utf-8"))):
            for module in ("ansible.windows.win_powershell", "ansible.windows.win_shell"):
                args = task.get(module)
                if args is None:
                    continue
                source = args if isinstance(args, str) else args.get("script") or args.get("cmd") or ""
                if "lookup(" in source:
                    continue  # a .ps1 file: checked on its own
                found.append((f"{path.relative_to(ROOT)}: {task.get('name')}", _placeholder_jinja(source)))
    return found


def test_there_are_snippets_to_check() -> None:
    """The globs find the scenario's snippets (a moved file must not silently drop out of the check)."""
    assert any("windows_install.yml" in str(p) for p in TASK_FILES)
    assert len(INLINE) >= 3, INLINE


def test_the_roles_run_no_powershell_of_their_own() -> None:
    """Logic the roles need on a Windows host is Python (it runs under Wine in CI); PowerShell only in modules."""
    role_snippets = [label for label, dummy in INLINE if label.startswith("roles/")]
    role_ps1 = [str(p.relative_to(ROOT)) for p in PS1_FILES if p.is_relative_to(ROOT / "roles")]
    assert (role_snippets, role_ps1) == ([], [])


def test_ps1_files_parse() -> None:
    """Any .ps1 a role or the scenario ships (none today: a new one is checked as soon as it exists)."""
    problems = {str(path.relative_to(ROOT)): syntax_errors(path.read_text(encoding="utf-8")) for path in PS1_FILES}
    assert {path: found for path, found in problems.items() if found} == {}


INLINE = inline_snippets()


@pytest.mark.parametrize(("label", "source"), INLINE, ids=[label for label, dummy in INLINE])
def test_inline_snippets_parse(label: str, source: str) -> None:
    assert syntax_errors(source) == [], label


@pytest.mark.parametrize(
    "broken",
    [
        "if ($x { Write-Output 1 }",                      # unclosed parenthesis
        "$table = @{ a = 1",                              # unclosed hash literal
        "$text = \"never closed",                         # unterminated string
        "foreach ($i in 1..3) { Write-Output $i",         # unclosed block
        "[CmdletBinding()]\nparam ([string]$A\n$A",       # unclosed param block
    ],
    ids=["paren", "hash", "string", "block", "param"],
)  # fmt: skip
def test_a_broken_snippet_fails_the_check(broken: str) -> None:
    assert syntax_errors(broken) != []


def test_a_broken_copy_of_a_scenario_snippet_fails_the_check() -> None:
    """Damage one of the scenario's own snippets: the check that passes on it fails on the damaged copy."""
    label, source = next((label, source) for label, source in INLINE if "{" in source and "}" in source)
    assert syntax_errors(source) == [], label
    damaged = source[: source.rindex("}")]
    assert syntax_errors(damaged) != [], label
