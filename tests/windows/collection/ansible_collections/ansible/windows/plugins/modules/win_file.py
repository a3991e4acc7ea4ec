# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""Test-only stand-in for ansible.windows.win_file (../../README.md): state directory, absent, file and touch, on the
Wine prefix. Never shipped."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.ansible.windows.plugins.module_utils.wine_standin import WinePrefix, argument_spec


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(
            path=dict(type="str", required=True, aliases=["dest", "name"]),
            state=dict(type="str", choices=["absent", "directory", "file", "touch"]),
        ),
        supports_check_mode=True,
    )
    path, state = module.params["path"], module.params["state"]
    target = WinePrefix(module).path(path)
    exists = os.path.lexists(target)
    if state == "absent":
        if exists and not module.check_mode:
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)
            else:
                os.remove(target)
        module.exit_json(changed=exists)
    if state == "directory":
        if exists and not os.path.isdir(target):
            module.fail_json(msg="path %s is not a directory" % path)
        if not exists and not module.check_mode:
            os.makedirs(target)
        module.exit_json(changed=not exists)
    if state == "touch":
        if not module.check_mode:
            with open(target, "ab"):
                os.utime(target, None)
        module.exit_json(changed=True)
    # state file (or none): the path must exist.
    if not exists:
        module.fail_json(msg="path %s will not be created" % path)
    module.exit_json(changed=False)


if __name__ == "__main__":
    main()
