# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""Test-only stand-in for ansible.windows.win_command (../../README.md): argv run by Wine in the prefix (the program
must be a real Windows executable); rc, stdout and stderr as the real module returns them. Never shipped."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime
import ntpath
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.ansible.windows.plugins.module_utils.wine_standin import WinePrefix, argument_spec


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(argv=dict(type="list", elements="str", required=True)),
        supports_check_mode=False,
    )
    prefix, argv = WinePrefix(module), module.params["argv"]
    if ntpath.isabs(argv[0]) and not os.path.isfile(prefix.path(argv[0])):
        # What the real module reports when its search for the executable fails (no rc: nothing ran).
        module.fail_json(msg="Could not find file '%s' to execute" % argv[0], cmd=" ".join(argv))
    start = datetime.datetime.now()
    rc, stdout, stderr = prefix.run(argv)
    end = datetime.datetime.now()
    result = dict(
        changed=True,
        cmd=" ".join(argv),
        rc=rc,
        stdout=stdout,
        stderr=stderr,
        start=str(start),
        end=str(end),
        delta=str(end - start),
    )
    if rc != 0:
        module.fail_json(msg="non-zero return code", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
