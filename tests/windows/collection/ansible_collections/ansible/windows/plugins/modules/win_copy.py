# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""Test-only stand-in for ansible.windows.win_copy (../../README.md): a file already on the host (remote_src) or
content, copied to dest in the Wine prefix when its checksum differs. Never shipped."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ntpath
import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes
from ansible_collections.ansible.windows.plugins.module_utils.wine_standin import (
    WinePrefix,
    argument_spec,
    digest,
)


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(
            src=dict(type="str"),
            content=dict(type="str"),
            dest=dict(type="str", required=True),
            remote_src=dict(type="bool", default=False),
            force=dict(type="bool", default=True),
        ),
        mutually_exclusive=[["src", "content"]],
        required_one_of=[["src", "content"]],
        supports_check_mode=True,
    )
    params, prefix = module.params, WinePrefix(module)
    dest = params["dest"]
    target = prefix.path(dest)
    staged = None
    if params["content"] is not None:
        # The real module's action plugin writes the content to a file and copies that.
        handle, staged = tempfile.mkstemp()
        with os.fdopen(handle, "wb") as out:
            out.write(to_bytes(params["content"]))
        source = staged
    else:
        if not params["remote_src"]:
            module.fail_json(msg="test-only stand-in: only remote_src: true or content is implemented")
        source = prefix.path(params["src"])
        if not os.path.isfile(source):
            module.fail_json(msg="Cannot copy src file: '%s' as it does not exist" % params["src"])
        if os.path.isdir(target):
            dest = ntpath.join(dest, ntpath.basename(params["src"]))
            target = prefix.path(dest)
    try:
        checksum = digest(source, "sha1")
        if not os.path.isdir(os.path.dirname(target)):
            module.fail_json(msg="Destination directory '%s' does not exist" % ntpath.dirname(dest))
        changed = not os.path.isfile(target) or (params["force"] and digest(target, "sha1") != checksum)
        if changed and not module.check_mode:
            shutil.copyfile(source, target)
    finally:
        if staged is not None:
            os.remove(staged)
    module.exit_json(changed=changed, dest=dest, checksum=checksum, operation="file_copy")


if __name__ == "__main__":
    main()
