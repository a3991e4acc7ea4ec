#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: default_platform
short_description: Set or clear the default platform of a Devin organization
version_added: 0.1.0
description:
  - Sets the machine that new sessions of an organization start on by default, either a hosted platform
    (O(platform)) or one of the account's outposts (O(outpost)), or clears it (O(state=absent)).
  - Uses C(GET) and C(PUT /v3beta1/organizations/{org_id}/default-platform).
author:
  - devin.outposts maintainers (@devin-outposts)
extends_documentation_fragment:
  - devin.outposts.fleet_api
  - devin.outposts.attributes
  - devin.outposts.attributes.actions
  - devin.outposts.attributes.action_group
options:
  org_id:
    description:
      - The organization, for example V(org-0123abcd).
    type: str
    required: true
  platform:
    description:
      - A hosted platform label. The valid values are not documented by the API; the server validates them.
      - Mutually exclusive with O(outpost). One of the two is required with O(state=present).
    type: str
  outpost:
    description:
      - Make an outpost the default, given by name or by id (C(outpost_env-...)). It is resolved through the
        outposts list to the C(outpost_pool_id) the API expects; an unknown outpost is an error, and so is a
        value that cannot be an outpost name (see O(devin.outposts.outpost#module:name)).
      - Mutually exclusive with O(platform).
    type: str
  state:
    description:
      - V(present) sets the default to O(platform) or O(outpost).
      - V(absent) clears the default (both fields null).
    type: str
    choices: [present, absent]
    default: present
notes:
  - Needs a token whose service user has the C(ManageOrgSettings) permission on the organization.
seealso:
  - module: devin.outposts.default_platform_info
  - module: devin.outposts.outpost
  - name: Set Organization Default Platform
    description: The API reference of the endpoint.
    link: https://docs.devin.ai/api-reference/v3/organization-settings/put-organization-default-platform
"""

EXAMPLES = r"""
- name: Start new sessions of the organization on the gpu-h200 outpost
  devin.outposts.default_platform:
    org_id: org-0123abcd
    outpost: gpu-h200

- name: Clear the default platform
  devin.outposts.default_platform:
    org_id: org-0123abcd
    state: absent
"""

RETURN = r"""
default_platform:
  description:
    - The organization's default platform after the change (in check mode, the predicted value).
    - All fields are V(null) when no default is set.
  returned: success
  type: dict
  contains:
    platform:
      description: The hosted platform label, or V(null).
      type: str
      returned: success
    outpost_pool_id:
      description: The id of the default outpost, or V(null).
      type: str
      returned: success
    outpost_pool_name:
      description: The name of the default outpost, or V(null).
      type: str
      returned: success
  sample: {platform: null, outpost_pool_id: outpost_env-3f2a, outpost_pool_name: gpu-h200}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.devin.outposts.plugins.module_utils._fleet_api import (
    default_platform_matches,
    default_platform_settings,
    fleet_argument_spec,
    outpost_id_of,
    outpost_name_of,
    outpost_ref_error,
    run_module,
)


def ensure(module, client):
    params = module.params
    org_id = params["org_id"]
    platform, pool_id, pool_name = None, None, None
    if params["state"] == "present" and params["outpost"]:
        outpost = client.resolve_outpost(params["outpost"])
        pool_id, pool_name = outpost_id_of(outpost), outpost_name_of(outpost)
    elif params["state"] == "present":
        platform = params["platform"]

    before = default_platform_settings(client.get_default_platform(org_id))
    if default_platform_matches(before, platform=platform, outpost_pool_id=pool_id):
        return dict(changed=False, default_platform=before, diff=dict(before=before, after=before))

    after = dict(platform=platform, outpost_pool_id=pool_id, outpost_pool_name=pool_name)
    if not module.check_mode:
        answer = client.set_default_platform(org_id, platform=platform, outpost_pool_id=pool_id)
        if not any(default_platform_settings(answer).values()) and (platform or pool_id):
            answer = client.get_default_platform(org_id)  # a PUT that does not echo the new value
        after = default_platform_settings(answer)
    return dict(changed=True, default_platform=after, diff=dict(before=before, after=after))


def main():
    module = AnsibleModule(
        argument_spec=fleet_argument_spec(
            org_id=dict(type="str", required=True),
            platform=dict(type="str"),
            outpost=dict(type="str"),
            state=dict(type="str", default="present", choices=["present", "absent"]),
        ),
        mutually_exclusive=[("platform", "outpost")],
        required_if=[("state", "present", ("platform", "outpost"), True)],
        supports_check_mode=True,
    )
    error = module.params["outpost"] is not None and outpost_ref_error("outpost", module.params["outpost"])
    if error:
        module.fail_json(msg=error)
    run_module(module, lambda client: ensure(module, client))


if __name__ == "__main__":
    main()
