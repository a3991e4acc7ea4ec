"""Sphinx configuration of the collection's docs site (docs/site/build.sh writes rst/ and builds it).

The build runs offline (CI reaches only PyPI, Debian and npm), so there is no intersphinx: a reference to a
page of Ansible's own docs (ansible.builtin's modules, other collections' plugins, a few reference pages) is
resolved here to its URL on docs.ansible.com. Any other unresolved reference stays a warning, and the build
treats warnings as errors.
"""

from __future__ import annotations

import re
from typing import Any

from docutils import nodes

project = "devin.outposts"
copyright = "devin.outposts contributors"  # pylint: disable=redefined-builtin
title = "devin.outposts"
html_short_title = "devin.outposts"

extensions = ["sphinx_antsibull_ext"]

pygments_style = "ansible"
highlight_language = "YAML+Jinja"

html_theme = "sphinx_ansible_theme"
html_show_sphinx = False
html_use_smartypants = True
html_use_modindex = False
html_use_index = False
html_copy_source = False

default_role = "any"
# Every reference must resolve: a misspelt option, plugin or label is a warning, and so an error.
nitpicky = True

ANSIBLE_DOCS = "https://docs.ansible.com/projects/ansible/latest"
# Labels of Ansible's own docs that antsibull-docs' generated pages use.
ANSIBLE_LABELS = {
    "common_return_values": "reference_appendices/common_return_values.html",
    "ansible_configuration_settings": "reference_appendices/config.html",
}
# ansible_collections.<namespace>.<collection>.<plugin>_<type>[__<anchor>]
PLUGIN_LABEL = re.compile(
    r"^ansible_collections\.(?P<namespace>[a-z0-9_]+)\.(?P<collection>[a-z0-9_]+)\."
    r"(?P<page>[a-z0-9_]+_[a-z_]+?)(?:__(?P<anchor>.+))?$"
)
OWN_COLLECTION = ("devin", "outposts")


def external_url(label: str) -> str | None:
    """The docs.ansible.com URL of a label from Ansible's docs, or None when it is not one (or is ours)."""
    if label in ANSIBLE_LABELS:
        return f"{ANSIBLE_DOCS}/{ANSIBLE_LABELS[label]}"
    found = PLUGIN_LABEL.match(label)
    if found is None or (found["namespace"], found["collection"]) == OWN_COLLECTION:
        return None
    url = f"{ANSIBLE_DOCS}/collections/{found['namespace']}/{found['collection']}/{found['page']}.html"
    return f"{url}#{found['anchor']}" if found["anchor"] else url


def resolve_external(app: Any, env: Any, node: Any, contnode: Any) -> Any:  # pylint: disable=unused-argument
    """Sphinx's missing-reference hook: a link to docs.ansible.com for a label of Ansible's docs."""
    if node.get("refdomain") != "std" or node.get("reftype") != "ref":
        return None
    url = external_url(node.get("reftarget", ""))
    if url is None:
        return None
    reference = nodes.reference("", "", internal=False, refuri=url)
    reference.append(contnode)
    return reference


def setup(app: Any) -> dict[str, Any]:
    app.connect("missing-reference", resolve_external)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
