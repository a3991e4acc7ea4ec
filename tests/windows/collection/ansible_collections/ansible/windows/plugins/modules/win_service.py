# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""Test-only stand-in for ansible.windows.win_service (../../README.md): state started, stopped and restarted, of a
service registered in the Wine prefix's service manager, with Wine's sc.exe and net.exe. Never shipped."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.ansible.windows.plugins.module_utils.wine_standin import WinePrefix, argument_spec


def state_of(prefix, name):
    """The service's state (running, stopped, ...), or None when it is not installed."""
    rc, out, dummy = prefix.run(["sc", "query", name])
    match = re.search(r"STATE\s*:\s*\d+\s+(\w+)", out)
    return match.group(1).lower() if rc == 0 and match else None


def net(prefix, verb, name):
    rc, out, err = prefix.run(["net", verb, name])
    if rc != 0:
        prefix.module.fail_json(msg="Failed to %s service %s: %s" % (verb, name, (out + err).strip()))


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(
            name=dict(type="str", required=True),
            state=dict(type="str", choices=["started", "stopped", "restarted"]),
        ),
        supports_check_mode=True,
    )
    params, prefix = module.params, WinePrefix(module)
    name, state = params["name"], params["state"]
    current = state_of(prefix, name)
    if current is None:
        module.fail_json(
            msg="Service '%s' is not installed, need to set 'path' to create a new service" % name
        )
    changed = (
        state == "restarted"
        or (state == "started" and current != "running")
        or (state == "stopped" and current != "stopped")
    )
    if changed and not module.check_mode:
        if state in ("stopped", "restarted") and current != "stopped":
            net(prefix, "stop", name)
        if state in ("started", "restarted"):
            net(prefix, "start", name)
    module.exit_json(changed=changed, exists=True, name=name, state=state_of(prefix, name))


if __name__ == "__main__":
    main()
