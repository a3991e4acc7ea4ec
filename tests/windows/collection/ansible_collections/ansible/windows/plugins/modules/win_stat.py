# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""Test-only stand-in for ansible.windows.win_stat (../../README.md): exists, isdir, isreg, size and the checksum of
a path in the Wine prefix. Never shipped."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ntpath
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.ansible.windows.plugins.module_utils.wine_standin import (
    WinePrefix,
    argument_spec,
    digest,
)


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(
            path=dict(type="path", required=True, aliases=["dest", "name"]),
            get_checksum=dict(type="bool", default=True),
            checksum_algorithm=dict(
                type="str", default="sha1", choices=["md5", "sha1", "sha256", "sha384", "sha512"]
            ),
            follow=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    path = module.params["path"]
    target = WinePrefix(module).path(path)
    if not os.path.exists(target):
        module.exit_json(changed=False, stat={"exists": False})
    isdir = os.path.isdir(target)
    stat = {
        "exists": True,
        "path": path,
        "filename": ntpath.basename(path),
        "isdir": isdir,
        "isreg": not isdir,
        "islnk": False,
        "size": 0 if isdir else os.path.getsize(target),
        "extension": None if isdir else ntpath.splitext(path)[1],
        "lastwritetime": os.path.getmtime(target),
    }
    if not isdir and module.params["get_checksum"]:
        stat["checksum"] = digest(target, module.params["checksum_algorithm"])
    module.exit_json(changed=False, stat=stat)


if __name__ == "__main__":
    main()
