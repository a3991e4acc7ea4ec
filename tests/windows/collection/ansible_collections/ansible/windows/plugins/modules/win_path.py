# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""Test-only stand-in for ansible.windows.win_path (../../README.md): the elements of the machine's PATH in the Wine
registry (HKLM\\System\\CurrentControlSet\\Control\\Session Manager\\Environment), read and written with Wine's
reg.exe; compared as the real module does (case-insensitive, quotes and trailing backslashes ignored); written back as
REG_EXPAND_SZ. Never shipped."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.ansible.windows.plugins.module_utils.wine_standin import WinePrefix, argument_spec

MACHINE_KEY = r"HKLM\System\CurrentControlSet\Control\Session Manager\Environment"


def _key(element):
    return element.strip('"').strip("\\").lower()


def read_value(prefix, name):
    rc, out, err = prefix.run(["reg", "query", MACHINE_KEY, "/v", name])
    if rc != 0:
        return ""  # reg query fails for a value that does not exist
    for line in out.splitlines():
        match = re.match(r"^\s+(\S+)\s+REG_(?:EXPAND_)?SZ(?:\s+(.*))?$", line.rstrip("\r"))
        if match and match.group(1).lower() == name.lower():
            return match.group(2) or ""
    prefix.module.fail_json(msg="could not read %s from reg query's output: %s" % (name, out + err))


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(
            name=dict(type="str", default="PATH"),
            elements=dict(type="list", elements="str", required=True),
            state=dict(type="str", default="present", choices=["absent", "present"]),
            scope=dict(type="str", default="machine", choices=["machine", "user"]),
        ),
        supports_check_mode=True,
    )
    params, prefix = module.params, WinePrefix(module)
    if params["scope"] != "machine":
        module.fail_json(msg="test-only stand-in: only scope machine is implemented")
    before = read_value(prefix, params["name"])
    existing = [element for element in before.split(";") if element]
    if params["state"] == "present":
        for element in params["elements"]:
            if _key(element) not in [_key(item) for item in existing]:
                existing.append(element)
    else:
        wanted = set(_key(element) for element in params["elements"])
        existing = [item for item in existing if _key(item) not in wanted]
    after = ";".join(existing)
    changed = after != before
    if changed and not module.check_mode:
        rc, out, err = prefix.run(
            ["reg", "add", MACHINE_KEY, "/v", params["name"], "/t", "REG_EXPAND_SZ", "/d", after, "/f"]
        )
        if rc != 0:
            module.fail_json(msg="reg add failed: %s" % (out + err))
    module.exit_json(changed=changed, path_value=after)


if __name__ == "__main__":
    main()
