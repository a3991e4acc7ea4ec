"""Write the docs site's pages for the collection's Event-Driven Ansible event sources.

antsibull-docs documents what ansible-doc knows (modules, plugins, roles); ansible-doc knows nothing of
extensions/eda/plugins/event_source/, so this script renders those sources itself, from the DOCUMENTATION and
EXAMPLES strings that ansible.eda's conventions ask of a source (read with ast: the source is never imported,
so its dependencies, aiohttp for instance, need not be installed). Markup (C(), O(), M(), ...) goes through
antsibull-docs-parser, as for the other plugins, so that a bad markup or a reference to an unknown option
fails here, or as a Sphinx warning, like anywhere else on the site.

    python docs/site/eda_sources.py COLLECTION_ROOT RST_DIR

Writes RST_DIR/<name>_event_source.rst per source and appends an "Event Sources" section to RST_DIR/index.rst
(the collection index antsibull-docs wrote). Exits 1, naming the file, on a source whose documentation is
missing or malformed. No source: writes nothing.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import yaml
from antsibull_docs.rst_labels import get_option_ref, get_plugin_ref
from antsibull_docs_parser import dom, parser, rst

COLLECTION = "devin.outposts"
PLUGIN_TYPE = "event_source"
SOURCES_DIR = Path("extensions/eda/plugins/event_source")
OPTION_KEYS = {
    "description", "type", "required", "default", "choices", "elements", "suboptions", "version_added",
}
DOC_KEYS = {"short_description", "description", "options", "notes", "author", "version_added", "requirements",
            "seealso", "name"}
REQUIRED_DOC_KEYS = ("short_description", "description")


class DocError(Exception):
    """A source's documentation is missing or malformed."""


class EventSourceFormatter(rst.AntsibullRSTFormatter):
    """antsibull-docs' RST, but O() of an event source's option is a plain reference to the label this script
    writes for it (sphinx_antsibull_ext's option role knows no event sources), so that Sphinx still fails on a
    reference to an option that does not exist."""

    def format_option_name(self, part: dom.OptionNamePart, url: str | None) -> str:
        if part.plugin is None or part.plugin.type != PLUGIN_TYPE:
            return super().format_option_name(part, url)
        text = part.name if part.value is None else f"{part.name}={part.value}"
        label = get_option_ref(part.plugin.fqcn, part.plugin.type, None, part.link)
        return f"\\ :ref:`{rst.rst_escape(text)} <{label}>`\\ "


FORMATTER = EventSourceFormatter()


def doc_strings(path: Path) -> dict[str, str]:
    """The module-level string constants DOCUMENTATION and EXAMPLES of a Python file, without importing it."""
    found: dict[str, str] = {}
    for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in ("DOCUMENTATION", "EXAMPLES"):
                    if not isinstance(node.value.value, str):
                        raise DocError(f"{target.id} is not a string")
                    found[target.id] = node.value.value
    return found


def heading(text: str, underline: str) -> list[str]:
    return [text, underline * len(text), ""]


def as_list(value: Any) -> list[str]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(item, str) for item in items):
        raise DocError(f"expected text or a list of texts, got {value!r}")
    return items


def markup(texts: list[str], plugin: dom.PluginIdentifier, where: str) -> str:
    """Ansible markup as RST; a markup error is a DocError naming where it is."""
    try:
        context = parser.Context(current_plugin=plugin)
        paragraphs = parser.parse(texts, context, errors="exception", strict=True)
    except ValueError as error:
        raise DocError(f"{where}: {error}") from error
    return rst.to_rst(paragraphs, formatter=FORMATTER, current_plugin=plugin)


def literal(value: Any) -> str:
    text = str(yaml.safe_dump(value, default_flow_style=True, width=1000)).strip()
    text = text.removesuffix("...").strip()
    return "``" + text.replace("`", "\\`") + "``"


def option_lines(options: Any, plugin: dom.PluginIdentifier, path: list[str], indent: str) -> list[str]:
    if not isinstance(options, dict):
        raise DocError(f"options at {'/'.join(path) or 'the top'} must be a mapping")
    lines: list[str] = []
    for name in sorted(options):
        spec = options[name]
        where = "options/" + "/".join([*path, name])
        if not isinstance(spec, dict):
            raise DocError(f"{where} must be a mapping")
        unknown = set(spec) - OPTION_KEYS
        if unknown:
            raise DocError(f"{where} has unknown keys: {', '.join(sorted(unknown))}")
        if not as_list(spec.get("description")):
            raise DocError(f"{where} has no description")
        facts = [f"``{spec.get('type', 'str')}``"]
        if spec.get("elements"):
            facts[0] = f"``{spec.get('type', 'list')}`` of ``{spec['elements']}``"
        if spec.get("required"):
            facts.append("required")
        if "default" in spec and spec["default"] is not None:
            facts.append(f"default: {literal(spec['default'])}")
        if spec.get("choices"):
            facts.append("choices: " + ", ".join(literal(choice) for choice in spec["choices"]))
        label = get_option_ref(plugin.fqcn, plugin.type, None, [*path, name])
        body = markup(as_list(spec["description"]), plugin, where)
        lines += [f"{indent}.. _{label}:", "", f"{indent}- **{name}** ({'; '.join(facts)})", ""]
        lines += [f"{indent}  {line}" if line else "" for line in body.splitlines()]
        lines.append("")
        if spec.get("suboptions"):
            lines += option_lines(spec["suboptions"], plugin, [*path, name], indent + "  ")
    return lines


def render(path: Path) -> tuple[str, str]:
    """(name, RST page) of one event source file."""
    name = path.stem
    plugin = dom.PluginIdentifier(fqcn=f"{COLLECTION}.{name}", type=PLUGIN_TYPE)
    strings = doc_strings(path)
    if "DOCUMENTATION" not in strings:
        raise DocError("no DOCUMENTATION string")
    if "EXAMPLES" not in strings:
        raise DocError("no EXAMPLES string")
    try:
        doc = yaml.safe_load(strings["DOCUMENTATION"])
        yaml.safe_load(strings["EXAMPLES"])
    except yaml.YAMLError as error:
        raise DocError(f"not valid YAML: {error}") from error
    if not isinstance(doc, dict):
        raise DocError("DOCUMENTATION is not a mapping")
    unknown = set(doc) - DOC_KEYS
    if unknown:
        raise DocError(f"DOCUMENTATION has unknown keys: {', '.join(sorted(unknown))}")
    for key in REQUIRED_DOC_KEYS:
        if not as_list(doc.get(key)):
            raise DocError(f"DOCUMENTATION has no {key}")
    summary = markup(as_list(doc["short_description"]), plugin, "short_description")
    title = f"{plugin.fqcn} event source -- {summary}"
    lines = [f".. _{get_plugin_ref(plugin.fqcn, plugin.type)}:", "", *heading(title, "=")]
    lines += [
        f"This event source is part of the {COLLECTION} collection. Use it in a rulebook's ``sources`` as "
        f"``{plugin.fqcn}``; ansible-rulebook finds it in the installed collection.",
        "",
    ]
    if doc.get("version_added"):
        lines += [f"New in {COLLECTION} {doc['version_added']}.", ""]
    lines += heading("Synopsis", "-")
    lines += [markup(as_list(doc["description"]), plugin, "description"), ""]
    if doc.get("requirements"):
        lines += heading("Requirements", "-")
        lines += [f"- {markup([item], plugin, 'requirements')}" for item in as_list(doc["requirements"])]
        lines.append("")
    lines += heading("Parameters", "-")
    options = option_lines(doc.get("options") or {}, plugin, [], "")
    lines += options or ["This source takes no parameters.", ""]
    if doc.get("notes"):
        lines += heading("Notes", "-")
        lines += [f"- {markup([note], plugin, 'notes')}" for note in as_list(doc["notes"])] + [""]
    lines += heading("Examples", "-")
    lines += [".. code-block:: yaml+jinja", ""]
    lines += [f"    {line}" if line else "" for line in strings["EXAMPLES"].strip("\n").splitlines()] + [""]
    if doc.get("author"):
        lines += heading("Authors", "-")
        lines += [f"- {rst.rst_escape(author)}" for author in as_list(doc["author"])] + [""]
    return name, "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root, out = Path(argv[0]), Path(argv[1])
    sources = sorted(p for p in (root / SOURCES_DIR).glob("*.py") if not p.name.startswith("_"))
    pages: list[str] = []
    failed = False
    for path in sources:
        try:
            name, page = render(path)
        except (DocError, SyntaxError) as error:
            print(f"ERROR: {path.relative_to(root)}: {error}", file=sys.stderr)
            failed = True
            continue
        (out / f"{name}_event_source.rst").write_text(page, encoding="utf-8")
        pages.append(f"{name}_event_source")
    if failed:
        return 1
    if pages:
        index = out / "index.rst"
        section = ["", "", *heading("Event Sources", "-"), ".. toctree::", "    :maxdepth: 1", ""]
        section += [f"    {page}" for page in pages]
        index.write_text(index.read_text(encoding="utf-8").rstrip("\n") + "\n".join(section) + "\n",
                         encoding="utf-8")
        print(f"eda_sources: {len(pages)} event source page(s): {', '.join(pages)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
