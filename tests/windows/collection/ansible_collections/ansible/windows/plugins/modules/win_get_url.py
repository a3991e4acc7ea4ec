# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""Test-only stand-in for ansible.windows.win_get_url (../../README.md), as the real module documents it: the file
is downloaded to a temporary file, its checksum is computed, and only a file whose checksum matches is copied to
dest (dest is left as it was otherwise, and the module fails). Never shipped."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ntpath
import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import fetch_url
from ansible_collections.ansible.windows.plugins.module_utils.wine_standin import (
    WinePrefix,
    argument_spec,
    digest,
)


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(
            url=dict(type="str", required=True),
            dest=dict(type="path", required=True),
            checksum=dict(type="str"),
            checksum_algorithm=dict(
                type="str", default="sha1", choices=["md5", "sha1", "sha256", "sha384", "sha512"]
            ),
            force=dict(type="bool", default=True),
            validate_certs=dict(type="bool", default=True),
            proxy_url=dict(type="str"),
            url_timeout=dict(type="int", default=30),
        ),
        supports_check_mode=True,
    )
    params, prefix = module.params, WinePrefix(module)
    url, dest = params["url"], params["dest"]
    target = prefix.path(dest)
    if not os.path.isdir(os.path.dirname(target)):
        module.fail_json(
            msg="The path '%s' does not exist for destination '%s', or is not visible to the current user."
            % (ntpath.dirname(dest), dest),
            url=url,
            dest=dest,
        )
    if not params["force"] and os.path.isfile(target):
        module.exit_json(changed=False, url=url, dest=dest, msg="file already exists")
    if params["proxy_url"]:
        module.fail_json(msg="test-only stand-in: proxy_url is not implemented (the tests use none)")
    # No ambient proxy either: the real module uses none unless proxy_url is set.
    module.params["use_proxy"] = False
    response, info = fetch_url(module, url, method="GET", timeout=params["url_timeout"])
    status = info.get("status", -1)
    if status != 200:
        module.fail_json(
            msg="Error downloading '%s' to '%s': %s" % (url, dest, info.get("msg")),
            status_code=status,
            url=url,
            dest=dest,
        )
    handle, temporary = tempfile.mkstemp()
    try:
        with os.fdopen(handle, "wb") as out:
            shutil.copyfileobj(response, out)
        algorithm = params["checksum_algorithm"]
        checksum_src = digest(temporary, algorithm)
        expected = (params["checksum"] or "").strip().lower()
        if expected and expected != checksum_src:
            module.fail_json(
                msg="The checksum for %s did not match '%s', it was '%s'" % (url, expected, checksum_src),
                url=url,
                dest=dest,
                status_code=status,
            )
        changed = not os.path.isfile(target) or digest(target, algorithm) != checksum_src
        if changed and not module.check_mode:
            shutil.copyfile(temporary, target)
        size = os.path.getsize(temporary)
    finally:
        os.remove(temporary)
    module.exit_json(
        changed=changed,
        url=url,
        dest=dest,
        status_code=status,
        checksum_src=checksum_src,
        checksum_dest=checksum_src,
        size=size,
        msg="OK",
    )


if __name__ == "__main__":
    main()
