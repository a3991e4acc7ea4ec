# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""Let plain ``pytest tests/unit`` import the collection as ``ansible_collections.devin.outposts``.

``ansible-test units`` installs Ansible's collection loader itself; then this does nothing. Run from a
plain checkout (``/work/main``), it links the checkout into a temporary ``ansible_collections/devin/outposts``
tree and installs the loader on it, so the same tests run both ways.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import atexit
import os
import shutil
import tempfile


def _install_collection_loader():
    from ansible.utils.collection_loader import AnsibleCollectionConfig

    if AnsibleCollectionConfig.collection_finder is not None:
        return  # ansible-test (or an earlier conftest) already did it
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parts = root.split(os.sep)
    if parts[-3:-2] == ["ansible_collections"] and parts[-2:] == ["devin", "outposts"]:
        base = os.sep.join(parts[:-3])
    else:
        base = tempfile.mkdtemp(prefix="devin-outposts-units-")
        # The tree holds only a symlink to the checkout; rmtree removes the link, never the checkout.
        atexit.register(shutil.rmtree, base, ignore_errors=True)
        os.makedirs(os.path.join(base, "ansible_collections", "devin"))
        os.symlink(root, os.path.join(base, "ansible_collections", "devin", "outposts"))
    os.environ["ANSIBLE_COLLECTIONS_PATH"] = base
    from ansible.plugins.loader import init_plugin_loader

    init_plugin_loader([base])


_install_collection_loader()
