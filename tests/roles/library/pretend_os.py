# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""Test-only module: report the facts given as ``facts``, so a role's preflight sees another OS."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(argument_spec={"facts": {"type": "dict", "required": True}}, supports_check_mode=True)
    module.exit_json(changed=False, ansible_facts=module.params["facts"])


if __name__ == "__main__":
    main()
