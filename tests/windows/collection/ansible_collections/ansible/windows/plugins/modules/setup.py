# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""Test-only stand-in for ansible.windows.setup (../../README.md): it only refuses. The real module is PowerShell over
WinRM; the tests give the play Windows facts instead (tests/roles/library/pretend_os), so that the role's preflight
skips it. Never shipped."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(argument_spec=dict(), bypass_checks=True, supports_check_mode=True)
    module.fail_json(
        msg="ansible.windows.setup cannot run under Wine: the play is given Windows facts instead"
    )


if __name__ == "__main__":
    main()
