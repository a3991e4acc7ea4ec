# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):

    # Every module: runs where it is executed (normally the controller) and talks to the API over HTTPS.
    DOCUMENTATION = r"""
options: {}
attributes:
  platform:
    description: Target OS/families that can be operated against.
    support: N/A
    platforms: all
    details:
      - The module only talks to the fleet API over HTTPS, with the Python standard library.
      - Run it on the controller, with C(hosts=localhost) or C(delegate_to=localhost).
"""

    # Modules that change something.
    ACTIONS = r"""
options: {}
attributes:
  check_mode:
    description: Can run in C(check_mode) and return changed status prediction without modifying target.
    support: full
    details:
      - In check mode the module reads the current state from the API and sends no request that changes it.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in C(check_mode)), when in diff mode.
    support: full
"""

    # Read-only modules.
    INFO_MODULE = r"""
options: {}
attributes:
  check_mode:
    description: Can run in C(check_mode) and return changed status prediction without modifying target.
    support: full
    details:
      - This action does not modify state.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in C(check_mode)), when in diff mode.
    support: N/A
    details:
      - This action does not modify state.
"""

    # Modules in the devin.outposts.fleet action group.
    ACTION_GROUP = r"""
options: {}
attributes:
  action_group:
    description: Use C(group/devin.outposts.fleet) in C(module_defaults) to set defaults for this module.
    support: full
    membership:
      - devin.outposts.fleet
"""
