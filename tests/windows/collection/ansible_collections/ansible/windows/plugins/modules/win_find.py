# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""Test-only stand-in for ansible.windows.win_find (../../README.md): the files or directories directly in paths, in
the Wine prefix (no patterns, no recursion: the role uses neither). Never shipped."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ntpath
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.ansible.windows.plugins.module_utils.wine_standin import WinePrefix, argument_spec


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(
            paths=dict(type="list", elements="str", required=True),
            file_type=dict(type="str", default="file", choices=["directory", "file"]),
        ),
        supports_check_mode=True,
    )
    prefix = WinePrefix(module)
    files, examined = [], 0
    for folder in module.params["paths"]:
        root = prefix.path(folder)
        if not os.path.isdir(root):
            module.fail_json(msg="Argument path %s does not exist, cannot get information on it" % folder)
        for name in sorted(os.listdir(root)):
            examined += 1
            isdir = os.path.isdir(os.path.join(root, name))
            if isdir != (module.params["file_type"] == "directory"):
                continue
            files.append(
                {
                    "filename": name,
                    "path": ntpath.join(folder, name),
                    "isdir": isdir,
                    "isreg": not isdir,
                    "extension": None if isdir else ntpath.splitext(name)[1],
                }
            )
    module.exit_json(changed=False, files=files, matched=len(files), examined=examined)


if __name__ == "__main__":
    main()
