# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""Test-only stand-in for ansible.windows.win_uri (../../README.md): a GET, its content and status code; a status
that is not 200 fails, as the real module's default status_code does. Never shipped."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_text
from ansible.module_utils.urls import fetch_url


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            return_content=dict(type="bool", default=False),
            validate_certs=dict(type="bool", default=True),
            proxy_url=dict(type="str"),
            url_timeout=dict(type="int", default=30),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["proxy_url"]:
        module.fail_json(msg="test-only stand-in: proxy_url is not implemented (the tests use none)")
    # No ambient proxy either: the real module uses none unless proxy_url is set.
    module.params["use_proxy"] = False
    response, info = fetch_url(module, params["url"], method="GET", timeout=params["url_timeout"])
    status = info.get("status", -1)
    if status != 200:
        module.fail_json(
            msg="Status code of request '%s' is not in list of valid status codes 200 : '%s'."
            % (status, info.get("msg")),
            status_code=status,
            url=params["url"],
        )
    result = dict(changed=False, status_code=status, url=params["url"], msg="OK")
    if params["return_content"]:
        result["content"] = to_text(response.read())
    module.exit_json(**result)


if __name__ == "__main__":
    main()
