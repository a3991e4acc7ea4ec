"""Lines of logic per layer of ``devin_outposts``, the largest files, and the imports across layers.

A line of logic is a line that holds code: blank lines, comment lines and docstrings do not count (a
docstring is the first statement of a module, class or function when it is a string). The layers are
the subpackages of ``devin_outposts`` (``api``, ``core``, ``worker``, ``orchestrator``, ``cli``) plus the
top-level modules (``privacy.py``, ``__init__.py``, ``__main__.py``).

The cross-layer figures are the ones issue 25 asks for: which ``worker`` modules the ``orchestrator``
imports (and which ``orchestrator`` modules the ``worker`` imports), counting imports inside functions
too.

    .venv/bin/python benchmarks/layer_lines.py            # this tree
    .venv/bin/python benchmarks/layer_lines.py --top 10   # and the ten largest files
    .venv/bin/python benchmarks/layer_lines.py --json     # for comparing two trees
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import sys
import tokenize
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "devin-outposts" / "src" / "devin_outposts"
LAYERS = ("api", "core", "worker", "orchestrator", "cli")
TOP = "(top level)"
#: Files past this many lines of logic are reported (the house limit is about 400).
LIMIT = 400
_NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def docstring_lines(tree: ast.Module) -> set[int]:
    """The line numbers taken by docstrings (module, class and function)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        if not body or not isinstance(body[0], ast.Expr):
            continue
        value = body[0].value
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            end = body[0].end_lineno or body[0].lineno
            lines.update(range(body[0].lineno, end + 1))
    return lines


def logic_lines(source: str) -> int:
    """Lines holding at least one token of code that is not part of a docstring."""
    skip = docstring_lines(ast.parse(source))
    code: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in _NOT_CODE:
            continue
        for line in range(token.start[0], token.end[0] + 1):
            if line not in skip:
                code.add(line)
    return len(code)


def module_name(root: Path, path: Path) -> str:
    """``root/a/b.py`` -> ``devin_outposts.a.b`` (``root`` is the package directory)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The ``devin_outposts`` modules ``module`` imports, anywhere in it (relative imports resolved);
    ``from package import module`` counts the module, not the package."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            submodules = {f"{base}.{alias.name}" for alias in node.names} & known
            found.update(submodules if submodules else {base})
    return {name for name in found if name in known}


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else TOP


@dataclass
class Tree:
    lines: Counter[str] = field(default_factory=Counter)
    files: Counter[str] = field(default_factory=Counter)
    per_file: dict[str, int] = field(default_factory=dict)
    #: (importing layer, imported layer) -> {importing module: imported modules}
    crossings: dict[tuple[str, str], dict[str, set[str]]] = field(default_factory=dict)


def survey(root: Path) -> Tree:
    known = {module_name(root, path) for path in root.rglob("*.py")}
    tree = Tree()
    for path in sorted(root.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        module = module_name(root, path)
        layer = layer_of(module)
        count = logic_lines(source)
        tree.lines[layer] += count
        tree.files[layer] += 1
        tree.per_file[str(path.relative_to(root))] = count
        for target in imported_modules(source, module, path.name == "__init__.py", known):
            crossing = tree.crossings.setdefault((layer, layer_of(target)), {})
            crossing.setdefault(module, set()).add(target)
    return tree


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument(
        "--root", type=Path, default=PACKAGE, help="the devin_outposts package directory (another checkout's)"
    )
    parser.add_argument("--top", type=int, default=0, help="also list the N largest files")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    tree = survey(args.root)
    between = {
        f"{source}->{target}": {module: sorted(targets) for module, targets in sorted(modules.items())}
        for (source, target), modules in sorted(tree.crossings.items())
        if source != target
    }
    if args.json:
        figures = {
            "lines": dict(tree.lines),
            "files": dict(tree.files),
            "total": sum(tree.lines.values()),
            "over_limit": {name: n for name, n in tree.per_file.items() if n > LIMIT},
            "imports_between_layers": between,
        }
        print(json.dumps(figures, indent=2, sort_keys=True))
        return 0
    print(f"{'layer':<14} {'files':>5} {'lines of logic':>15}")
    for layer in (*LAYERS, TOP):
        if tree.files[layer]:
            print(f"{layer:<14} {tree.files[layer]:>5} {tree.lines[layer]:>15}")
    print(f"{'total':<14} {sum(tree.files.values()):>5} {sum(tree.lines.values()):>15}")
    over = sorted(((n, name) for name, n in tree.per_file.items() if n > LIMIT), reverse=True)
    listed = ", ".join(f"{name} ({n})" for n, name in over) or "none"
    print(f"\nfiles over {LIMIT} lines of logic: {listed}")
    if args.top:
        print(f"\nthe {args.top} largest files:")
        for n, name in sorted(((n, name) for name, n in tree.per_file.items()), reverse=True)[: args.top]:
            print(f"  {n:>5}  {name}")
    for a, b in (("orchestrator", "worker"), ("worker", "orchestrator")):
        modules = tree.crossings.get((a, b), {})
        targets = sorted({target for found in modules.values() for target in found})
        print(f"\n{a} -> {b}: {len(targets)} {b} module(s) imported by {len(modules)} {a} module(s)")
        for target in targets:
            print(f"  {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
