#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: default_platform_info
short_description: Read the default platform of a Devin organization
version_added: 0.1.0
description:
  - Reads C(GET /v3beta1/organizations/{org_id}/default-platform) to learn whether new sessions of the organization
    start on a hosted platform, on one of the account's outposts, or on the product default.
author:
  - devin.outposts maintainers (@devin-outposts)
extends_documentation_fragment:
  - devin.outposts.fleet_api
  - devin.outposts.attributes
  - devin.outposts.attributes.info_module
  - devin.outposts.attributes.action_group
options:
  org_id:
    description:
      - The organization, for example V(org-0123abcd).
    type: str
    required: true
seealso:
  - module: devin.outposts.default_platform
"""

EXAMPLES = r"""
- name: Read the default platform
  devin.outposts.default_platform_info:
    org_id: org-0123abcd
  register: default

- name: Show it
  ansible.builtin.debug:
    msg: "{{ default.default_platform.outpost_pool_name or default.default_platform.platform or 'not set' }}"
"""

RETURN = r"""
default_platform:
  description: The organization's default platform. All fields are V(null) when no default is set.
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
    default_platform_settings,
    fleet_argument_spec,
    run_module,
)


def main():
    module = AnsibleModule(
        argument_spec=fleet_argument_spec(org_id=dict(type="str", required=True)),
        supports_check_mode=True,
    )

    def read(client):
        current = client.get_default_platform(module.params["org_id"])
        return dict(changed=False, default_platform=default_platform_settings(current))

    run_module(module, read)


if __name__ == "__main__":
    main()
