# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""Test-only stand-in for ansible.windows.win_certificate_store (../../README.md): it only refuses. Wine's
certificate stores are not Windows' LocalMachine\\Root, so the private-CA step of the cli role cannot be shown under
Wine (docs/windows.md). Never shipped."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(argument_spec=dict(), bypass_checks=True, supports_check_mode=True)
    module.fail_json(msg="win_certificate_store cannot run under Wine (LocalMachine\\Root): never run here")


if __name__ == "__main__":
    main()
