#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: outpost
short_description: Create or delete a Devin outpost
version_added: 0.1.0
description:
  - Creates or deletes an outpost, the named queue of Devin sessions that your own machines serve.
  - Outposts are matched by O(name), which is unique per account.
  - The fleet API cannot change an existing outpost. If the outpost exists with a different O(platform) or
    O(description), the module fails and lists the differences, unless O(recreate=true) allows it to delete
    the outpost and create it again.
author:
  - devin.outposts maintainers (@devin-outposts)
extends_documentation_fragment:
  - devin.outposts.fleet_api
  - devin.outposts.attributes
  - devin.outposts.attributes.actions
  - devin.outposts.attributes.action_group
options:
  name:
    description:
      - Name of the outpost, unique per account, for example V(gpu-h200).
      - 1 to 63 letters, digits, V(.), V(_) or V(-), starting with a letter or digit. Any other value fails the
        task before any request.
    type: str
    required: true
  state:
    description:
      - V(present) creates the outpost when no outpost has this name.
      - V(absent) deletes it. An outpost that is already gone is not an error.
    type: str
    choices: [present, absent]
    default: present
  platform:
    description:
      - The operating system of the machines that serve the outpost. Workers refuse to serve an outpost
        whose platform does not match their OS.
      - When not set, a new outpost gets the account's default platform, and an existing outpost's platform
        is not compared.
    type: str
    choices: [linux, macos, windows]
  description:
    description:
      - Text shown in the Devin web app. When not set, an existing outpost's description is not compared.
    type: str
  recreate:
    description:
      - Allow the module to delete and re-create an existing outpost whose O(platform) or O(description)
        differs, because the API has no update.
      - The new outpost gets a new id. Sessions queued on the old one are lost, and workers and orchestrators
        configured with the old id must be updated.
    type: bool
    default: false
notes:
  - Creating and deleting outposts needs a token with the C(account.outposts.orchestrator) scope.
seealso:
  - module: devin.outposts.outpost_info
  - plugin: devin.outposts.outpost_id
    plugin_type: lookup
  - name: Devin Outposts reference
    description: The fleet API and the worker CLI.
    link: https://docs.devin.ai/cloud/outposts/reference
"""

EXAMPLES = r"""
- name: Register an outpost for GPU machines
  devin.outposts.outpost:
    name: gpu-h200
    platform: linux
    description: H200 boxes in the lab
    token: "{{ devin_orchestrator_token }}"
  register: gpu_outpost

- name: Show the new outpost's id (give it to the workers)
  ansible.builtin.debug:
    var: gpu_outpost.outpost_id

- name: Replace an outpost whose platform changed (queued sessions are lost)
  devin.outposts.outpost:
    name: build-agents
    platform: windows
    recreate: true

- name: Delete an outpost
  devin.outposts.outpost:
    name: old-pool
    state: absent
"""

RETURN = r"""
outpost:
  description:
    - The outpost as the API returned it.
    - V(null) after O(state=absent), and in check mode when the outpost would be created.
  returned: always
  type: dict
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
    metadata: {outpost_id: outpost_env-3f2a, account_id: account-1, created_at: 1781050000}
    spec: {name: gpu-h200, platform: linux, description: H200 boxes in the lab}
    status: {queue_depth: 0, active_claims: 0}
outpost_id:
  description:
    - The id of the outpost (C(outpost_env-...)). With O(state=absent), the id of the outpost that was deleted.
    - V(null) when there was no outpost to delete, and in check mode when the outpost would be created.
  returned: always
  type: str
  sample: outpost_env-3f2a
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.devin.outposts.plugins.module_utils._fleet_api import (
    PLATFORMS,
    fleet_argument_spec,
    outpost_differences,
    outpost_name_error,
    outpost_id_of,
    outpost_settings,
    run_module,
)


def describe_differences(name, differences):
    parts = ["{0} is {1!r} (wanted {2!r})".format(key, have, want) for key, have, want in differences]
    return (
        "Outpost {0} exists with different settings: {1}. The fleet API cannot update an outpost; set "
        "recreate: true to delete it and create it again (sessions queued on it are lost and it gets a new id)."
    ).format(name, "; ".join(parts))


def ensure(module, client):
    params = module.params
    name = params["name"]
    current = client.find_outpost(name=name)
    before = outpost_settings(current) if current else {}

    if params["state"] == "absent":
        if current is None:
            return dict(changed=False, outpost=None, outpost_id=None, diff=dict(before={}, after={}))
        if not module.check_mode:
            client.delete_outpost(outpost_id_of(current), name=name)  # a 404 race counts as deleted
        return dict(changed=True, outpost=None, outpost_id=outpost_id_of(current), diff=dict(before=before, after={}))

    desired = dict(name=name, platform=params["platform"], description=params["description"])
    if current is not None:
        differences = outpost_differences(current, desired)
        if not differences:
            return dict(changed=False, outpost=current, outpost_id=outpost_id_of(current),
                        diff=dict(before=before, after=before))
        if not params["recreate"]:
            module.fail_json(msg=describe_differences(name, differences),
                             differences=[dict(field=k, current=c, desired=d) for k, c, d in differences],
                             outpost=current, outpost_id=outpost_id_of(current))
        module.warn("{0} outpost {1} ({2}): sessions queued on it are lost, and workers configured with its id "
                    "must be given the new one.".format("Would recreate" if module.check_mode else "Recreating",
                                                        name, outpost_id_of(current)))

    after = dict(before, **dict((k, v) for k, v in desired.items() if v is not None))
    if current is None:
        after.setdefault("platform", None)
        after.setdefault("description", None)
    created = None
    if not module.check_mode:
        if current is not None:
            client.delete_outpost(outpost_id_of(current), name=name)
        created = client.create_outpost(name, platform=after["platform"], description=after["description"])
    return dict(changed=True, outpost=created, outpost_id=outpost_id_of(created) if created else None,
                diff=dict(before=before, after=after))


def main():
    module = AnsibleModule(
        argument_spec=fleet_argument_spec(
            name=dict(type="str", required=True),
            state=dict(type="str", default="present", choices=["present", "absent"]),
            platform=dict(type="str", choices=list(PLATFORMS)),
            description=dict(type="str"),
            recreate=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    # Before any request: a list given as the name would otherwise become an outpost named "[1, 2]".
    error = outpost_name_error("name", module.params["name"])
    if error:
        module.fail_json(msg=error)
    run_module(module, lambda client: ensure(module, client))


if __name__ == "__main__":
    main()
