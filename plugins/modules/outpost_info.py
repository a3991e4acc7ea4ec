#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: outpost_info
short_description: List Devin outposts, or find one by name or id
version_added: 0.1.0
description:
  - Lists the outposts of the account, with their live queue depth and active claims.
  - With O(name) or O(id), returns only that outpost, or an empty list when it does not exist; a missing
    outpost is not an error.
author:
  - devin.outposts maintainers (@devin-outposts)
extends_documentation_fragment:
  - devin.outposts.fleet_api
  - devin.outposts.attributes
  - devin.outposts.attributes.info_module
  - devin.outposts.attributes.action_group
options:
  name:
    description:
      - Only return the outpost with this name.
      - A value that cannot be an outpost name (see O(devin.outposts.outpost#module:name)) fails the task.
      - Mutually exclusive with O(id).
    type: str
  id:
    description:
      - Only return the outpost with this id (C(outpost_env-...)).
      - Mutually exclusive with O(name).
    type: str
    aliases: [outpost_id]
notes:
  - The list is read with C(GET /opbeta/outposts/outposts), which a token with the C(account.outposts.machine)
    scope may read; the module never needs the orchestrator scope.
seealso:
  - module: devin.outposts.outpost
  - module: devin.outposts.session_info
  - plugin: devin.outposts.outpost_id
    plugin_type: lookup
"""

EXAMPLES = r"""
- name: List all outposts
  devin.outposts.outpost_info:
  register: all_outposts

- name: Show name, id and queue depth of each
  ansible.builtin.debug:
    msg: "{{ item.spec.name }} {{ item.metadata.outpost_id }} {{ item.status.queue_depth }}"
  loop: "{{ all_outposts.outposts }}"

- name: Check whether the gpu-h200 outpost exists
  devin.outposts.outpost_info:
    name: gpu-h200
  register: gpu

- name: Fail when it does not
  ansible.builtin.assert:
    that: gpu.outposts | length == 1
"""

RETURN = r"""
outposts:
  description:
    - The matching outposts as the API returned them. Empty when O(name) or O(id) matches nothing.
  returned: always
  type: list
  elements: dict
  contains:
    metadata:
      description: V(outpost_id), V(account_id) and V(created_at) (Unix seconds).
      type: dict
      returned: success
    spec:
      description: V(name), V(platform) (V(null) means the default platform) and V(description).
      type: dict
      returned: success
    status:
      description: Live V(queue_depth) (pending sessions) and V(active_claims).
      type: dict
      returned: success
  sample:
    - metadata: {outpost_id: outpost_env-3f2a, account_id: account-1, created_at: 1781050000}
      spec: {name: gpu-h200, platform: linux, description: H200 boxes in the lab}
      status: {queue_depth: 2, active_claims: 1}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.devin.outposts.plugins.module_utils._fleet_api import (
    fleet_argument_spec,
    outpost_name_error,
    run_module,
)


def main():
    module = AnsibleModule(
        argument_spec=fleet_argument_spec(
            name=dict(type="str"),
            id=dict(type="str", aliases=["outpost_id"]),
        ),
        mutually_exclusive=[("name", "id")],
        supports_check_mode=True,
    )
    name, outpost_id = module.params["name"], module.params["id"]
    error = name is not None and outpost_name_error("name", name)
    if error:
        module.fail_json(msg=error)

    def read(client):
        if name is None and outpost_id is None:
            return dict(changed=False, outposts=client.list_outposts())
        found = client.find_outpost(name=name, outpost_id=outpost_id)
        return dict(changed=False, outposts=[found] if found else [])

    run_module(module, read)


if __name__ == "__main__":
    main()
