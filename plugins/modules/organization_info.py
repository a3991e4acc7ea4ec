#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: organization_info
short_description: List the Devin organizations a token can see
version_added: 0.1.0
description:
  - Lists the organizations of the enterprise that the token can see, with their C(org-...) ids and names,
    from C(GET /v3/enterprise/organizations), following every page.
  - Use it to find the O(devin.outposts.default_platform#module:org_id) of an organization by its name.
  - With O(name), returns only the organizations with that name, or an empty list; a missing organization is
    not an error.
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
      - Only return the organizations with exactly this name.
    type: str
notes:
  - The list comes from the enterprise API (C(/v3/enterprise/organizations)), not from the fleet API under
    C(/opbeta/outposts/). The token needs permission to read the enterprise's organizations; a token that lacks
    it fails with the API's 403.
seealso:
  - module: devin.outposts.default_platform_info
  - module: devin.outposts.default_platform
"""

EXAMPLES = r"""
- name: List the organizations
  devin.outposts.organization_info:
  register: orgs

- name: Show each id and name
  ansible.builtin.debug:
    msg: "{{ item.org_id }} {{ item.name }}"
  loop: "{{ orgs.organizations }}"

- name: Find the research organization
  devin.outposts.organization_info:
    name: Research
  register: research

- name: Make the GPU outpost its default
  devin.outposts.default_platform:
    org_id: "{{ research.organizations[0].org_id }}"
    outpost: gpu-h200
  when: research.organizations | length == 1
"""

RETURN = r"""
organizations:
  description:
    - The organizations as the API returned them, in the API's order. Empty when O(name) matches nothing.
  returned: always
  type: list
  elements: dict
  contains:
    org_id:
      description: The organization's id, V(org-...).
      type: str
      returned: success
    name:
      description: The organization's name.
      type: str
      returned: success
  sample:
    - {org_id: org-0123abcd, name: Research}
    - {org_id: org-4567ef01, name: Platform}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.devin.outposts.plugins.module_utils._fleet_api import (
    fleet_argument_spec,
    run_module,
)


def main():
    module = AnsibleModule(
        argument_spec=fleet_argument_spec(name=dict(type="str")),
        supports_check_mode=True,
    )
    name = module.params["name"]

    def read(client):
        organizations = client.list_organizations()
        if name is not None:
            organizations = [org for org in organizations if isinstance(org, dict) and org.get("name") == name]
        return dict(changed=False, organizations=organizations)

    run_module(module, read)


if __name__ == "__main__":
    main()
